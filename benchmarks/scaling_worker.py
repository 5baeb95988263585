"""One scaling-benchmark run on one worker (started by benchmarks/scaling.py via torchrun).

Trains ``--epochs`` full-batch steps after one warm-up step and records, per worker, the
median step time, the bytes received per step by phase, the measured peak memory of a
step (MemoryProbe: above the resident size at the step's start, and absolute) and the
plan's estimate for this worker. Rank 0 writes everything to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import sarcompile as sc
from sarcompile.data.manifest import read_manifest
from sarcompile.dist.traffic import stats
from sarcompile.dist.memory import MemoryProbe


class SAGE3(nn.Module):
    def __init__(self, in_dim: int, hidden: int, classes: int):
        super().__init__()
        self.convs = nn.ModuleList(
            [sc.nn.SAGEConv(in_dim, hidden), sc.nn.SAGEConv(hidden, hidden), sc.nn.SAGEConv(hidden, classes)]
        )

    def forward(self, g, x):
        for i, conv in enumerate(self.convs):
            x = conv(g, x)
            if i < len(self.convs) - 1:
                x = torch.relu(x)
        return x


class GAT2(nn.Module):
    def __init__(self, in_dim: int, hidden: int, classes: int, heads: int = 4):
        super().__init__()
        self.g1 = sc.nn.GATConv(in_dim, hidden // heads, heads=heads)
        self.g2 = sc.nn.GATConv(hidden, classes, heads=heads, concat=False)

    def forward(self, g, x):
        return self.g2(g, F.elu(self.g1(g, x)))


MODELS = {"sage": SAGE3, "gat": GAT2}


def build(parts: str, model: str, mode: str, hidden: int) -> tuple[nn.Module, torch.optim.Optimizer, list]:
    """The benchmark's model and optimizer, and the plan's memory estimate for every worker."""
    manifest = read_manifest(parts)
    in_dim = manifest.node_data["x"]["shape"][0]
    torch.manual_seed(0)
    compiled = sc.distribute(MODELS[model](in_dim, hidden, 16), mode=mode)
    opt = torch.optim.Adam(compiled.parameters(), lr=0.01)
    return compiled, opt, compiled.plan(parts, optimizer=opt).memory_estimate()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", required=True)
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--mode", default="sar")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    rank, world = sc.init()
    part = sc.load_partition(a.parts)
    x, y = part.node_data["x"], part.node_data["y"]
    model, opt, estimates = build(a.parts, a.model, a.mode, a.hidden)
    estimate = estimates[rank]
    total = sc.global_sum(torch.tensor(float(part.graph.num_nodes)))

    def step() -> None:
        opt.zero_grad()
        loss = F.cross_entropy(model(part.graph, x), y, reduction="sum") / total
        loss.backward()
        sc.sync_gradients(model)
        opt.step()

    step()  # warm-up: compiling, caches, optimizer state
    times, added, peak, traffic = [], [], [], []
    for _ in range(a.epochs):
        stats.reset()
        dist.barrier()
        t0 = time.perf_counter()
        with MemoryProbe() as probe:
            step()
        times.append(time.perf_counter() - t0)
        added.append(probe.added_bytes)
        peak.append(probe.peak_bytes)
        traffic.append(stats.as_dict())
    mine = {
        "rank": rank,
        "step_s": statistics.median(times),
        "measured_added_bytes": max(added),
        "measured_peak_bytes": max(peak),
        "estimate": {"peak_bytes": estimate.peak_bytes, **estimate.breakdown},
        "traffic": traffic[-1],
    }
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump(everyone, f)
    sc.shutdown()


if __name__ == "__main__":
    main()
