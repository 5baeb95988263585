"""Sharded checkpoints' memory per worker (issue 54): the workers' peaks while writing a
checkpoint every epoch, and what resuming on 4 and on 2 workers adds to each.

    python benchmarks/checkpoint_memory.py                   # MAG-like scale 4 (848k nodes)
    python benchmarks/checkpoint_memory.py --scale 1         # a quicker check
    python benchmarks/checkpoint_memory.py --table           # the docs' table from the JSON

1. ``sarcompile partition --synthetic mag --scale S`` into 4 and into 2 parts.
2. ``torchrun --nproc-per-node 4 -m sarcompile.train --model rgcn --hidden 64 --embed-dim 64
   --checkpoint-every 1 --epochs E`` (through ``benchmarks/checkpoint_memory_worker.py``,
   which records each worker's whole-process resident peak, ``VmHWM`` across the trainer's
   own resets of it).
3. A copy of that run resumed with ``--resume auto --epochs E+1`` on 4 workers, and another
   on 2 (the 4-worker checkpoint read by 2): each worker records the resident size its
   reading and loading of the checkpoint added (the peak during each above the size before
   it) and its share, the bytes of its rows of the node tables and their Adam moments plus
   the replicated state every worker reads.

Checks (issue 54's acceptance), written to ``--json``: in step 2 no worker's peak exceeds
the median worker's by more than 1.2x; in step 3 no worker's resume adds more than its
share + 10%. Exit status 1 if either fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from harness import ROOT, launch, partition, results_dir, write_result  # (this directory is on the path)

WORKER = ROOT / "benchmarks" / "checkpoint_memory_worker.py"
PEAK_RATIO = 1.2  # a worker's peak against the median worker's
SHARE_SLACK = 1.1  # what a resume may add, against the worker's share


def _train(n: int, parts: Path, out: Path, record: Path, epochs: int, a: argparse.Namespace,
           resume: bool) -> list[dict]:
    """Train (or resume) on ``n`` workers; every worker's record, by rank."""
    args = [str(WORKER), str(record), "--parts", str(parts), "--out", str(out), "--model", "rgcn", "--hidden", "64",
            "--embed-dim", "64", "--epochs", str(epochs), "--seed", "0", "--no-progress", "--checkpoint-every", "1",
            *(["--resume", "auto"] if resume else [])]
    launch(args, n, {"OMP_NUM_THREADS": str(a.threads), "PYTHONPATH": str(ROOT)}, timeout=a.timeout, echo=True)
    return [json.loads((record / f"rank-{r}.json").read_text()) for r in range(n)]


def _resume_rows(records: list[dict]) -> list[dict]:
    rows = []
    for r in records:
        added = r["resume_read"]["added_bytes"] + r["resume_load"]["added_bytes"]
        share = r["share"]["rows_bytes"] + r["share"]["replicated_bytes"]
        rows.append({"rank": r["rank"], "read_added_bytes": r["resume_read"]["added_bytes"],
                     "load_added_bytes": r["resume_load"]["added_bytes"], "added_bytes": added,
                     "rows_bytes": r["share"]["rows_bytes"], "replicated_bytes": r["share"]["replicated_bytes"],
                     "share_bytes": share, "added_over_share": added / share, "peak_bytes": r["peak_bytes"]})
    return rows


def measure(a: argparse.Namespace, work: Path) -> dict:
    parts = {}
    for n in (4, 2):
        parts[n] = work / f"parts{n}"
        partition(["--synthetic", "mag", "--scale", str(a.scale)], n, parts[n], echo=True)
    trained = _train(4, parts[4], work / "run", work / "rec-train", a.epochs, a, resume=False)
    peaks = [r["peak_bytes"] for r in trained]
    median = statistics.median(peaks)
    result = {"scale": a.scale, "epochs": a.epochs, "threads_per_worker": a.threads,
              "model": "rgcn --hidden 64 --embed-dim 64 --checkpoint-every 1",
              "checkpoint_bytes": sum(f.stat().st_size for f in (work / "run" / "checkpoints").rglob(
                  f"epoch-{a.epochs:06d}/**/*") if f.is_file()),
              "train_n4": {"peak_bytes": peaks, "median_bytes": median, "max_over_median": max(peaks) / median}}
    for n in (4, 2):
        out = work / f"resume{n}"
        shutil.copytree(work / "run", out)
        result[f"resume_n{n}"] = _resume_rows(_train(n, parts[n], out, work / f"rec-resume{n}", a.epochs + 1, a,
                                                     resume=True))
    result["pass_peak"] = result["train_n4"]["max_over_median"] <= PEAK_RATIO
    result["pass_resume"] = all(r["added_over_share"] <= SHARE_SLACK for n in (4, 2) for r in result[f"resume_n{n}"])
    return result


def table(result: dict) -> str:
    mib = 2**20
    peaks = result["train_n4"]["peak_bytes"]
    lines = [f"Training on 4 workers, a checkpoint every epoch ({result['epochs']} epochs; checkpoint "
             f"{result['checkpoint_bytes'] / mib:.0f} MiB): whole-process peak per worker "
             + ", ".join(f"{p / mib:.0f}" for p in peaks)
             + f" MiB; the largest is {result['train_n4']['max_over_median']:.2f}x the median (bound {PEAK_RATIO}x).",
             "",
             ("| resumed on | rank | added: read | added: load | added | its rows + Adam | replicated | share "
              "| added / share | peak |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for n in (4, 2):
        for r in result[f"resume_n{n}"]:
            lines.append(
                f"| N={n} | {r['rank']} | {r['read_added_bytes'] / mib:.1f} MiB | {r['load_added_bytes'] / mib:.1f} MiB "
                f"| {r['added_bytes'] / mib:.1f} MiB | {r['rows_bytes'] / mib:.1f} MiB "
                f"| {r['replicated_bytes'] / mib:.1f} MiB | {r['share_bytes'] / mib:.1f} MiB "
                f"| {r['added_over_share']:.2f} | {r['peak_bytes'] / mib:.0f} MiB |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=4.0)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per worker")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds one training run may take")
    ap.add_argument("--json", type=Path, default=results_dir() / "checkpoint_memory.json")
    ap.add_argument("--table", action="store_true", help="print the markdown table of --json and stop")
    a = ap.parse_args()
    if a.table:
        print(table(json.loads(a.json.read_text())))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(a, Path(tmp))
    write_result(a.json.stem, result, a.json.parent)
    print(table(result))
    ok = result["pass_peak"] and result["pass_resume"]
    print("PASS" if ok else "FAIL: " + ", ".join(k for k in ("pass_peak", "pass_resume") if not result[k]))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
