"""Graph layers written with the IR ops. Each computes what PyG's layer of the same name
computes for the same weights (parameter names follow PyG's, so weights copy across).

Layers take ``forward(graph, x)``; ``graph`` is a :class:`~sarcompile.Graph` on one
machine or ``part.graph`` inside a worker.
"""

from __future__ import annotations

import torch
from torch import nn

from .ops import spmm
from .passes.lower import register_lowering
from .rng import mix32, uniform

__all__ = ["SAGEConv", "GCNConv", "GINConv", "NodeDropout"]


class SAGEConv(nn.Module):
    """GraphSAGE: ``lin_l(aggr_{u->v} x[u]) + lin_r(x[v])``; aggr in mean, sum, max."""

    def __init__(self, in_dim: int, out_dim: int, aggr: str = "mean", bias: bool = True):
        super().__init__()
        if aggr not in ("mean", "sum", "max"):
            raise ValueError(f"SAGEConv aggr must be 'mean', 'sum' or 'max', got {aggr!r}")
        self.aggr = aggr
        self.lin_l = nn.Linear(in_dim, out_dim, bias=bias)
        self.lin_r = nn.Linear(in_dim, out_dim, bias=False)

    def forward(self, graph, x: torch.Tensor) -> torch.Tensor:
        return self.lin_l(spmm(graph, x, self.aggr)) + self.lin_r(x)


class GCNConv(nn.Module):
    """``D^-1/2 (A + I) D^-1/2 X W + b`` as PyG's GCNConv: existing self-loops are replaced
    by exactly one unit self-loop per node, and the degree counts it."""

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True):
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        nn.init.xavier_uniform_(self.lin.weight)
        self.bias = nn.Parameter(torch.zeros(out_dim)) if bias else None

    def forward(self, graph, x: torch.Tensor) -> torch.Tensor:
        g = graph.with_self_loops()
        norm = g.in_degrees().to(x.dtype).rsqrt().unsqueeze(-1)
        # Scale at the source before the aggregation and at the destination after: only
        # each node's own degree is needed, so nothing extra crosses workers.
        out = spmm(g, self.lin(x) * norm, "sum") * norm
        return out if self.bias is None else out + self.bias


class GINConv(nn.Module):
    """``mlp((1 + eps) * x[v] + sum_{u->v} x[u])``."""

    def __init__(self, mlp: nn.Module, eps: float = 0.0, train_eps: bool = False):
        super().__init__()
        self.nn = mlp
        if train_eps:
            self.eps = nn.Parameter(torch.tensor([float(eps)]))
        else:
            self.register_buffer("eps", torch.tensor([float(eps)]))

    def forward(self, graph, x: torch.Tensor) -> torch.Tensor:
        return self.nn((1 + self.eps) * x + spmm(graph, x, "sum"))


class NodeDropout(nn.Module):
    """Dropout whose mask is a function of (seed, step, global node id, feature).

    Every node draws the same mask wherever it lives, so a model with ``NodeDropout``
    trains identically on one worker or N. ``seed`` defaults to a draw from torch's RNG
    (set ``torch.manual_seed`` the same on every worker); ``step`` counts training calls
    and both are buffers, so checkpoints resume the same sequence of masks.
    """

    def __init__(self, p: float = 0.5, seed: int | None = None):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, ()))
        self.register_buffer("seed", torch.tensor(int(seed) & 0xFFFFFFFF))
        self.register_buffer("step", torch.tensor(0))

    def forward(self, graph, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        self.step += 1
        width = x[0].numel() if x.shape[0] else 1
        keys = graph.global_ids.unsqueeze(1) * width + torch.arange(width)
        keep = uniform(keys, self.seed ^ mix32(self.step)) >= self.p
        return x * keep.reshape(x.shape).to(x.dtype) / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


# These layers are written with IR ops already: each lowers to itself.
for _layer in (SAGEConv, GCNConv, GINConv):
    register_lowering(_layer, lambda m: m)
