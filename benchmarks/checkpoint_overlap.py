"""Checkpoints written in the background: the training step with a checkpoint every epoch
against no checkpoint (issue 54: within 5%).

    python benchmarks/checkpoint_overlap.py                        # MAG-like scale 1, 2 workers
    python benchmarks/checkpoint_overlap.py --scale 0.1 --epochs 4 # a quick check

``sarcompile partition --synthetic mag`` cuts a MAG-like graph into ``--workers`` parts;
``python -m sarcompile.train --model rgcn --embed-dim 64`` (node tables of 64 columns with
Adam's moments: what a checkpoint mostly holds) runs ``--epochs`` epochs under torchrun with
``--checkpoint-every 0`` (only the final checkpoint, after the last step) and with
``--checkpoint-every 1``, alternately, ``--repeats`` times. Per configuration: the median
step (the log's ``train_s``), the median epoch wall time between log lines (step,
evaluation and the checkpoint's copy), the first epoch left out, and the seconds the loop
spent copying and waiting for the disk (the trainer's last line). Writes JSON to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

from harness import launch, partition, results_dir, write_result  # (this directory is on the path: the script's)


def _run(parts: Path, out: Path, a: argparse.Namespace, every: int) -> dict:
    seen = []  # the wall clock when each epoch's line appears

    def on_line(line: str) -> None:
        if line.startswith("epoch "):
            seen.append(time.perf_counter())

    lines = launch(["-m", "sarcompile.train", "--parts", str(parts), "--out", str(out), "--model", "rgcn", "--hidden",
                    "64", "--embed-dim", "64", "--epochs", str(a.epochs), "--seed", "0", "--no-progress",
                    "--checkpoint-every", str(every)], a.workers, {"OMP_NUM_THREADS": str(a.threads)},
                   timeout=a.timeout, on_line=on_line).stdout.splitlines()
    records = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    ledger = next((x for x in lines if x.startswith("checkpoints:")), "")
    copy, wait = (float(v) for v in re.findall(r"([\d.]+) s", ledger)[:2]) if ledger else (0.0, 0.0)
    size = sum(f.stat().st_size for f in (out / "checkpoints").rglob("*") if f.is_file()) / a.keep
    return {"train_s": [r["train_s"] for r in records[1:]], "epoch_wall_s": [b - x for x, b in zip(seen[1:], seen[2:])],
            "copy_s": copy, "wait_s": wait, "checkpoint_mib": size / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per worker")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--keep", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds one training run may take")
    ap.add_argument("--json", type=Path, default=results_dir() / "checkpoint_overlap.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        parts = Path(tmp) / "parts"
        partition(["--synthetic", "mag", "--scale", str(a.scale)], a.workers, parts)
        runs = {"none": [], "every_1": []}
        for i in range(a.repeats):
            for name, every in (("none", 0), ("every_1", 1)) if i % 2 == 0 else (("every_1", 1), ("none", 0)):
                runs[name].append(_run(parts, Path(tmp) / f"{name}{i}", a, every))
    result = {"scale": a.scale, "workers": a.workers, "threads_per_worker": a.threads,
              "epochs": a.epochs, "repeats": a.repeats, "model": "rgcn --hidden 64 --embed-dim 64"}
    for name, rs in runs.items():
        result[name] = {
            "median_train_s": statistics.median(v for r in rs for v in r["train_s"]),
            "median_epoch_wall_s": statistics.median(v for r in rs for v in r["epoch_wall_s"]),
            "copy_s_per_checkpoint": statistics.median(r["copy_s"] for r in rs) / a.epochs if name != "none" else 0.0,
            "wait_s_in_all": statistics.median(r["wait_s"] for r in rs),
        }
    result["checkpoint_mib"] = runs["every_1"][0]["checkpoint_mib"]
    for key in ("median_train_s", "median_epoch_wall_s"):
        result[f"{key}_ratio"] = result["every_1"][key] / result["none"][key]
    path = write_result(a.json.stem, result, a.json.parent)
    print(path.read_text())


if __name__ == "__main__":
    main()
