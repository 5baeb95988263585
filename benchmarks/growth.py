"""How cost grows with the graph: epoch time per edge and peak memory per node, 50k to 800k nodes.

    python benchmarks/growth.py                                   # 50k ... 800k nodes, N = 1 and 4
    python benchmarks/growth.py --nodes 50000 100000 --workers 1  # a quick look

Each size is the SBM graph of ``benchmarks/vs_dgl.py`` (symmetric, a self-loop per node,
128 features, 16 classes) at average degree ``--degree`` (20), METIS-partitioned for each
worker count, and trained by ``vs_dgl_worker.py`` (3-layer SAGE, hidden 256, Adam; the
median of ``--epochs`` epochs after a warm-up; peak resident size above the floor, of the
largest worker). The sizes of one worker count take turns, epoch by epoch
(benchmarks/turns.py), so that the machine's slow spells hit every size alike; they are
resident together (about 9 GiB at N=1 up to 800k nodes; ``--no-interleave`` runs one at a
time). The table gives each run's epoch time per million edges and peak bytes per node, each also as a ratio to its smallest value over the sizes of that worker count: a
cost that grows linearly keeps both ratios at 1. Writes benchmarks/results/growth.json and
growth.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from harness import figure, partition, results_dir, write_result
from turns import Run, run_all
from vs_dgl import MiB, launcher, make_graph

HERE = Path(__file__).resolve().parent


def measure(a: argparse.Namespace) -> list[dict]:
    threads = a.threads or os.cpu_count() or 1
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for nodes in a.nodes:
            make_graph(tmp / f"graph{nodes}.pt", nodes, nodes * a.degree, 128, 16)
        for n in a.workers:  # the sizes of one worker count take turns (benchmarks/turns.py)
            env = {**base, "OMP_NUM_THREADS": str(max(threads // n, 1))}
            runs = []
            for nodes in a.nodes:
                parts, out = tmp / f"parts{nodes}_{n}", tmp / f"run{nodes}_{n}.json"
                partition(["--edges", str(tmp / f"graph{nodes}.pt")], n, parts, base_env=base)
                cmd = launcher(n) + [str(HERE / "vs_dgl_worker.py"), "--engine", "sarcompile", "--model", "sage",
                                     "--parts", str(parts), "--out", str(out), "--hidden", "256",
                                     "--epochs", str(a.epochs)]
                runs.append((nodes, Run(cmd, env, n, out.with_suffix(".log")), out))
            finished = run_all([run for _, run, _ in runs], a.epochs, a.timeout, a.interleave)
            for (nodes, _, out), ok in zip(runs, finished):
                if not (ok and out.exists()):
                    continue
                rec = json.loads(out.read_text())
                slowest = max(rec, key=lambda w: w["epoch_s"])
                largest = max(rec, key=lambda w: w["peak_above_floor_bytes"])
                rows.append({"nodes": nodes, "edges": nodes * a.degree, "workers": n, "epoch_s": slowest["epoch_s"],
                             "peak_bytes": largest["peak_above_floor_bytes"], "time_ledger": slowest["time_ledger"],
                             "estimate_bytes": largest["estimate"]["peak_bytes"]})
                print(line(rows[-1]), flush=True)
            for nodes in a.nodes:
                shutil.rmtree(tmp / f"parts{nodes}_{n}", ignore_errors=True)
    return rows


def line(r: dict) -> str:
    return (f"{r['nodes']:>7} nodes, N={r['workers']}: epoch {r['epoch_s']:.2f} s "
            f"({1e6 * r['epoch_s'] / r['edges']:.3f} s per M edges), peak {r['peak_bytes'] / MiB:.0f} MiB "
            f"({r['peak_bytes'] / r['nodes'] * r['workers']:.0f} B per node in all workers)")


def table(rows: list[dict]) -> str:
    out = ["| workers | nodes | edges | epoch (s) | s per M edges | vs smallest | peak (MiB, largest worker) "
           "| bytes per node | vs smallest |",
           "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in dict.fromkeys(r["workers"] for r in rows):
        mine = [r for r in rows if r["workers"] == n]
        per_edge = [r["epoch_s"] / r["edges"] for r in mine]
        per_node = [r["peak_bytes"] / r["nodes"] for r in mine]
        for r, t, m in zip(mine, per_edge, per_node):
            out.append(f"| {n} | {r['nodes']:,} | {r['edges']:,} | {r['epoch_s']:.2f} | {1e6 * t:.3f} | "
                       f"{t / min(per_edge):.2f}x | {r['peak_bytes'] / MiB:.0f} | {m * n:.0f} | {m / min(per_node):.2f}x |")
    return "\n".join(out)


def plot(rows: list[dict], path: Path) -> None:
    with figure(path, 2, size=(5, 3.5), dpi=120) as (left, right):
        for n in dict.fromkeys(r["workers"] for r in rows):
            mine = [r for r in rows if r["workers"] == n]
            left.plot([r["nodes"] for r in mine], [1e6 * r["epoch_s"] / r["edges"] for r in mine], marker="o",
                      label=f"N={n}")
            right.plot([r["nodes"] for r in mine], [r["peak_bytes"] / r["nodes"] * n for r in mine], marker="o",
                       label=f"N={n}")
        left.set(xscale="log", xlabel="nodes", ylabel="epoch s per M edges", title="time per edge")
        right.set(xscale="log", xlabel="nodes", ylabel="peak bytes per node (all workers)", title="memory per node")
        for ax in (left, right):
            ax.set_ylim(bottom=0)
            ax.legend()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", nargs="+", type=int, default=[50_000, 100_000, 200_000, 400_000, 800_000])
    ap.add_argument("--degree", type=int, default=20)
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs after one warm-up")
    ap.add_argument("--threads", type=int, default=0, help="threads of the one process (default: all cores)")
    ap.add_argument("--no-interleave", dest="interleave", action="store_false",
                    help="run each size start to end, one after the other, instead of epoch by epoch in turns")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", type=Path, default=results_dir() / "growth.json")
    a = ap.parse_args()
    rows = measure(a)
    out = write_result(a.out.stem, {"config": {**vars(a), "out": str(a.out)}, "rows": rows}, a.out.parent)
    plot(rows, out.with_suffix(".png"))
    print(table(rows))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
