"""One machine, one GAT layer: sarcompile's fused attention vs PyG's GATConv.

    python benchmarks/gat_single.py            # 50k nodes, in-degree 20, 4 heads x 64
    python benchmarks/gat_single.py --quick    # a small graph, to check the script

Each engine runs in its own process (so peak memory is not polluted by the other), does
one warm-up step, then times forward + backward ``--repeats`` times and reports the
median; peak memory is the resident-set peak of one step above the baseline before it
(see sarcompile/dist/memory.py). Writes benchmarks/results/gat_single.json and a PNG.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from harness import figure, launch, random_graph, write_result  # (this directory is on the path)


def run_engine(engine: str, nodes: int, degree: int, heads: int, channels: int, repeats: int) -> dict:
    from sarcompile.dist.memory import MemoryProbe

    torch.manual_seed(0)
    torch.set_num_threads(1)  # both engines on one core: comparable and quieter
    src, dst = random_graph(nodes, degree)
    x = torch.randn(nodes, channels, requires_grad=True)
    if engine == "pyg":
        from torch_geometric.nn import GATConv

        layer = GATConv(channels, channels, heads=heads)
        edge_index = torch.stack([src, dst])
        step_input = (x, edge_index)
    else:
        import sarcompile as sc

        layer = sc.distribute(sc.nn.GATConv(channels, channels, heads=heads))
        step_input = (sc.Graph.from_edges(src, dst, nodes), x)

    def step() -> None:
        layer.zero_grad()
        x.grad = None
        out = layer(*step_input)
        out.sum().backward()

    step()  # warm-up: one-time set-up (CSR, self-loops, tracing) is not what we time
    with MemoryProbe() as probe:
        step()
    mem = probe.added_bytes
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"engine": engine, "median_s": statistics.median(times), "times_s": times, "peak_bytes": mem}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--degree", type=int, default=20)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--engine", help=argparse.SUPPRESS)  # internal: run one engine in this process
    a = ap.parse_args()
    if a.quick:
        a.nodes, a.repeats = 2000, 2
    if a.engine:
        print(json.dumps(run_engine(a.engine, a.nodes, a.degree, a.heads, a.channels, a.repeats)))
        return
    results = {}
    for engine in ("pyg", "sarcompile"):
        args = [__file__, "--engine", engine, "--nodes", str(a.nodes), "--degree", str(a.degree), "--heads",
                str(a.heads), "--channels", str(a.channels), "--repeats", str(a.repeats)]
        # Freed tensors leave the resident set at once with a fixed mmap threshold (see
        # benchmarks/scaling.py), so the peak measures what the step itself holds.
        done = launch(args, env={"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"})
        results[engine] = json.loads(done.stdout.strip().splitlines()[-1])
    pyg, ours = results["pyg"], results["sarcompile"]
    summary = {
        "config": {"nodes": a.nodes, "edges": a.nodes * a.degree, "heads": a.heads, "channels": a.channels,
                   "repeats": a.repeats},
        "results": results,
        "time_ratio_sarcompile_over_pyg": ours["median_s"] / pyg["median_s"],
        "memory_ratio_sarcompile_over_pyg": ours["peak_bytes"] / pyg["peak_bytes"],
    }
    name = "gat_single_quick" if a.quick else "gat_single"
    _plot(summary, write_result(name, summary).with_suffix(".png"))
    print(f"GAT layer, {a.nodes} nodes, {a.nodes * a.degree} edges, {a.heads} heads x {a.channels}, "
          f"forward+backward, median of {a.repeats}, 1 thread")
    print(f"{'engine':<12} {'median time':>12} {'peak memory':>12}")
    for engine, r in results.items():
        print(f"{engine:<12} {r['median_s']:>11.3f}s {r['peak_bytes'] / 2**20:>9.0f} MiB")
    print(f"sarcompile / PyG: time {summary['time_ratio_sarcompile_over_pyg']:.2f}x, "
          f"memory {summary['memory_ratio_sarcompile_over_pyg']:.2f}x")


def _plot(summary: dict, path: Path) -> None:
    engines = list(summary["results"])
    c = summary["config"]
    with figure(path, 2, size=(4, 3.2),
                title=f"GAT layer: {c['nodes']} nodes, {c['edges']} edges, {c['heads']} heads x {c['channels']}"
                ) as (ax1, ax2):
        ax1.bar(engines, [summary["results"][e]["median_s"] for e in engines], color=["tab:gray", "tab:blue"])
        ax1.set_ylabel("forward+backward (s, median)")
        ax2.bar(engines, [summary["results"][e]["peak_bytes"] / 2**20 for e in engines], color=["tab:gray", "tab:blue"])
        ax2.set_ylabel("peak memory (MiB)")


if __name__ == "__main__":
    main()
