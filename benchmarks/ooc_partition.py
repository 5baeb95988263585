"""Out-of-core partitioning against METIS on the whole graph, on planted-block graphs.

    python benchmarks/ooc_partition.py                       # 1M, 4M, 16M nodes (about an hour here)
    python benchmarks/ooc_partition.py --sizes 1000000       # the issue's first check alone
    python benchmarks/ooc_partition.py --table               # the README's table from the JSON
    python benchmarks/ooc_partition.py --family papers --sizes 1110600 --limit 1GiB  # papers100M-shaped, 1/100

For each size it writes a streamed graph and runs, each in a fresh process, exactly what
a user runs (below). The ``sbm`` family (:func:`sarcompile.data.synthetic_stream.write_sbm`):
average degree 20, 8 blocks, 90% of edges inside a block, node ids interleaving the
blocks. The ``papers`` family (:func:`~sarcompile.data.synthetic_stream.write_papers100m_like`
scaled to the size): power-law degrees, average 14.5, 172 blocks, 65% of edges inside one.

The command::

    sarcompile partition --edges src.npy,dst.npy --num-nodes N --parts 8 --memory-limit L

once with the size's limit (out of core: METIS on a coarsened graph) and once with a limit
that lets METIS take the whole graph (today's path), where that fits this machine. It
records the edge cut, the peak RSS the command reports (VmHWM: the whole process), and the
wall time; and the cut of a random assignment (a seeded streaming pass). Results go to
``benchmarks/results/ooc_partition.json`` (rewritten after each run) and a plot beside it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from harness import ROOT, figure, partition, results_dir, write_result  # (this directory is on the path)

RESULTS = results_dir() / "ooc_partition.json"
PARTS = 8
DEGREE = 20
LIMITS = {1_000_000: "1GiB", 4_000_000: "2GiB", 16_000_000: "8GiB", 20_000_000: "8GiB"}
METIS_LIMIT = "20GiB"  # what the whole-graph run may use (this machine has 24 GB)
METIS_BYTES_PER_EDGE = 280  # measured: 5.3 GiB peak for 20M edges; skip METIS where it cannot fit


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000, 16_000_000])
    p.add_argument("--family", choices=("sbm", "papers"), default="sbm")
    p.add_argument("--limit", help="the out-of-core run's --memory-limit (default: by size, 1GiB at 1M nodes)")
    p.add_argument("--work", type=Path, default=Path("/tmp/ooc_partition"), help="graphs and parts (deleted)")
    p.add_argument("--out", type=Path, help="results JSON (default: benchmarks/results/ooc_partition[_papers].json)")
    p.add_argument("--table", action="store_true", help="print the markdown table of --out and stop")
    args = p.parse_args()
    args.out = args.out or RESULTS.with_name(RESULTS.stem + ("_papers" if args.family == "papers" else "") + ".json")
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return
    sys.path.insert(0, str(ROOT))
    from sarcompile.data.synthetic_stream import PAPERS100M, write_papers100m_like, write_sbm

    rows = json.loads(args.out.read_text())["rows"] if args.out.exists() else []
    for n in args.sizes:
        rows = [r for r in rows if r["nodes"] != n]
        graph_dir = args.work / f"sbm{n}"
        start = time.perf_counter()
        if args.family == "papers":
            g = write_papers100m_like(graph_dir, n / PAPERS100M["num_nodes"], features=0, seed=0)
        else:
            g = write_sbm(graph_dir, num_nodes=n, avg_degree=DEGREE, num_blocks=PARTS, p_in=0.9, seed=0)
        print(f"{n} nodes, {g.num_edges} edges written in {time.perf_counter() - start:.0f} s", flush=True)
        row = {"nodes": n, "edges": g.num_edges, "random_cut": random_cut(g, PARTS)}
        row["ooc"] = run(g, args.limit or LIMITS.get(n, "8GiB"), args.work / "parts")
        fits = g.num_edges * METIS_BYTES_PER_EDGE < 16 * 2**30
        row["metis"] = run(g, METIS_LIMIT, args.work / "parts") if fits else None
        rows.append(row)
        shutil.rmtree(graph_dir)
        save(args.out, sorted(rows, key=lambda r: r["nodes"]), args.family)
        print(json.dumps(row), flush=True)
    plot(args.out)
    print(table(json.loads(args.out.read_text())))


def run(g, limit: str, out: Path) -> dict:
    """One ``sarcompile partition`` in a fresh process: method, cut, peak RSS, seconds."""
    src, dst = g.edges()
    done = partition(["--edges", f"{src},{dst}", "--num-nodes", str(g.num_nodes), "--memory-limit", limit], PARTS, out,
                     {"PYTHONPATH": str(ROOT)}, check=False, timeout=4 * 3600)
    seconds = done.seconds
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        return {"limit": limit, "error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    manifest = json.loads((out / "manifest.json").read_text())
    sizes = [p["num_nodes"] for p in manifest["parts"]]
    peak = float(re.search(r"peak RSS (\d+) MiB", done.stdout).group(1))
    shutil.rmtree(out)
    return {"limit": limit, "method": manifest["method"], "cut": manifest["edge_cut"], "peak_mib": peak,
            "seconds": round(seconds, 1), "imbalance": round(max(sizes) / (sum(sizes) / len(sizes)), 4)}


def random_cut(g, parts: int) -> int:
    """The edge cut of a uniformly random assignment (seed 0), in one streaming pass."""
    from sarcompile.data.outofcore import open_edges

    assignment = np.random.default_rng(0).integers(0, parts, g.num_nodes)
    return sum(int((assignment[s] != assignment[d]).sum()) for _, s, d in open_edges(*g.edges(), g.num_nodes).chunks(1 << 22))


def save(path: Path, rows: list[dict], family: str) -> None:
    meta = {"command": f"python benchmarks/ooc_partition.py --family {family}", "family": family, "parts": PARTS,
            "created": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    write_result(path.stem, {"meta": meta, "rows": rows}, path.parent)


def table(data: dict) -> str:
    lines = ["| nodes | edges | limit | out of core: cut | peak RSS | time | METIS, whole graph: cut | peak RSS | time "
             "| cut ratio | random cut |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in data["rows"]:
        o, m = r["ooc"], r["metis"]
        metis = (f"{m['cut'] / r['edges']:.2%} | {m['peak_mib'] / 1024:.2f} GiB | {m['seconds']:.0f} s" if m and "cut" in m
                 else f"not run: needs about {r['edges'] * METIS_BYTES_PER_EDGE / 2**30:.0f} GiB | | ")
        ratio = f"{o['cut'] / m['cut']:.2f}x" if m and "cut" in m else ""
        lines.append(f"| {r['nodes']:,} | {r['edges']:,} | {o['limit']} | {o['cut'] / r['edges']:.2%} | "
                     f"{o['peak_mib'] / 1024:.2f} GiB | {o['seconds']:.0f} s | {metis} | {ratio} | "
                     f"{r['random_cut'] / r['edges']:.2%} |")
    return "\n".join(lines)


def plot(path: Path) -> None:
    rows = json.loads(path.read_text())["rows"]
    nodes = [r["nodes"] for r in rows]
    done = [r for r in rows if r["metis"] and "cut" in r["metis"]]
    with figure(path.with_suffix(".png"), 2, size=(5, 4), dpi=120) as (cut, mem):
        cut.plot(nodes, [r["ooc"]["cut"] / r["edges"] for r in rows], "o-", label="out of core")
        cut.plot([r["nodes"] for r in done], [r["metis"]["cut"] / r["edges"] for r in done], "s--",
                 label="METIS, whole graph")
        cut.plot(nodes, [r["random_cut"] / r["edges"] for r in rows], ":", label="random")
        cut.set(xscale="log", xlabel="nodes (degree 20, 8 parts)", ylabel="edge cut (fraction of edges)")
        cut.legend()
        mem.plot(nodes, [r["ooc"]["peak_mib"] / 1024 for r in rows], "o-", label="out of core (peak RSS)")
        mem.plot([r["nodes"] for r in done], [r["metis"]["peak_mib"] / 1024 for r in done], "s--",
                 label="METIS, whole graph")
        mem.set(xscale="log", xlabel="nodes", ylabel="GiB")
        mem.legend()


if __name__ == "__main__":
    main()
