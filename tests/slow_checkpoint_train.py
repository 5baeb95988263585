"""``python -m sarcompile.train`` with one checkpoint's write held open, for
tests/test_faults.py to kill a worker during it (test-only: the package has no such hook).

Run by torchrun as a script, with the trainer's arguments, and in its environment
``SLOW_CHECKPOINT_EPOCH`` (E) and ``SLOW_CHECKPOINT_MARKS`` (a directory). In the job's
first round (``TORCHELASTIC_RESTART_COUNT`` 0), each worker's background writer writes
its files of the checkpoint of epoch E, then creates ``MARKS/writing-R`` and sleeps
(up to ``HOLD_S``) before the manifest can be written: the checkpoint is half-written
while the worker is killed. Every checkpoint a worker reads on resuming is appended to
``MARKS/read-R-ROUND.txt``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from sarcompile.data import checkpoint as files
from sarcompile.train import loop
from sarcompile.train.cli import main

HOLD_S = 60.0  # longer than the test waits for the kill; bounded, so nothing is left if it never comes

MARKS = Path(os.environ["SLOW_CHECKPOINT_MARKS"])
ROUND = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
RANK = int(os.environ["RANK"])
HELD = files.temp_dir(files.checkpoint_dir("", int(os.environ["SLOW_CHECKPOINT_EPOCH"]))).name

write_rank_files, read_sharded = files.write_rank_files, loop.read_sharded


def _held_write(directory: Path, *args, **kwargs):
    written = write_rank_files(directory, *args, **kwargs)
    if ROUND == 0 and directory.name == HELD:
        (MARKS / f"writing-{RANK}").touch()
        time.sleep(HOLD_S)
    return written


def _recorded_read(path: Path, *args, **kwargs):
    with open(MARKS / f"read-{RANK}-{ROUND}.txt", "a") as f:
        f.write(f"{path}\n")
    return read_sharded(path, *args, **kwargs)


files.write_rank_files = _held_write
loop.read_sharded = _recorded_read

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
