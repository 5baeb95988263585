"""Predictions of every node on 8 workers, from a graph partitioned out of core (issue 53).

    python benchmarks/predict_ooc.py                          # 4M nodes (about 25 min here)
    python benchmarks/predict_ooc.py --nodes 1000000          # the feasibility check
    python benchmarks/predict_ooc.py --table                  # the docs' table from the JSON

Runs exactly what a user runs, each in fresh processes:

1. a planted-block graph (:func:`sarcompile.data.synthetic_stream.write_sbm`: ``--degree`` 10,
   8 blocks, 90% of edges inside one, ``--features`` 32, 16 classes) written to files;
2. ``sarcompile partition --edges ... --parts 8 --memory-limit 2GiB`` (out of core);
3. one epoch of ``torchrun --nproc-per-node 8 -m sarcompile.train --hidden 16`` (SAGE,
   two layers), whose summary gives each worker's training peak above its imports;
4. ``python -m sarcompile.predict`` on the 8 workers (through
   ``benchmarks/predict_ooc_worker.py``, which records the files each worker opened and the
   pages of each part file it had resident after the forward).

Checked per rank, and written to ``benchmarks/results/predict_ooc.json``: it opened the
partition's manifest and its own part file only, and no other worker's prediction files;
the resident pages of its part file are at most its node rows (with Linux's 64 KiB
fault-around on either side of each tensor), i.e. not the edge lists; its peak above the
imports is at most the plan's inference estimate + 15% and below its training peak.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from harness import ROOT, launch, provenance, results_dir, write_result  # (this directory is on the path)

PARTS = 8
FAULT_AROUND = 64 * 1024  # Linux maps this much of the page cache around a faulting page of a file
# A worker's summary line: "worker 3: peak 812 MiB above the imports (plan's estimate 790 MiB), ..."
PEAK = re.compile(r"worker (\d+): peak (-?\d+) MiB above the imports \(plan's estimate (\d+) MiB\)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=4_000_000)
    p.add_argument("--degree", type=float, default=10.0)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--limit", default="2GiB", help="the partitioner's --memory-limit")
    p.add_argument("--work", type=Path, default=Path("/tmp/predict_ooc"), help="graph, parts, run (deleted)")
    p.add_argument("--timeout", type=float, default=7200, help="seconds each step may take")
    p.add_argument("--out", type=Path, default=results_dir() / "predict_ooc.json")
    p.add_argument("--table", action="store_true", help="print the markdown table of --out and stop")
    args = p.parse_args()
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return
    sys.path.insert(0, str(ROOT))
    from sarcompile.data.synthetic_stream import write_sbm

    shutil.rmtree(args.work, ignore_errors=True)
    seconds = {}
    start = time.perf_counter()
    g = write_sbm(args.work / "graph", num_nodes=args.nodes, avg_degree=args.degree, num_blocks=PARTS, p_in=0.9,
                  features=args.features, seed=0)
    seconds["write graph"] = time.perf_counter() - start
    parts, run_dir, pred = args.work / "parts", args.work / "run", args.work / "pred"
    src, dst = g.edges()
    node_data = [f"--node-data={k}={v}" for k, v in g.files.items() if k not in ("src", "dst", "block")]  # x, y, the masks
    step(seconds, "partition", ["-m", "sarcompile", "partition", "--edges", f"{src},{dst}", "--num-nodes",
                                str(g.num_nodes), "--parts", str(PARTS), "--memory-limit", args.limit, "--out",
                                str(parts), *node_data], None, args.timeout)
    shutil.rmtree(args.work / "graph")  # (the parts hold it now)
    trained = step(seconds, "train", ["-m", "sarcompile.train", "--parts", str(parts), "--out", str(run_dir),
                                      "--epochs", "1", "--hidden", str(args.hidden), "--no-progress"], PARTS, args.timeout)
    train_peaks = {int(r): (int(peak), int(est)) for r, peak, est in PEAK.findall(trained)}
    records = args.work / "records"
    step(seconds, "predict", [str(ROOT / "benchmarks" / "predict_ooc_worker.py"), str(records), "--run-dir",
                              str(run_dir), "--parts", str(parts), "--out", str(pred)], PARTS, args.timeout)
    manifest = json.loads((parts / "manifest.json").read_text())
    ranks = [check(json.loads((records / f"rank-{r}.json").read_text()), manifest, train_peaks[r])
             for r in range(PARTS)]
    result = {
        "meta": {**provenance(), "python": platform.python_version()},  # per row: the rows come from several runs
        "graph": {"nodes": g.num_nodes, "edges": g.num_edges, "degree": args.degree, "features": args.features,
                  "edge_cut": manifest["edge_cut"], "method": manifest["method"], "memory_limit": args.limit},
        "model": {"model": "sage", "layers": 2, "hidden": args.hidden, "epochs": 1},
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "ranks": ranks,
        "ok": all(r["ok"] for r in ranks),
    }
    rows = json.loads(args.out.read_text())["rows"] if args.out.exists() else []
    rows = [r for r in rows if r["graph"]["nodes"] != g.num_nodes] + [result]
    write_result(args.out.stem, {"rows": sorted(rows, key=lambda r: r["graph"]["nodes"])}, args.out.parent)
    shutil.rmtree(args.work)
    print(table({"rows": [result]}))
    sys.exit(0 if result["ok"] else 1)


def step(seconds: dict[str, float], name: str, args: list[str], nproc: int | None, timeout: float) -> str:
    """Run ``args`` (:func:`harness.launch`) and record its seconds; its stdout. A failure
    stops the benchmark with harness.LaunchError, which names the command."""
    done = launch(args, nproc, {"PYTHONPATH": str(ROOT)}, timeout=timeout)
    seconds[name] = done.seconds
    print(f"{name}: {seconds[name]:.0f} s", flush=True)
    return done.stdout


def only_own_rows(rec: dict, manifest: dict) -> dict[str, bool]:
    """Whether the worker of ``rec`` (a :func:`predict_ooc_worker.touched_predict` record)
    touched its own rows only, in the partition of ``manifest`` and the predictions."""
    r, own = rec["rank"], manifest["parts"][rec["rank"]]["file"]
    row_bytes = sum(np.dtype(d["dtype"]).itemsize * int(np.prod(d["shape"], dtype=np.int64))
                    for d in manifest["node_data"].values())
    node_bytes = manifest["parts"][r]["num_nodes"] * row_bytes
    written = [re.match(r"(?:.*\.)?part-(\d+)\.", f) for f in rec["opened"]["out"]]
    return {
        "opened only the manifest and its part": rec["opened"]["parts"] == sorted(["manifest.json", own]),
        "opened no other worker's predictions": all(int(m.group(1)) == r for m in written if m),
        "mapped only its part": list(rec["mapped"]) == [own],
        "its part's resident pages at most its node rows":
            0 < rec["mapped"].get(own, 0) <= node_bytes + 2 * FAULT_AROUND * len(manifest["node_data"]),
    }


def check(rec: dict, manifest: dict, train: tuple[int, int]) -> dict:
    """One rank's figures and whether they hold (see the module docstring)."""
    r = rec["rank"]
    peak, estimate = rec["memory"]["peak_above_floor_bytes"], rec["memory"]["estimate_bytes"]
    out = {
        "rank": r,
        "opened_parts": rec["opened"]["parts"],
        "opened_predictions": rec["opened"]["out"],
        "mapped_bytes": rec["mapped"],
        "part_file_bytes": manifest["parts"][r]["bytes"],
        "peak_above_floor_mib": round(peak / 2**20, 1),
        "inference_estimate_mib": round(estimate / 2**20, 1),
        "train_peak_above_floor_mib": train[0],
        "train_estimate_mib": train[1],
        "checks": {
            **only_own_rows(rec, manifest),
            "peak at most the inference estimate + 15%": peak <= 1.15 * estimate,
            "peak below the training peak": peak / 2**20 < train[0],
        },
    }
    out["ok"] = all(out["checks"].values())
    return out


def table(data: dict) -> str:
    lines = ["| nodes | edges | ranks ok | peak per rank (max) | inference estimate (max) | training peak (max) "
             "| part file resident (max share) | partition | train 1 epoch | predict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in data["rows"]:
        rs, s = row["ranks"], row["seconds"]
        resident = max(sum(r["mapped_bytes"].values()) / r["part_file_bytes"] for r in rs)
        lines.append(
            f"| {row['graph']['nodes']:,} | {row['graph']['edges']:,} | {sum(r['ok'] for r in rs)}/{len(rs)} | "
            f"{max(r['peak_above_floor_mib'] for r in rs):.0f} MiB | {max(r['inference_estimate_mib'] for r in rs):.0f} "
            f"MiB | {max(r['train_peak_above_floor_mib'] for r in rs)} MiB | {resident:.1%} | {s['partition']:.0f} s | "
            f"{s['train']:.0f} s | {s['predict']:.0f} s |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
