"""Graph layers written with the IR ops. Each computes what PyG's layer of the same name
computes for the same weights (parameter names follow PyG's, so weights copy across).

Layers take ``forward(graph, x)``; ``graph`` is a :class:`~sarcompile.Graph` on one
machine or ``part.graph`` inside a worker.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from sarcompile.errors import GraphError
from sarcompile.ir.ops import batch_norm, edge_dropout, edge_softmax, node_dropout, sddmm, spmm
from sarcompile.ir.lowering import register_lowering
from sarcompile.ir.rng import mix32, normal_rows
from sarcompile.graph.tables import NODES, mark_sharded, table_rows

__all__ = ["SAGEConv", "GCNConv", "GINConv", "GATConv", "BatchNorm", "NodeDropout", "NodeTable", "RandomStream"]


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


class BatchNorm(nn.BatchNorm1d):
    """Batch norm over the nodes of the whole graph: ``torch.nn.BatchNorm1d`` on one machine,
    and on N workers the same numbers, because the batch statistics (and the sums its
    backward needs) are all-reduced across workers.

    Running statistics are kept as torch keeps them and used in eval mode, so the
    ``state_dict`` (keys ``weight``, ``bias``, ``running_mean``, ``running_var``,
    ``num_batches_tracked``) moves freely to and from ``BatchNorm1d``. Input: node
    features ``[num_nodes, dim]``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return batch_norm(
            x,
            self.weight,
            self.bias,
            self.running_mean,
            self.running_var,
            self.num_batches_tracked,
            self.training or not self.track_running_stats,
            self.momentum,
            self.eps,
        )


class RandomStream(nn.Module):
    """The salt of counter-based dropout masks (see :mod:`sarcompile.ir.rng`).

    Each training-mode call advances a step counter and returns a new salt; eval-mode
    calls return the current one. ``seed`` defaults to a draw from torch's RNG, so set
    ``torch.manual_seed`` the same on every worker; seed and step are buffers, so a
    checkpoint resumes the same sequence of masks.
    """

    def __init__(self, seed: int | None = None):
        super().__init__()
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, ()))
        self.register_buffer("seed", torch.tensor(int(seed) & 0xFFFFFFFF))
        self.register_buffer("step", torch.tensor(0))

    def forward(self) -> torch.Tensor:
        if self.training:
            self.step += 1
        return self.seed ^ mix32(self.step)


# The dropout streams of PyG and DGL attention layers (GATConv's attention dropout), one per
# layer: a layer's stand-in is rebuilt at every compile, and the stream must outlive it so
# the masks go on across recompiles, without adding state to the user's module.
# DistributedModule.mask_state() saves them with the model's own stream.
LAYER_STREAMS: "weakref.WeakKeyDictionary[nn.Module, RandomStream]" = weakref.WeakKeyDictionary()


def layer_stream(layer: nn.Module) -> RandomStream:
    """The dropout stream of attention layer ``layer`` (made at its first compile, seeded
    from torch's RNG: seed torch alike on every worker)."""
    if layer not in LAYER_STREAMS:
        LAYER_STREAMS[layer] = RandomStream()
    return LAYER_STREAMS[layer]


class NodeDropout(nn.Module):
    """Dropout whose mask is a function of (seed, step, global node id, feature).

    Every node draws the same mask wherever it lives, so a model with ``NodeDropout``
    trains identically on one worker or N (see :class:`RandomStream` for the seed).

    ``x`` holds a row per node of ``graph``: its destination nodes, or with ``source=True``
    its source nodes. On a typed graph, pass the relation whose destination (or source)
    type ``x``'s rows are of, ``drop(g["writes"], h["paper"])``, and give each node type a
    ``NodeDropout`` of its own: its seed keys that type's masks, so that two types' nodes
    of the same id do not share one.
    """

    def __init__(self, p: float = 0.5, seed: int | None = None, source: bool = False):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self.source = source
        self.stream = RandomStream(seed)

    def forward(self, graph, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        ids = graph.src_global_ids if self.source else graph.global_ids
        if ids.numel() != x.shape[0]:
            end = "source" if self.source else "destination"
            raise GraphError(f"NodeDropout: x has {x.shape[0]} rows but the graph has {ids.numel()} {end} nodes; "
                             "pass the graph (or relation) whose nodes x's rows are, and source=True for its sources")
        return node_dropout(graph, x, self.p, self.stream(), self.source)

    def extra_repr(self) -> str:
        return f"p={self.p}" + (", source=True" if self.source else "")


class NodeTable(nn.Embedding):
    """A learnable row per node of a type (a featureless type's embedding), whose initial
    rows are the same however the graph is split: an ``nn.Embedding(num_nodes, dim)`` with
    ``nn.Embedding``'s N(0, 1) initialisation, but entry ``(row, column)`` drawn from a hash
    of ``(seed, row's global id, column)`` (:func:`sarcompile.ir.rng.normal_rows`), not from
    torch's RNG state.

    So a worker makes only its own rows: with ``rows`` (the global ids of the worker's
    nodes of ``node_type``, ``part.graph.global_ids[t]``) the weight holds those rows, in
    that order, and is marked as that worker's shard of the table
    (:func:`sarcompile.graph.tables.mark_sharded`), so the whole table is never in one process;
    without ``rows``, one machine's whole table, whose row ``r`` is every worker's row ``r``.
    ``seed`` defaults to one draw from torch's RNG (seed torch alike on every worker), so
    each table of a model gets its own; name a type's table by its type (``emb.author``)
    as :mod:`sarcompile.graph.tables` finds them.

    >>> import torch, sarcompile as sc
    >>> whole = sc.nn.NodeTable(5, 3, seed=7)
    >>> mine = sc.nn.NodeTable(5, 3, seed=7, rows=torch.tensor([4, 1]), node_type="author")
    >>> bool(torch.equal(mine.weight, whole.weight[[4, 1]])), tuple(mine.weight.shape)
    (True, (2, 3))
    """

    def __init__(self, num_nodes: int, dim: int, seed: int | None = None, rows: torch.Tensor | None = None,
                 node_type: str = NODES):
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, ()))
        ids = torch.arange(num_nodes) if rows is None else rows.cpu().long()
        self.num_nodes, self.seed = int(num_nodes), int(seed)
        super().__init__(ids.numel(), dim, _weight=self._draw(ids, dim))
        if rows is not None:
            mark_sharded(self.weight, node_type, ids, self.num_nodes)

    def _draw(self, ids: torch.Tensor, dim: int) -> torch.Tensor:
        return normal_rows(ids, dim, torch.tensor(self.seed & 0xFFFFFFFF))

    def reset_parameters(self) -> None:
        """The initial rows again (of the rows it holds)."""
        held = table_rows(self.weight)
        with torch.no_grad():
            self.weight.copy_(self._draw(torch.arange(self.num_nodes) if held is None else held[0],
                                         self.embedding_dim))

    def extra_repr(self) -> str:
        held = table_rows(self.weight)
        return f"{self.num_nodes}, {self.embedding_dim}" + ("" if held is None else f", rows held={held[0].numel()}")


class GATConv(nn.Module):
    """Graph attention as PyG's GATConv: ``lin`` projects to ``heads`` x ``out_dim``, scores
    ``leaky_relu(att_src . h[u] + att_dst . h[v])`` are soft-maxed over the in-edges of
    every node (with exactly one self-loop each if ``add_self_loops``), optionally dropped
    out, and weight the sum of ``h[u]``; heads are concatenated or averaged.

    Written with the raw IR ops; the compiler's fuse pass turns the chain into one
    attention op that keeps no per-edge tensor. Attention dropout uses a mask keyed by
    edge id (:class:`RandomStream`), so it is the same on any number of workers.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        bias: bool = True,
        residual: bool = False,
        seed: int | None = None,
    ):
        super().__init__()
        self.heads, self.out_dim, self.concat = heads, out_dim, concat
        self.negative_slope, self.dropout, self.add_self_loops = negative_slope, dropout, add_self_loops
        width = heads * out_dim if concat else out_dim
        self.lin = nn.Linear(in_dim, heads * out_dim, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_dim))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_dim))
        self.res = nn.Linear(in_dim, width, bias=False) if residual else None
        self.bias = nn.Parameter(torch.zeros(width)) if bias else None
        self.attn_drop = RandomStream(seed)
        for w in (self.lin.weight, self.att_src, self.att_dst):
            nn.init.xavier_uniform_(w)

    def forward(self, graph, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x).view(x.size(0), self.heads, self.out_dim)
        a_src = (h * self.att_src).sum(-1)
        a_dst = (h * self.att_dst).sum(-1)
        g = graph.with_self_loops() if self.add_self_loops else graph
        score = F.leaky_relu(sddmm(g, a_src, a_dst, "add"), self.negative_slope)
        weight = edge_softmax(g, score)
        if self.training and self.dropout > 0:
            weight = edge_dropout(g, weight, self.dropout, self.attn_drop())
        out = spmm(g, h, "sum", edge_weight=weight)
        out = out.flatten(1) if self.concat else out.mean(1)
        if self.res is not None:
            out = out + self.res(x)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"heads={self.heads}, out_dim={self.out_dim}, concat={self.concat}, dropout={self.dropout}"


class _GlobalBatchNorm(nn.Module):
    """A ``torch.nn.BatchNorm1d`` the model applies to node features, as :class:`BatchNorm`:
    on one machine it normalises over every node, so N workers must too. Its parameters
    and buffers stay the layer's own."""

    def __init__(self, layer: nn.BatchNorm1d):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return BatchNorm.forward(self.layer, x)


# These layers are written with IR ops already: each lowers to itself.
for _layer in (SAGEConv, GCNConv, GINConv, GATConv, BatchNorm):
    register_lowering(_layer, lambda m: m)
register_lowering(nn.BatchNorm1d, _GlobalBatchNorm)
