"""One worker of benchmarks/checkpoint_memory.py, under torchrun: ``python -m sarcompile.train``
as it runs, with its whole-process memory written to ``RECORD_DIR/rank-R.json``::

    torchrun --standalone --nproc-per-node 4 benchmarks/checkpoint_memory_worker.py RECORD_DIR \\
        --parts P --out RUN --model rgcn --embed-dim 64 --checkpoint-every 1 ...

The trainer resets the kernel's resident high-water mark (``VmHWM``) when it measures its
floor and when its probe starts, so ``VmHWM`` at exit alone is the loop's peak, not the
process's. An audit hook on opening ``/proc/self/clear_refs`` reads the mark just before
each reset; the largest of those and the final one is the whole process's peak.

On a resume, the reading of the checkpoint (``read_sharded``: the replicated state, each
rank's share of the files checked) and the loading of its rows into the model
(``_load_sharded_run``) are wrapped: the resident size before each and its high-water mark
during each (reset at its start) give what each added, and the bytes of this rank's rows
of every node table and of their optimizer state (what it read from the shards) its share.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from sarcompile.data.checkpoint import REPLICATED
from sarcompile.dist.memory import status_bytes
from sarcompile.train import loop
from sarcompile.train.cli import main as train_main

_PEAK = [0]  # the largest VmHWM seen before a reset


def _on_open(event: str, args: tuple) -> None:
    if event == "open" and args[0] == "/proc/self/clear_refs":
        _PEAK[0] = max(_PEAK[0], status_bytes("VmHWM"))


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # (the hook records the mark first)
        f.write("5")


def _windowed(fn, record: dict[str, Any], name: str):
    """``fn`` with the resident size before it and the resident peak during it put in ``record[name]``."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        before = status_bytes("VmRSS")
        _reset_hwm()
        result = fn(*args, **kwargs)
        record[name] = {"rss_before_bytes": before, "peak_bytes": status_bytes("VmHWM"),
                        "added_bytes": status_bytes("VmHWM") - before}
        return result

    return wrapped


def _share(record: dict[str, Any], load):
    """``load`` (``_load_sharded_run``) that also records the bytes of the rows this rank read."""

    def wrapped(path: Path, manifest: dict[str, Any], state: dict[str, Any], net, *args: Any) -> Any:
        result = load(path, manifest, state, net, *args)
        rows = 0
        for name, entry in manifest["tables"].items():
            held = net.get_parameter(name).shape[0]
            width = 1
            for d in entry["shape"][1:]:
                width *= d
            rows += sum(held * width * _itemsize(dtype) for dtype in entry["dtypes"].values())
        record["share"] = {"rows_bytes": rows, "replicated_bytes": (path / REPLICATED).stat().st_size}
        return result

    return wrapped


def _itemsize(dtype: str) -> int:
    import torch

    return torch.empty((), dtype=getattr(torch, dtype.removeprefix("torch."))).element_size()


def main() -> int:
    record_dir = Path(sys.argv[1])
    record: dict[str, Any] = {"rank": int(os.environ.get("RANK", "0"))}
    sys.addaudithook(_on_open)
    loop.read_sharded = _windowed(loop.read_sharded, record, "resume_read")
    loop._load_sharded_run = _windowed(_share(record, loop._load_sharded_run), record, "resume_load")
    rc = train_main(sys.argv[2:])
    record["peak_bytes"] = max(_PEAK[0], status_bytes("VmHWM"))
    record["exit_rss_bytes"] = status_bytes("VmRSS")
    record_dir.mkdir(parents=True, exist_ok=True)
    (record_dir / f"rank-{record['rank']}.json").write_text(json.dumps(record))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
