"""Train a 2-layer GraphSAGE on a partition directory with torchrun.

    torchrun --standalone --nproc-per-node 4 examples/train_sage.py --parts parts

Each worker loads its partition and runs the compiled model on its nodes; the loss is
normalised by the *global* number of training nodes and gradients are summed across
workers, so every epoch reproduces single-machine training. ``--reference`` makes rank 0
also train the same model on the whole graph (rebuilt from the partition directory) and
print both losses side by side.
"""

from __future__ import annotations

import argparse
import time

import torch
from common import num_classes, train_step
from torch import nn

import sarcompile as sc
from sarcompile.dist.memory import MemoryProbe


class SAGE(nn.Module):
    def __init__(self, in_dim: int, hidden: int, num_classes: int, dropout: float):
        super().__init__()
        self.conv1 = sc.nn.SAGEConv(in_dim, hidden, "mean")
        self.drop = sc.nn.NodeDropout(dropout)  # same mask per node on any number of workers
        self.conv2 = sc.nn.SAGEConv(hidden, num_classes, "mean")

    def forward(self, g, x):
        return self.conv2(g, self.drop(g, torch.relu(self.conv1(g, x))))



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", required=True, help="partition directory (sarcompile partition --out)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--mode", default="sar", choices=["sar", "stash", "oneshot"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference", action="store_true", help="rank 0 also trains on the whole graph and compares")
    args = ap.parse_args()

    rank, world_size = sc.init()
    part = sc.load_partition(args.parts)
    x, y, mask = part.node_data["x"], part.node_data["y"], part.node_data["train_mask"]
    classes = num_classes(y)
    total = sc.global_sum(mask.sum())

    torch.manual_seed(args.seed)  # identical initial weights and dropout seeds on every worker
    model = sc.distribute(SAGE(x.shape[1], args.hidden, classes, args.dropout), mode=args.mode)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    ref = None
    if args.reference and rank == 0:
        g_all, data = sc.load_whole_graph(args.parts)
        torch.manual_seed(args.seed)
        ref_model = sc.distribute(SAGE(x.shape[1], args.hidden, classes, args.dropout))
        ref = (ref_model, torch.optim.Adam(ref_model.parameters(), lr=args.lr), g_all, data)

    if rank == 0:
        print(f"{world_size} workers, {int(total)} training nodes, mode={args.mode}")
        print(f"{'epoch':>5} {'loss (N workers)':>18}" + (f" {'loss (1 machine)':>18} {'|diff|':>9}" if ref else "") + f" {'time':>7}")
    probe = MemoryProbe()
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        with probe:
            local_loss = train_step(model, opt, (part.graph, x), y, mask, total)
        loss = float(sc.global_sum(local_loss))
        took = time.perf_counter() - t0
        if rank == 0:
            line = f"{epoch:>5} {loss:>18.6f}"
            if ref:
                m, o, g_all, d = ref
                ref_loss = float(train_step(m, o, (g_all, d["x"]), d["y"], d["train_mask"], d["train_mask"].sum(), sync=False))
                line += f" {ref_loss:>18.6f} {abs(loss - ref_loss):>9.1e}"
            print(line + f" {took:>6.2f}s", flush=True)
    # Peak memory of the last step on every worker (see sarcompile/dist/memory.py).
    mem = torch.zeros(world_size, 2, dtype=torch.float64)
    mem[rank] = torch.tensor([probe.peak_bytes, probe.added_bytes], dtype=torch.float64) / 2**20
    mem = sc.global_sum(mem)
    if rank == 0:
        for r in range(world_size):
            print(f"worker {r}: peak resident {mem[r, 0]:.0f} MiB, +{mem[r, 1]:.0f} MiB during the last step")
    sc.shutdown()



if __name__ == "__main__":
    main()
