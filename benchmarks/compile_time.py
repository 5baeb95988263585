"""What compiling costs a user: ``sc.distribute`` plus the first call, as issue 28 asks it.

    python benchmarks/compile_time.py            # 5 fresh processes, 5 later models each

Each fresh process imports sarcompile (not timed), builds a 3-layer SAGE (the trainer's
``GNN``, 64 wide) and times ``sc.distribute(model)`` plus its first call on a 2,000-node
graph of 20,000 random edges: the first compile in a process, which pays for the
libraries' lazy imports. It then times the same for 5 more models built afresh (a later
compile: no lazy import left), and one GAT model. Prints the medians and each stage's share
(``plan.compile_seconds`` of a plan of the last model); writes
benchmarks/results/compile_time.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from harness import launch, results_dir, write_result  # (this directory is on the path: the script's)


def one_process() -> dict:
    """Runs in a fresh interpreter: the seconds of the first compile and of later ones."""
    import sarcompile as sc  # noqa: I001 -- imported first, untimed, as a user's script would
    import torch

    from sarcompile.train import GNN

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    n = 2000
    g = sc.Graph.from_edges(torch.randint(0, n, (20 * n,), generator=gen),
                            torch.randint(0, n, (20 * n,), generator=gen), n)
    x = torch.randn(n, 64, generator=gen)

    def compile_and_call(model: str) -> tuple[float, object]:
        net = GNN(model=model, in_dim=64, hidden=64, num_classes=8, layers=3, heads=2 if model == "gat" else 1,
                  dropout=0.0, batch_norm=False, residual=False)
        start = time.perf_counter()
        compiled = sc.distribute(net)
        compiled(g, x)
        return time.perf_counter() - start, compiled

    first, _ = compile_and_call("sage")
    later = [compile_and_call("sage")[0] for _ in range(5)]
    gat, _ = compile_and_call("gat")
    _, compiled = compile_and_call("sage")
    stages = compiled.plan(g, 4, x=x[:1]).compile_seconds
    return {"first_s": first, "later_s": later, "gat_s": gat, "stages_s": stages}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=5)
    ap.add_argument("--out", type=Path, default=results_dir() / "compile_time.json")
    a = ap.parse_args()
    runs = []
    for _ in range(a.processes):
        done = launch([__file__, "--one"], timeout=600)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first = statistics.median(r["first_s"] for r in runs)
    later = statistics.median(t for r in runs for t in r["later_s"])
    gat = statistics.median(r["gat_s"] for r in runs)
    stages = {k: statistics.median(r["stages_s"][k] for r in runs) for k in runs[0]["stages_s"]}
    print(f"first model in a fresh process (3-layer SAGE, 2,000 nodes): median {first:.3f} s over {len(runs)} processes")
    print(f"later model: median {1000 * later:.1f} ms over {sum(len(r['later_s']) for r in runs)} compiles; "
          f"a 3-layer GAT {1000 * gat:.1f} ms")
    print("stages of a later compile, planned for 4 workers (median ms): "
          + ", ".join(f"{k} {1000 * v:.1f}" for k, v in stages.items()))
    out = write_result(a.out.stem, {"first_s": first, "later_s": later, "gat_s": gat, "stages_s": stages, "runs": runs},
                       a.out.parent)
    print(f"wrote {out}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--one"]:
        print(json.dumps(one_process()))
    else:
        main()
