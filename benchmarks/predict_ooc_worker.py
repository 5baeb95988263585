"""One worker of benchmarks/predict_ooc.py, under torchrun: ``predict()`` as
``python -m sarcompile.predict`` runs it, with :func:`touched_predict`'s record of what the
worker touched written to ``RECORD_DIR/rank-R.json``::

    torchrun --standalone --nproc-per-node 8 benchmarks/predict_ooc_worker.py RECORD_DIR \\
        --run-dir RUN --parts P --out PRED

tests/predict/test_predict.py calls :func:`touched_predict` on its gloo workers.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from sarcompile.predict import run
from sarcompile.dist.memory import mapped_bytes

_WATCHED: dict[str, Path] = {}  # the directories whose opens the audit hook records, while a call runs
_OPENED: dict[str, set[str]] = {}


def _on_open(event: str, args: tuple) -> None:
    if event == "open" and _WATCHED and isinstance(args[0], (str, os.PathLike)):
        path = Path(os.path.abspath(args[0]))
        for k, d in _WATCHED.items():
            if path.parent == d:
                _OPENED[k].add(path.name)


def touched_predict(argv: list[str]) -> dict[str, Any]:
    """``predict(argv)`` on this worker, and what it touched: ``opened``, the file names of
    the partition directory (``parts``) and of the predictions directory (``out``) it
    opened (an audit hook on ``open``); ``mapped``, the resident bytes of each partition
    file it had mapped when it wrote its rows, after the forward (``/proc/self/smaps``);
    ``rank``; ``memory``, its entry of the manifest's."""
    if not _WATCHED and not _OPENED:
        sys.addaudithook(_on_open)  # hooks cannot be removed: _WATCHED turns it off between calls
    _WATCHED.update({k: Path(argv[argv.index(f"--{k}") + 1]).resolve() for k in ("parts", "out")})
    _OPENED.update({k: set() for k in _WATCHED})
    mapped: dict[str, int] = {}
    write = run.write_rows

    def write_counted(*args: Any, **kwargs: Any) -> Any:
        if not mapped:  # the part's node rows stay mapped until predict returns
            mapped.update(mapped_bytes(_WATCHED["parts"]))
        return write(*args, **kwargs)

    run.write_rows = write_counted
    try:
        manifest = run.predict([*argv, "--no-progress"])
    finally:
        run.write_rows = write
        _WATCHED.clear()
    rank = dist.get_rank() if dist.is_initialized() else 0
    return {"rank": rank, "opened": {k: sorted(v) for k, v in _OPENED.items()}, "mapped": mapped,
            "memory": manifest["memory"][rank]}


def main() -> None:
    record = Path(sys.argv[1])
    touched = touched_predict(sys.argv[2:])
    record.mkdir(parents=True, exist_ok=True)
    (record / f"rank-{touched['rank']}.json").write_text(json.dumps(touched))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
