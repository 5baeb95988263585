"""Train a plain DGL model on a partition directory with torchrun.

    torchrun --standalone --nproc-per-node 4 examples/train_dgl.py --parts parts

The model (``Net``) is ordinary DGL code -- ``dgl.nn.SAGEConv``, ``dgl.nn.GATConv`` and a
module of its own that calls ``g.update_all(fn.copy_u(...), fn.mean(...))`` --, with
``forward(g, x)``, and knows nothing of sarcompile. ``sc.distribute`` compiles it; each
worker then passes ``part.graph`` where the model takes the DGLGraph. The loss is
normalised by the *global* number of training nodes and gradients are summed across
workers, so every epoch reproduces single-machine training. ``--reference`` makes rank 0
also train the *eager* DGL model (no sarcompile) on the whole graph, a DGLGraph rebuilt
from the partition directory with ``sc.load_whole_graph``, and print both losses.

The partition directory can come from ``sarcompile partition --edges`` or from a DGL
partition converted with ``sarcompile partition --dgl-partition CONFIG.json``.
"""

from __future__ import annotations

import argparse
import time

import dgl
import dgl.function as fn
import dgl.nn as dglnn
import torch
import torch.nn.functional as F
from common import num_classes, train_step
from torch import nn

import sarcompile as sc


class MeanNeighbours(nn.Module):
    """User DGL code: a node's own projection plus the mean of its in-neighbours'."""

    def __init__(self, dim: int):
        super().__init__()
        self.self_lin = nn.Linear(dim, dim)
        self.neigh_lin = nn.Linear(dim, dim, bias=False)

    def forward(self, g, h):
        with g.local_scope():
            g.ndata["h"] = self.neigh_lin(h)
            g.update_all(fn.copy_u("h", "m"), fn.mean("m", "neigh"))
            return self.self_lin(h) + g.ndata["neigh"]


class Net(nn.Module):
    """SAGE -> ReLU -> mean of neighbours (update_all) -> ReLU -> GAT (heads averaged): plain DGL."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, heads: int):
        super().__init__()
        self.conv1 = dglnn.SAGEConv(in_dim, hidden, "mean")
        self.mix = MeanNeighbours(hidden)
        self.conv2 = dglnn.GATConv(hidden, num_classes, num_heads=heads, allow_zero_in_degree=True)

    def forward(self, g, x):
        h = F.relu(self.conv1(g, x))
        h = F.relu(self.mix(g, h))
        return self.conv2(g, h).mean(1)



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", required=True, help="partition directory (sarcompile partition --out)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--mode", default="sar", choices=["sar", "stash", "oneshot"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference", action="store_true", help="rank 0 also trains the eager DGL model and compares")
    args = ap.parse_args()

    rank, world_size = sc.init()
    part = sc.load_partition(args.parts)
    # .bool(): a partition converted from DGL's files holds masks as uint8
    x, y, mask = part.node_data["x"], part.node_data["y"], part.node_data["train_mask"].bool()
    classes = num_classes(y)
    total = sc.global_sum(mask.sum())

    torch.manual_seed(args.seed)  # identical initial weights on every worker
    net = Net(x.shape[1], args.hidden, classes, args.heads)
    ref = None
    if args.reference and rank == 0:  # the eager DGL model, same initial weights, whole graph
        g_all, data = sc.load_whole_graph(args.parts)
        ref_net = Net(x.shape[1], args.hidden, classes, args.heads)
        ref_net.load_state_dict(net.state_dict())
        dgl_graph = dgl.graph((g_all.src, g_all.dst), num_nodes=g_all.num_nodes)
        ref = (ref_net, torch.optim.Adam(ref_net.parameters(), lr=args.lr), dgl_graph, data)
    model = sc.distribute(net, mode=args.mode)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    if rank == 0:
        print(f"{world_size} workers, {int(total)} training nodes, mode={args.mode}")
        header = f"{'epoch':>5} {'loss (N workers)':>18}"
        if ref:
            header += f" {'loss (eager DGL)':>18} {'|diff|':>9}"
        print(header + f" {'time':>7}")
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        local_loss = train_step(model, opt, (part.graph, x), y, mask, total)
        loss = float(sc.global_sum(local_loss))
        took = time.perf_counter() - t0
        if rank == 0:
            line = f"{epoch:>5} {loss:>18.6f}"
            if ref:
                m, o, dgl_graph, d = ref
                m_mask = d["train_mask"].bool()
                ref_loss = float(train_step(m, o, (dgl_graph, d["x"]), d["y"], m_mask, m_mask.sum(), sync=False))
                line += f" {ref_loss:>18.6f} {abs(loss - ref_loss):>9.1e}"
            print(line + f" {took:>6.2f}s", flush=True)
    sc.shutdown()



if __name__ == "__main__":
    main()
