"""sarcompile against DGL, side by side in one run: peak memory above the floor and epoch time.

    python benchmarks/vs_dgl.py                              # 100k nodes / 2M edges, N = 1, 2, 4, 8
    python benchmarks/vs_dgl.py --nodes 20000 --workers 1 2 --models sage --epochs 3   # a quick look
    python benchmarks/vs_dgl.py --models rgcn --workers 1 4  # RGCN on a MAG-like typed graph

Generates one graph (a stochastic block model: symmetric, with self-loops, 128 features,
16 classes) for SAGE and GAT, and for RGCN a MAG-like typed graph (sarcompile.data.synthetic.mag_like:
papers, authors, institutions, fields of study, 212k nodes and 2.29M edges with the reverse
relations, the papers' 128 features and 16 classes; ``--mag-scale``), where both engines
train DGL's ogbn-mag example model (learnable embeddings of the featureless types, two
relational layers, ``--rgcn-hidden`` wide), METIS-partitions each for every worker count, then runs each model in DGL (one
process, in the project's DGL environment: scripts/dgl_env.sh) and in sarcompile (one
plain process for N=1, torchrun for N>1), one after the other. Every run is its own
process (benchmarks/vs_dgl_worker.py) and reports the peak resident size above its floor
(after the imports and torch's lazy optimizer imports) and the median epoch; sarcompile's
runs add a measured memory ledger per worker, the plan's estimate, and a time ledger of the
step (computing, waiting on the exchange, all-reduces, the optimizer). Prints the table with
ratios to DGL's one process; writes benchmarks/results/vs_dgl.json and vs_dgl.png.

By default no allocator variables are set: this is the environment a user has (where
``sc.init()`` fixes glibc's mmap threshold, see sarcompile.dist.memory).
``--allocator default tcmalloc`` runs everything twice, the second time with tcmalloc
preloaded into DGL's and sarcompile's processes alike (``sarcompile allocator``); ratios
compare runs with the same allocator. ``off`` runs sarcompile with ``SARCOMPILE_MALLOC=off``
(glibc's own thresholds), against DGL as a user runs it.
Threads: the one process uses every core (``--threads``, default all); N workers split them (at least 1).
On a machine whose speed swings by a third between minutes, two runs made one after the
other compare two spells of the machine as much as two engines; so all runs of one model
(every engine, setting and worker count) take turns (benchmarks/turns.py): each is set up
alone, then round k gives each its k-th timed epoch (after an untimed one that brings it
back to its steady state) while the others wait, blocked, and a slow spell hits every run's
epochs of the same rounds. ``--no-interleave`` runs each one start to end instead.
``--repeat K`` does it all K times over, in fresh processes, and reports the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from harness import command, figure, partition, results_dir, sbm_file, write_result
from sarcompile.dist.memory import find_allocator
from sarcompile.dist.traffic import TIME_LEDGER
from turns import Run, run_all

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MiB = 2**20


def make_graph(path: Path, nodes: int, edges: int, features: int, classes: int) -> None:
    """A learnable SBM graph with ``edges`` directed edges in all: both directions of
    ``(edges - nodes) / 2`` random pairs, plus one self-loop per node."""
    sbm_file(path, nodes, (edges - nodes) / 2 / nodes, classes=classes, features=features, self_loops=True)


def make_mag(path: Path, scale: float, features: int, classes: int) -> None:
    """A MAG-like typed graph (sarcompile.data.synthetic.mag_like at ``scale`` of its default
    212k nodes, reverse relations included) with the papers' features and classes."""
    from sarcompile.data.synthetic import mag_like, mag_like_sizes

    data = mag_like(**mag_like_sizes(scale), features=features, num_classes=classes, seed=0)
    paper = data.node_data["paper"]
    torch.save({"edges": {r: (g.src, g.dst) for r, g in data.graph.items()},
                "num_nodes": {t: data.graph.num_nodes(t) for t in data.graph.node_types},
                "x": paper["x"], "y": paper["y"]}, path)


def partition_mag(path: Path, num_parts: int, out: Path) -> None:
    import sarcompile as sc

    data = torch.load(path)
    g = sc.HeteroGraph.from_edges(data["edges"], data["num_nodes"])
    sc.partition(g, num_parts, out, node_data={"paper": {"x": data["x"], "y": data["y"]}})


def dgl_python() -> str:
    done = subprocess.run(["bash", str(ROOT / "scripts" / "dgl_env.sh")], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the DGL environment could not be made (scripts/dgl_env.sh):\n{done.stderr[-2000:]}")
    return str(Path(done.stdout.strip()) / "bin" / "python")


def launcher(n: int) -> list[str]:
    """How a run on ``n`` workers starts: one plain process, or torchrun on this machine."""
    return command([], None if n == 1 else n)


# --allocator values that are sarcompile's own SARCOMPILE_MALLOC setting (DGL runs as is).
OWN_SETTINGS = ("off",)


def allocator_env(allocator: str) -> dict[str, str]:
    """What a run with ``allocator`` adds to the environment: tcmalloc and jemalloc are
    preloaded into every process (DGL's too: the same allocator on both sides); off is
    sarcompile's own setting (SARCOMPILE_MALLOC, ignored by DGL)."""
    if allocator == "default":
        return {}
    if allocator in OWN_SETTINGS:
        return {"SARCOMPILE_MALLOC": allocator}
    path = find_allocator(allocator)
    if path is None:
        sys.exit(f"--allocator {allocator}: it is not installed here (python -m sarcompile allocator {allocator} "
                 "says how to install it)")
    return {"LD_PRELOAD": path}


def measure(a: argparse.Namespace) -> list[dict]:
    threads = a.threads or os.cpu_count() or 1
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD", "SARCOMPILE_MALLOC")}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # One graph per kind: the SBM for sage and gat, the MAG-like typed graph for rgcn.
        graphs = {}
        if set(a.models) & {"sage", "gat"}:
            graphs["sbm"] = tmp / "graph.pt"
            make_graph(graphs["sbm"], a.nodes, a.edges, a.features, a.classes)
            for n in a.workers:
                partition(["--edges", str(graphs["sbm"])], n, tmp / f"sbm{n}", base_env=base)
        if "rgcn" in a.models:
            graphs["mag"] = tmp / "mag.pt"
            make_mag(graphs["mag"], a.mag_scale, a.features, a.classes)
            for n in a.workers:
                partition_mag(graphs["mag"], n, tmp / f"mag{n}")
        dgl = dgl_python() if not a.skip_dgl else None
        worker = str(HERE / "vs_dgl_worker.py")
        common = ["--hidden", str(a.hidden), "--classes", str(a.classes), "--epochs", str(a.epochs)]
        for model in a.models:
            kind = "mag" if model == "rgcn" else "sbm"
            hidden = ["--hidden", str(a.rgcn_hidden)] if model == "rgcn" else []  # (the later flag wins)
            runs = []  # (row tag, Run, its JSON record): every engine and setting of this model
            for allocator in a.allocator:
                extra = allocator_env(allocator)
                tag = {"model": model, "allocator": allocator}
                if dgl and allocator not in OWN_SETTINGS:
                    env = {**base, **extra, "OMP_NUM_THREADS": str(threads), "DGLBACKEND": "pytorch",
                           "PYTHONPATH": str(ROOT)}
                    out = tmp / f"run{len(runs)}.json"
                    cmd = [dgl, worker, "--engine", "dgl", "--model", model, "--graph", str(graphs[kind]),
                           "--out", str(out), *common, *hidden]
                    runs.append(({"engine": "dgl", **tag, "workers": 1}, Run(cmd, env, 1, out.with_suffix(".log")), out))
                for n in a.workers:
                    env = {**base, **extra, "OMP_NUM_THREADS": str(max(threads // n, 1))}
                    out = tmp / f"run{len(runs)}.json"
                    cmd = launcher(n) + [worker, "--engine", "sarcompile", "--model", model, "--parts",
                                         str(tmp / f"{kind}{n}"), "--out", str(out), *common, *hidden,
                                         "--blocks-in-flight", str(a.blocks_in_flight)]
                    runs.append(({"engine": "sarcompile", **tag, "workers": n}, Run(cmd, env, n, out.with_suffix(".log")),
                                 out))
            for _ in range(a.repeat):
                for _, _, out in runs:
                    out.unlink(missing_ok=True)
                finished = run_all([run for _, run, _ in runs], a.epochs, a.timeout, a.interleave)
                for (row, _, out), ok in zip(runs, finished):
                    if ok and out.exists():
                        rows.append({**row, "per_worker": json.loads(out.read_text())})
                        print(line(rows[-1]), flush=True)
    return merge_repeats(rows)


MEDIANS = ("epoch_s", "peak_above_floor_bytes", "time_ledger")  # what --repeat takes the median of


def merge_repeats(rows: list[dict]) -> list[dict]:
    """One row per (engine, model, allocator, workers): with ``--repeat``, each worker's
    epoch, peak and time ledger (each part on its own) are the medians over the repeats
    (its other fields the first run's), and ``runs`` keeps every repeat's, with its epochs."""
    merged: dict[tuple, dict] = {}
    for row in rows:
        key = (row["engine"], row["model"], row["allocator"], row["workers"])
        if key not in merged:
            merged[key] = {**row, "per_worker": [{**w, "runs": []} for w in row["per_worker"]]}
        for mine, w in zip(merged[key]["per_worker"], row["per_worker"]):
            mine["runs"].append({k: w[k] for k in (*MEDIANS, "epoch_times") if k in w})  # (every epoch, kept)
    for row in merged.values():
        for w in row["per_worker"]:
            for k in ("epoch_s", "peak_above_floor_bytes"):
                w[k] = statistics.median(run[k] for run in w["runs"])
            if "time_ledger" in w:
                w["time_ledger"] = {part: statistics.median(run["time_ledger"][part] for run in w["runs"])
                                    for part in w["time_ledger"]}
    return list(merged.values())


def reference(rows: list[dict], row: dict) -> dict | None:
    """The DGL run a row is compared with: same model, same allocator (off is
    sarcompile's own setting, so its reference is DGL as a user runs it)."""
    allocator = "default" if row["allocator"] in OWN_SETTINGS else row["allocator"]
    return next((r for r in rows if r["engine"] == "dgl" and r["model"] == row["model"]
                 and r["allocator"] == allocator), None)


def peak(row: dict) -> int:
    return max(w["peak_above_floor_bytes"] for w in row["per_worker"])


def epoch(row: dict) -> float:
    return max(w["epoch_s"] for w in row["per_worker"])


def line(row: dict) -> str:
    w = max(row["per_worker"], key=lambda w: w["peak_above_floor_bytes"])
    text = f"{row['engine']:>10} {row['model']:>4} {row['allocator']:>8} N={row['workers']}: peak {peak(row) / MiB:7.0f} MiB, " \
           f"epoch {epoch(row):6.2f} s"
    if "estimate" in w:
        text += f", estimate {w['estimate']['peak_bytes'] / MiB:.0f} MiB"
    return text


def table(rows: list[dict]) -> str:
    """Markdown: one line per (model, allocator, engine, N), ratios to DGL's one process."""
    out = ["| model | malloc | engine | workers | peak above floor (MiB, per worker) | vs DGL | epoch (s) | vs DGL "
           "| plan estimate (MiB) | estimate / measured |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for model in dict.fromkeys(r["model"] for r in rows):
        for r in (r for r in rows if r["model"] == model):
            ref = reference(rows, r)
            w = max(r["per_worker"], key=lambda w: w["peak_above_floor_bytes"])
            est = w.get("estimate", {}).get("peak_bytes")
            mem_ratio = f"{peak(r) / peak(ref):.2f}x" if ref else "-"
            time_ratio = f"{epoch(r) / epoch(ref):.2f}x" if ref and r["workers"] == 1 else "-"
            out.append(f"| {model} | {r['allocator']} | {r['engine']} | {r['workers']} | {peak(r) / MiB:.0f} | "
                       f"{mem_ratio} | {epoch(r):.2f} | {time_ratio} | {'-' if est is None else f'{est / MiB:.0f}'} | "
                       f"{'-' if est is None else f'{est / peak(r):.2f}'} |")
    return "\n".join(out)


def ledger(rows: list[dict]) -> str:
    """Where each sarcompile run's largest worker's memory went, measured, next to the plan."""
    out = []
    for r in rows:
        if r["engine"] != "sarcompile":
            continue
        w = max(r["per_worker"], key=lambda w: w["peak_above_floor_bytes"])
        parts = ", ".join(f"{k} {v / MiB:.0f}" for k, v in w["ledger"].items())
        plan = ", ".join(f"{k} {v / MiB:.0f}" for k, v in w["estimate"].items())
        out.append(f"{r['model']} {r['allocator']} N={r['workers']} (MiB) measured: {parts}\n    plan: {plan}")
    return "\n".join(out)


def time_ledger(rows: list[dict]) -> str:
    """Where each sarcompile run's slowest worker's step went (medians over the timed steps):
    computing, blocked on the halo exchange, in all-reduces, in the optimizer."""
    out = ["| model | malloc | workers | step (s) | compute | waiting on the exchange | all-reduce | optimizer |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if r["engine"] != "sarcompile" or "time_ledger" not in r["per_worker"][0]:
            continue
        w = max(r["per_worker"], key=lambda w: w["epoch_s"])
        t = w["time_ledger"]
        total = sum(t.values())
        cells = " | ".join(f"{t[k]:.2f} ({100 * t[k] / total:.0f}%)" for k in TIME_LEDGER)
        out.append(f"| {r['model']} | {r['allocator']} | {r['workers']} | {total:.2f} | {cells} |")
    return "\n".join(out)


def plot(rows: list[dict], path: Path) -> None:
    models = list(dict.fromkeys(r["model"] for r in rows))
    with figure(path, len(models), size=(5, 3.5)) as axes:
        for ax, model in zip(axes, models):
            for allocator in dict.fromkeys(r["allocator"] for r in rows):
                mine = [r for r in rows if r["model"] == model and r["allocator"] == allocator]
                ours = sorted((r["workers"], peak(r) / MiB) for r in mine if r["engine"] == "sarcompile")
                line_ = ax.plot([p[0] for p in ours], [p[1] for p in ours], marker="o",
                                label=f"sarcompile ({allocator}), per worker")[0]
                for r in mine:
                    if r["engine"] == "dgl":
                        ax.axhline(peak(r) / MiB, color=line_.get_color(), linestyle="--", label=f"DGL ({allocator})")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("workers")
            ax.set_ylabel("peak above floor (MiB)")
            ax.set_title(model)
            ax.legend(fontsize="small")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--edges", type=int, default=2_000_000, help="directed edges, self-loops included")
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--models", nargs="+", default=["sage", "gat", "rgcn"], choices=["sage", "gat", "rgcn"])
    ap.add_argument("--mag-scale", type=float, default=1.0,
                    help="rgcn's MAG-like graph, in units of sarcompile.data.synthetic.mag_like's default (212k nodes)")
    ap.add_argument("--rgcn-hidden", type=int, default=64, help="rgcn's hidden width (DGL's ogbn-mag example: 64)")
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--epochs", type=int, default=5, help="timed epochs after one warm-up")
    ap.add_argument("--blocks-in-flight", type=int, default=1,
                    help="sarcompile's overlap: blocks posted ahead and pushes in flight (0: none; default 1)")
    ap.add_argument("--threads", type=int, default=0, help="threads of the one process (default: all cores)")
    ap.add_argument("--allocator", nargs="+", choices=["default", "tcmalloc", "jemalloc", *OWN_SETTINGS],
                    default=["default"],
                    help="malloc of the runs, each in turn: default (glibc, as a user has it), tcmalloc or "
                    "jemalloc (LD_PRELOAD'ed into DGL's and sarcompile's processes alike), off "
                    "(sarcompile's SARCOMPILE_MALLOC=off)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of each engine, in turn; each worker's epoch and peak are the medians over them")
    ap.add_argument("--no-interleave", dest="interleave", action="store_false",
                    help="run each engine start to end, one after the other, instead of epoch by epoch in turns")
    ap.add_argument("--skip-dgl", action="store_true", help="sarcompile only (no DGL environment)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", type=Path, default=results_dir() / "vs_dgl.json")
    a = ap.parse_args()
    rows = measure(a)
    config = {k: getattr(a, k) for k in ("nodes", "edges", "features", "classes", "hidden", "epochs", "threads",
                                         "allocator", "mag_scale", "rgcn_hidden", "blocks_in_flight", "repeat", "interleave")}
    out = write_result(a.out.stem, {"config": config, "rows": rows}, a.out.parent)
    plot(rows, out.with_suffix(".png"))
    print(table(rows))
    print(ledger(rows))
    print(time_ledger(rows))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
