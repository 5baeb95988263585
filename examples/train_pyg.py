"""Train a plain PyTorch Geometric model on a partition directory with torchrun.

    torchrun --standalone --nproc-per-node 4 examples/train_pyg.py --parts parts

The model (``Net``) is ordinary PyG code -- ``SAGEConv``, ``BatchNorm``, ``GATConv``,
``forward(x, edge_index)`` -- and knows nothing of sarcompile. ``sc.distribute`` compiles
it; each worker then passes ``part.graph`` where the model takes ``edge_index``. The
loss is normalised by the *global* number of training nodes, gradients are summed
across workers, and PyG's ``BatchNorm`` is compiled to batch norm over the nodes of all
workers, so every epoch reproduces single-machine training. ``--reference`` makes rank
0 also train the *eager* PyG model (no sarcompile) on the whole graph, with
``edge_index`` rebuilt from the partition directory, and print both losses.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
import torch_geometric.nn as gnn
from common import num_classes, train_step
from torch import nn

import sarcompile as sc


class Net(nn.Module):
    """SAGE -> batch norm -> ReLU -> GAT (heads averaged): plain PyG."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, heads: int, attn_dropout: float):
        super().__init__()
        self.conv1 = gnn.SAGEConv(in_dim, hidden)
        self.norm1 = gnn.BatchNorm(hidden)
        self.conv2 = gnn.GATConv(hidden, num_classes, heads=heads, concat=False, dropout=attn_dropout)

    def forward(self, x, edge_index):
        h = F.relu(self.norm1(self.conv1(x, edge_index)))
        return self.conv2(h, edge_index)



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", required=True, help="partition directory (sarcompile partition --out)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--attn-dropout", type=float, default=0.0,
                    help="GATConv attention dropout; sarcompile draws its own edge-keyed masks (the same on any "
                         "number of workers), so with --reference the eager model's differ")
    ap.add_argument("--mode", default="sar", choices=["sar", "stash", "oneshot"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference", action="store_true", help="rank 0 also trains the eager PyG model and compares")
    args = ap.parse_args()

    rank, world_size = sc.init()
    part = sc.load_partition(args.parts)
    x, y, mask = part.node_data["x"], part.node_data["y"], part.node_data["train_mask"]
    classes = num_classes(y)
    total = sc.global_sum(mask.sum())

    torch.manual_seed(args.seed)  # identical initial weights (and attention-dropout seeds) on every worker
    net = Net(x.shape[1], args.hidden, classes, args.heads, args.attn_dropout)
    ref = None
    if args.reference and rank == 0:  # the eager PyG model, same initial weights, whole graph
        g_all, data = sc.load_whole_graph(args.parts)
        ref_net = Net(x.shape[1], args.hidden, classes, args.heads, args.attn_dropout)
        ref_net.load_state_dict(net.state_dict())
        edge_index = torch.stack([g_all.src, g_all.dst])
        ref = (ref_net, torch.optim.Adam(ref_net.parameters(), lr=args.lr), edge_index, data)
    model = sc.distribute(net, mode=args.mode)
    # The model compiles on its first call, which seeds attention dropout from torch's RNG:
    # the same state on every worker (rank 0 drew more numbers for the reference model).
    torch.manual_seed(args.seed + 1)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    if rank == 0:
        print(f"{world_size} workers, {int(total)} training nodes, mode={args.mode}")
        header = f"{'epoch':>5} {'loss (N workers)':>18}"
        if ref:
            header += f" {'loss (eager PyG)':>18} {'|diff|':>9}"
        print(header + f" {'time':>7}")
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        local_loss = train_step(model, opt, (x, part.graph), y, mask, total)
        loss = float(sc.global_sum(local_loss))
        took = time.perf_counter() - t0
        if rank == 0:
            line = f"{epoch:>5} {loss:>18.6f}"
            if ref:
                m, o, edge_index, d = ref
                m_mask = d["train_mask"]
                ref_loss = float(train_step(m, o, (d["x"], edge_index), d["y"], m_mask, m_mask.sum(), sync=False))
                line += f" {ref_loss:>18.6f} {abs(loss - ref_loss):>9.1e}"
            print(line + f" {took:>6.2f}s", flush=True)
    sc.shutdown()



if __name__ == "__main__":
    main()
