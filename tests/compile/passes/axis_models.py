"""Models whose node rows move off dim 0 and back, row-locally (imported by the pool's
workers too): each registers in :data:`cases.MODELS`, so :func:`cases.run_worker` runs it
on a worker's shard."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import cases
import sarcompile as sc


class StackMean(nn.Module):
    """Two layers' outputs stacked on a new leading dim (the rows on dim 1 in between) and
    averaged over it, as JumpingKnowledge-style models write it; attention over the layers,
    a softmax over dim 0 of each node's scores."""

    def __init__(self):
        super().__init__()
        self.sage = sc.nn.SAGEConv(6, 8, "mean")
        self.gcn = sc.nn.GCNConv(6, 8)
        self.score = nn.Linear(8, 1)

    def forward(self, g, x):
        outs = [torch.relu(self.sage(g, x)), torch.tanh(self.gcn(g, x))]
        h = torch.stack(outs).mean(0) + torch.stack(outs, 0).amax(0)
        s = torch.stack(outs, 0)  # [2, n, 8]
        alpha = torch.softmax(self.score(s), dim=0)  # Linear over the features, softmax over the layers
        return sc.spmm(g, h + (alpha * s).sum(0), "sum")


class Moves(nn.Module):
    """unsqueeze, a double permute, transpose and back, movedim, ``.T`` of a stack of
    columns, indexing a stack, and parameters broadcast against rows on dim 1."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 8)
        self.scale = nn.Parameter(torch.randn(2, 1, 4))

    def forward(self, g, x):
        h = self.lin(x)  # [n, 8]
        u = torch.cat([h.unsqueeze(0), (2 * h).unsqueeze(0)]).sum(0)
        p = h.view(-1, 2, 4).permute(1, 0, 2) * self.scale  # [2, n, 4]
        p = p.permute(1, 0, 2).reshape(h.size(0), 8)
        t = h.view(-1, 2, 4).transpose(0, 1).transpose(0, 1).reshape(-1, 8)
        m = torch.movedim(torch.stack([h, u], -1), -1, 0)[1]  # [2, n, 8], then its second
        c = torch.stack([h[:, 0], h[:, 1]]).T  # [2, n] -> [n, 2]
        s = torch.stack([h, t])[:, :, :2] + h[None, :, :2]  # [2, n, 2] plus [1, n, 2]
        return sc.spmm(g, u + p + t + m, "mean")[:, :2] + c + s[-1]


class Einsum(nn.Module):
    """Per-head projections with nodes on ``b`` (``einsum("bij,ijk->bik")``), a permutation
    by einsum of rows on dim 1 back to dim 0, and a batched matmul with rows as its batch."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 3, 4))
        self.v = nn.Parameter(torch.randn(6))
        self.m = nn.Parameter(torch.randn(6, 2))

    def forward(self, g, x):
        h = torch.einsum("bij,ijk->bik", x.view(-1, 2, 3), self.w)  # [n, 2, 4]
        e = torch.einsum("hbk->bhk", h.transpose(0, 1)).reshape(x.size(0), 8)
        mm = (x.unsqueeze(1) @ self.m).squeeze(1)  # [n, 1, 6] @ [6, 2]
        return sc.spmm(g, e, "sum")[:, :2] + torch.einsum("bi,i->b", x, self.v).unsqueeze(-1) + mm


class RnnStates(nn.Module):
    """An LSTM over a sequence per node with states made per node, ``torch.zeros(1,
    x.size(0), hidden)`` (DGL's LSTM aggregator), its last states back to rows first; a GRU
    over ``torch.stack`` of layers ([steps, nodes, features], not batch_first)."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(6, 5, batch_first=True)
        self.gru = nn.GRU(6, 5)
        self.conv = sc.nn.SAGEConv(5, 3, "mean")

    def forward(self, g, x):
        agg = sc.spmm(g, x, "mean")
        h0 = torch.zeros(1, x.size(0), 5, dtype=x.dtype)
        c0 = x.new_ones(1, x.size(0), 5) * torch.full((1, x.size(0), 1), 0.1, dtype=x.dtype)
        _, (h, c) = self.lstm(torch.stack([x, agg], 1), (h0, c0))
        out, last = self.gru(torch.stack([x, agg]))
        return self.conv(g, h.squeeze(0) + c[0] + out[-1] + last.mean(0))


MODELS = {"stack_mean": StackMean, "moves": Moves, "einsum": Einsum, "rnn_states": RnnStates}
cases.MODELS.update(MODELS)


def run_worker(rank: int, world_size: int, payload: dict[str, Any]) -> cases.Result:
    """:func:`cases.run_worker`, with these models known (a worker imports this module)."""
    return cases.run_worker(rank, world_size, payload)
