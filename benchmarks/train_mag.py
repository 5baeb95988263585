"""The heterogeneous trainer's acceptance run: RGCN with embeddings on ogbn-mag-format data,
the same curve on 1 and on N workers, and after a worker is killed and the run resumed.

    python benchmarks/train_mag.py                            # 212k nodes of 4 types, 10 epochs
    python benchmarks/train_mag.py --scale 0.02 --epochs 4    # a quick check

1. A MAG-like graph (:func:`sarcompile.data.synthetic.mag_like` at ``--scale``: papers, authors,
   institutions, fields of study; 212k nodes at scale 1) is written in ogbn-mag's on-disk
   layout by the tests' writer (``tests/ogb_files.py``).
2. ``sarcompile partition --dataset ogbn-mag`` reads it (through ``ogb``, as the real
   dataset is read) into 1 and N parts.
3. ``python -m sarcompile.train --model rgcn`` trains ``--epochs`` epochs on 1 worker and
   under ``torchrun --standalone --nproc-per-node N``; the featureless types learn an
   embedding each, as in DGL's ogbn-mag RGCN example (hidden 64, dropout 0.5, Adam 0.01).
4. The N-worker run again, with a checkpoint every epoch: once epoch ``--kill-at`` is
   logged, worker 1 is SIGKILLed (torchrun then stops the others); ``--resume`` finishes it.

Prints the losses per epoch side by side and PASS when every epoch's loss on N workers and
in the killed-and-resumed run agrees with 1 worker's to ``--tol`` (relative; 1e-5); FAIL
(exit status 1) otherwise. Also the largest accuracy difference (a prediction whose top
two logits are within rounding may flip) and the wall time of each step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, command, launch  # (this directory is on the path: the script's)

sys.path.insert(0, str(ROOT / "tests"))
TIMEOUT = 3600  # seconds any one step may take

KEYS = ("loss", "train_acc", "val_acc", "test_acc")  # what the log holds per epoch


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "SARCOMPILE_TIMEOUT": "900"}


def _train_args(parts: Path, out: Path, a: argparse.Namespace) -> list[str]:
    return ["-m", "sarcompile.train", "--parts", str(parts), "--out", str(out), "--model", "rgcn", "--hidden", "64",
            "--dropout", "0.5", "--lr", "0.01", "--epochs", str(a.epochs), "--seed", "0", "--no-progress"]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def _run(args: list[str], nproc: int | None = None) -> None:
    """Run ``args`` (:func:`harness.launch`: a failure stops the benchmark, naming the
    command) and print its output but the epoch lines."""
    done = launch(args, nproc, _env(), timeout=TIMEOUT, echo=True)
    print("\n".join(f"    {line}" for line in done.stdout.splitlines() if not line.startswith("epoch ")), flush=True)


def _worker_pid(agent: int, rank: int) -> int | None:
    """The pid of torchrun's worker of local rank ``rank`` (a child of the agent ``agent``)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == agent and f"LOCAL_RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


def _killed_and_resumed(parts: Path, out: Path, a: argparse.Namespace) -> int:
    """Train on N workers, SIGKILL worker 1 once epoch --kill-at is logged, resume to the
    end; returns the epoch of the checkpoint the resume started from."""
    args = command([*_train_args(parts, out, a), "--checkpoint-every", "1"], a.workers)
    print(f"$ {' '.join(args[1:])}    # then SIGKILL worker 1 after epoch {a.kill_at}", flush=True)
    agent = subprocess.Popen(args, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = out / "log.jsonl"
    while not (log.is_file() and len(log.read_text().splitlines()) >= a.kill_at):
        if agent.poll() is not None:
            sys.exit(f"the run to be killed ended first (exit {agent.returncode}):\n{agent.stderr.read()}")
        time.sleep(0.05)
    time.sleep(_records(out)[-1]["epoch_s"] / 2)  # into the next epoch, past the checkpoint
    pid = _worker_pid(agent.pid, 1)
    if pid is None:
        agent.kill()
        sys.exit("could not find worker 1's process to kill")
    os.kill(pid, signal.SIGKILL)
    agent.wait()
    saved = _checkpoint_epoch(out)
    print(f"    killed worker 1 (pid {pid}) mid-run, after {len(log.read_text().splitlines())} logged epochs; "
          f"torchrun exited "
          f"{agent.returncode}; the checkpoint holds epoch {saved}", flush=True)
    _run([*_train_args(parts, out, a), "--checkpoint-every", "1", "--resume"], a.workers)
    return saved


def _checkpoint_epoch(out: Path) -> int:
    from sarcompile.data.checkpoint import read_header

    return int(read_header(out / "checkpoint.pt")[0]["epoch"])


def _close(x: float | None, y: float | None, tol: float) -> bool:
    if x is None or y is None:
        return x is y
    return math.isclose(x, y, rel_tol=tol, abs_tol=tol)


def _table(curves: dict[str, list[dict]], tol: float) -> bool:
    """Print the losses side by side (and the largest accuracy gap); True if all agree."""
    names = list(curves)
    ref = curves[names[0]]
    head = f"{'epoch':>5}  " + "  ".join(f"{n:>14}" for n in names) + "  " + "  ".join(
        f"{'|d loss| ' + n:>22}" for n in names[1:])
    print(head)
    ok = all(len(c) == len(ref) for c in curves.values())
    for i, r in enumerate(ref):
        rows = [c[i] for c in curves.values()]
        diffs = [abs(row["loss"] - r["loss"]) for row in rows[1:]]
        ok &= all(row["epoch"] == r["epoch"] for row in rows)
        ok &= all(_close(row["loss"], r["loss"], tol) for row in rows[1:])
        print(f"{r['epoch']:>5}  " + "  ".join(f"{row['loss']:>14.8f}" for row in rows) + "  "
              + "  ".join(f"{d:>22.2e}" for d in diffs))
    acc = max(abs(c[i][k] - ref[i][k]) for c in curves.values() for i in range(len(ref)) for k in KEYS[1:])
    print(f"largest accuracy difference from N=1 (train, val, test; any epoch): {acc:.2e}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="graph size relative to 212k nodes (default 1)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--kill-at", type=int, help="kill after this many epochs are logged (default: epochs // 2)")
    ap.add_argument("--tol", type=float, default=1e-5, help="relative agreement asked of the losses (default 1e-5)")
    ap.add_argument("--work", help="working directory (default: a temporary one, deleted)")
    a = ap.parse_args()
    a.kill_at = a.kill_at or max(1, a.epochs // 2)
    if not 1 <= a.kill_at < a.epochs:
        ap.error("--kill-at must be between 1 and --epochs - 1")
    with tempfile.TemporaryDirectory() as tmp:
        return _acceptance(Path(a.work or tmp), a)


def _acceptance(work: Path, a: argparse.Namespace) -> int:
    from ogb_files import write_mag

    from sarcompile.data.synthetic import mag_like, mag_like_sizes

    times: dict[str, float] = {}
    start = time.perf_counter()
    sizes = mag_like_sizes(a.scale)
    ds = mag_like(**sizes, add_reverse=False)
    write_mag(work / "ogb", ds)
    g = ds.graph
    print(f"MAG-like graph: {', '.join(f'{g.num_nodes(t)} {t}' for t in g.node_types)} = {g.num_nodes()} nodes, "
          f"{g.num_edges()} edges before the reverse relations; written in ogbn-mag's layout to {work / 'ogb'}")
    times["generate + write OGB files"] = time.perf_counter() - start
    for n in (1, a.workers):
        t0 = time.perf_counter()
        _run(["-m", "sarcompile", "partition", "--dataset", "ogbn-mag", "--root", str(work / "ogb"), "--parts", str(n),
              "--out", str(work / f"parts{n}")])
        times[f"partition ({n} part{'s' if n > 1 else ''})"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    _run(_train_args(work / "parts1", work / "run1", a))
    times["train, 1 worker"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    _run(_train_args(work / f"parts{a.workers}", work / "runN", a), a.workers)
    times[f"train, {a.workers} workers"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    saved = _killed_and_resumed(work / f"parts{a.workers}", work / "killed", a)
    times[f"train, {a.workers} workers, killed + resumed"] = time.perf_counter() - t0

    n = a.workers
    curves = {"N=1": _records(work / "run1"), f"N={n}": _records(work / "runN"),
              f"N={n} killed@{saved}": _records(work / "killed")}
    print()
    ok = _table(curves, a.tol)
    same = [r["loss"] for r in curves[f"N={n}"]] == [r["loss"] for r in curves[f"N={n} killed@{saved}"]]
    print(f"killed-and-resumed vs uninterrupted on {n} workers: {'bit for bit' if same else 'not bit for bit'}")
    print("wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
          + f"; total {time.perf_counter() - start:.0f} s")
    print("PASS" if ok else f"FAIL: some epoch differs by more than {a.tol} (relative)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
