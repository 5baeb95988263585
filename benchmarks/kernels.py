"""One machine, one layer: the generated Triton kernels against the torch executor and PyG.

    python benchmarks/kernels.py                     # on a CUDA machine: 2M edges
    TRITON_INTERPRET=1 python benchmarks/kernels.py --device cpu --nodes 2000 --degree 5 --repeats 1
                                                     # checks the script on a CPU (slow, tiny)

For a SAGE layer (mean aggregation: the generated SpMM and its transpose) and a GAT layer
(the fused attention kernels) it times forward + backward on a generated graph, for three
engines: sarcompile with ``executor="triton"``, sarcompile with ``executor="torch"`` (torch
sparse kernels, e.g. cuSPARSE), and PyG's own layer (``SAGEConv`` / ``GATConv``). It
reports the median time of ``--repeats`` steps after a warm-up (which also runs Triton's
autotuner) and, on CUDA, the peak memory a step allocates above what was allocated before
it (``torch.cuda.max_memory_allocated``); ratios are against the Triton engine. An engine
that fails is reported with its error, so one run says as much as it can. Writes
benchmarks/results/kernels.json and kernels.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from harness import figure, random_graph, results_dir, write_result  # (this directory is on the path)

ENGINES = ("triton", "torch", "pyg")


def layer(model: str, engine: str, channels: int, heads: int) -> torch.nn.Module:
    torch.manual_seed(0)
    if engine == "pyg":
        from torch_geometric.nn import GATConv, SAGEConv

        return SAGEConv(channels, channels, aggr="mean") if model == "sage" else GATConv(channels, channels, heads=heads)
    import sarcompile as sc

    inner = sc.nn.SAGEConv(channels, channels, "mean") if model == "sage" else sc.nn.GATConv(channels, channels, heads=heads)
    return sc.distribute(inner, executor=engine)


def measure(model: str, engine: str, a: argparse.Namespace, src, dst) -> dict:
    import sarcompile as sc

    device = torch.device(a.device)
    cuda = device.type == "cuda"
    net = layer(model, engine, a.channels, a.heads).to(device)
    x = torch.randn(a.nodes, a.channels, device=device, requires_grad=True)
    if engine == "pyg":
        args = (x, torch.stack([src, dst]).to(device))
    else:
        args = (sc.Graph.from_edges(src, dst, a.nodes), x)

    def step() -> None:
        net.zero_grad()
        x.grad = None
        net(*args).sum().backward()

    step()  # warm-up: tracing, CSR, kernel generation and autotuning are not timed
    times = []
    for _ in range(a.repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = None
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    return {"time_s": statistics.median(times), "peak_bytes": peak}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--degree", type=int, default=20, help="in-degree of every node (edges = nodes x degree)")
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--models", nargs="+", default=["sage", "gat"])
    p.add_argument("--engines", nargs="+", default=list(ENGINES))
    p.add_argument("--out", type=Path, default=results_dir() / "kernels", help="results path, without .json")
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on a GPU machine, or pass --device cpu with TRITON_INTERPRET=1 to check the script")
    src, dst = random_graph(a.nodes, a.degree)
    rows = []
    for model in a.models:
        for engine in a.engines:
            try:
                row = {"model": model, "engine": engine, **measure(model, engine, a, src, dst)}
            except Exception as e:  # report and go on: one run should say as much as it can
                traceback.print_exc()
                row = {"model": model, "engine": engine, "error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {
        "device": torch.cuda.get_device_name() if a.device == "cuda" else a.device,
        "torch": torch.__version__,
        "nodes": a.nodes,
        "edges": a.nodes * a.degree,
        "channels": a.channels,
        "heads": a.heads,
        "repeats": a.repeats,
        "rows": rows,
    }
    out = write_result(a.out.name.removesuffix(".json"), summary, a.out.parent)
    print(table(summary))
    _plot(summary, out.with_suffix(".png"))


def table(summary: dict) -> str:
    """Markdown: time and peak memory per model and engine, and each as a ratio to Triton."""
    lines = [
        f"{summary['device']}, {summary['edges']:,} edges, {summary['channels']} channels, GAT {summary['heads']} heads",
        "",
        "| layer | engine | fwd+bwd (ms) | vs triton | peak memory (MiB) | vs triton |",
        "|---|---|---|---|---|---|",
    ]
    for model in dict.fromkeys(r["model"] for r in summary["rows"]):
        rows = {r["engine"]: r for r in summary["rows"] if r["model"] == model}
        base = rows.get("triton", {})
        for engine, r in rows.items():
            if "error" in r:
                lines.append(f"| {model} | {engine} | failed: {r['error'][:80]} | | | |")
                continue
            t = f"{r['time_s'] * 1e3:.2f}"
            tr = f"{r['time_s'] / base['time_s']:.2f}x" if "time_s" in base else "-"
            m = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.1f}"
            mr = f"{r['peak_bytes'] / base['peak_bytes']:.2f}x" if r["peak_bytes"] and base.get("peak_bytes") else "-"
            lines.append(f"| {model} | {engine} | {t} | {tr} | {m} | {mr} |")
    return "\n".join(lines)


def _plot(summary: dict, path: Path) -> None:
    ok = [r for r in summary["rows"] if "error" not in r]
    labels = [f"{r['model']}\n{r['engine']}" for r in ok]
    with figure(path, 2, size=(5, 4), title=f"{summary['device']}: {summary['edges']:,} edges") as (time_ax, peak_ax):
        time_ax.bar(labels, [r["time_s"] * 1e3 for r in ok])
        time_ax.set_ylabel("forward + backward (ms, median)")
        peak_ax.bar(labels, [(r["peak_bytes"] or 0) / 2**20 for r in ok])
        peak_ax.set_ylabel("peak memory above baseline (MiB)")


if __name__ == "__main__":
    main()
