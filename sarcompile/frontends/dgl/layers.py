"""DGL front-end: DGL graphs and DGL's own layers compile unchanged.

The compiler imports this module when ``dgl`` is imported (see
:mod:`sarcompile.compile.distribute`); it needs DGL itself. It gives

* lowering rules (:func:`sarcompile.ir.lowering.register_lowering`) for
  ``dgl.nn.SAGEConv`` (``mean``, ``gcn``, ``pool``), ``dgl.nn.GraphConv`` (every ``norm``),
  ``dgl.nn.GATConv``, ``dgl.nn.HGTConv``, ``dgl.nn.EdgeWeightNorm`` and
  ``dgl.nn.TypedLinear``: each layer is replaced by a stand-in written with the IR ops that
  computes what the DGL layer computes and *shares* its parameters, so gradients land on the
  DGL module and its ``state_dict`` keys stay DGL's. SAGEConv, GraphConv and GATConv also
  take a ``(source, destination)`` pair of features, as ``HeteroGraphConv`` calls them on a
  relation between two node types (:mod:`sarcompile.frontends.dgl.hetero`).

The convention: where the eager DGL model gets the ``DGLGraph``, the compiled one gets a
sarcompile graph (``Graph.from_dgl(g)``, ``HeteroGraph.from_dgl(hg)``, or a worker's
``part.graph``)::

    model = sc.distribute(MyDGLModel(...))
    out = model(sc.Graph.from_dgl(g), x)        # == MyDGLModel(...)(g, x)

Dropouts (``feat_drop``, HGTConv's ``dropout``, GAT's ``attn_drop``) draw sarcompile's
counter-based masks, keyed by node or edge id: the same on any number of workers, but other
masks than DGL's. What does not carry over is refused with a
:class:`~sarcompile.CompileError` naming the layer and the option: ``DGLBlock`` inputs and
``aggregator_type="lstm"``. DGL code that calls ``DGLGraph`` methods itself is traced with a
graph proxy (:mod:`sarcompile.frontends.dgl.graph`).
"""

from __future__ import annotations

import weakref
from types import SimpleNamespace
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from dgl.nn.pytorch import EdgeWeightNorm, GATConv, GraphConv, HGTConv, SAGEConv, TypedLinear
from torch import nn

from sarcompile.errors import CompileError, GraphError
from sarcompile.graph.graph import Graph
from sarcompile.nn import layer_stream
from sarcompile.ir.ops import edge_dropout, edge_reduce, edge_reduce_src, edge_softmax, gather_dst, gather_src, sddmm, spmm
from sarcompile.ir.lowering import declare, register_lowering
from sarcompile.ir.vocab import Residency
from sarcompile.dist.collectives import global_sum, is_offline
from sarcompile.graph.shard import ShardGraph

__all__ = ["out_degrees"]


# -- runtime helpers the stand-ins call ----------------------------------------------------------
# Each is a single fx node in the compiled program (torch.fx.wrap) and runs on the real graph:
# a sarcompile Graph on one machine, a worker's ShardGraph in a distributed run. Results are
# cached per graph object (graphs are immutable), so the exchange below runs once per graph.
_OUT_DEGREES: weakref.WeakKeyDictionary[Any, torch.Tensor] = weakref.WeakKeyDictionary()


def out_degrees(graph: Graph | ShardGraph, src_rows: torch.Tensor) -> torch.Tensor:
    """Out-degree of every source node (local source rows on a worker), counting all its
    out-edges: the ``edge_reduce_src`` op run once per graph (every worker reaches it at
    the same point of the program, so its exchange lines up). ``src_rows`` is a tensor with
    a row per source node (the graph's ``src_global_ids``): it tells the compiler whose rows
    the result is (a relation's source type)."""
    cached = _OUT_DEGREES.get(graph)
    if cached is None:
        cached = edge_reduce_src(graph, torch.ones(graph.num_edges, dtype=torch.long))
        _OUT_DEGREES[graph] = cached
    return cached


def check_edge_weights(graph: Graph | ShardGraph, weight: torch.Tensor, positive: bool) -> torch.Tensor:
    """``weight`` unchanged if it is one scalar per edge, positive where ``positive``; else
    DGL's EdgeWeightNorm error. All workers decide together, as :func:`require_in_edges`."""
    if weight.dim() != 1:
        raise GraphError("dgl.nn.EdgeWeightNorm normalises one scalar weight per edge, got a weight of shape "
                         f"{tuple(weight.shape)} (DGL raises here too)")
    if positive and not is_offline() and int(global_sum((weight <= 0).sum().reshape(1))[0]):
        raise GraphError('dgl.nn.EdgeWeightNorm(norm="both") got a non-positive edge weight, whose square root '
                         "or inverse it would take (DGL raises here too)")
    return weight


def require_in_edges(graph: Graph | ShardGraph, feat: torch.Tensor, layer: str) -> torch.Tensor:
    """``feat`` unchanged if every node has an in-edge; else the error DGL raises for
    ``allow_zero_in_degree=False``. All workers decide together (one all-reduce of a count),
    so they fail together instead of leaving their peers waiting."""
    check_in_edges(graph, layer)
    return feat


def check_in_edges(graph: Graph | ShardGraph, layer: str = "a DGL layer") -> None:
    """DGL's ``if (g.in_degrees() == 0).any(): raise DGLError(...)``, on all workers together."""
    if is_offline():  # the planner's probe runs on a made-up graph; only real graphs are checked
        return
    zero = int(global_sum((graph.in_degrees() == 0).sum().reshape(1))[0])
    if zero:
        raise GraphError(
            f"{layer}: {zero} node(s) have no in-edge, so their output would be invalid (DGL raises here "
            "too). Add a self-loop to every node (dgl.add_self_loop(g)) before Graph.from_dgl, or build "
            "the layer with allow_zero_in_degree=True."
        )


def scale_rows(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``x * s`` with ``s [n]`` broadcast over the trailing dims of ``x [n, ...]``."""
    return x * s.to(x.dtype).reshape(-1, *([1] * (x.dim() - 1)))


def check_call(feat: torch.Tensor, layer: str, **refused: Any) -> torch.Tensor:
    """``feat`` unchanged, after refusing any of ``refused`` given (not None / not False).

    A stand-in is traced once for every call signature, so optional arguments are only
    known when the program runs: this check runs then, before anything is computed."""
    for name, value in refused.items():
        if value is not None and value is not False:
            raise CompileError(f"{layer}: {name}= is not supported by the compiled layer")
    return feat


def split_pair(feat: Any, layer: str) -> tuple[Any, Any]:
    """A layer's ``(source, destination)`` features, as DGL's ``expand_as_pair`` gives them on
    a whole graph: a pair as it is (``HeteroGraphConv`` passes one on every relation), one
    tensor for both ends. Runs while tracing: the pair is two inputs of the layer."""
    if isinstance(feat, (tuple, list)):
        if len(feat) != 2:
            raise CompileError(f"{layer} takes node features or a (source, destination) pair, got {len(feat)} tensors")
        return feat[0], feat[1]
    return feat, feat


def own_or_given(own: torch.Tensor | None, given: torch.Tensor | None) -> torch.Tensor | None:
    """GraphConv's weight: its own, or the one passed to forward (never both, as in DGL)."""
    if own is not None and given is not None:
        raise CompileError("dgl.nn.GraphConv got an external weight but has its own; build it with weight=False")
    return own if given is None else given


def matmul_opt(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    return x if weight is None else torch.matmul(x, weight)


def graph_device(graph: Graph | ShardGraph) -> torch.device:
    """DGL's ``g.device``: where the graph's index tensors are."""
    return graph.dst_index.device


for _fn in ("out_degrees", "check_edge_weights", "require_in_edges", "check_in_edges", "scale_rows",
            "check_call", "own_or_given", "matmul_opt", "graph_device"):
    torch.fx.wrap(_fn)
# Each is row-local (the residency pass cannot look inside them): the result's residency.
for _fn, _out in ((out_degrees, "src_rows"),
                  (check_edge_weights, "weight"), (require_in_edges, "feat"), (check_in_edges, Residency.CONST), (scale_rows, "x"),
                  (check_call, "feat"), (own_or_given, Residency.PARAM), (matmul_opt, "x"),
                  (graph_device, Residency.CONST)):
    declare(_fn, _out)


# -- stand-ins -------------------------------------------------------------------------------------
def dropped_pair(drop: nn.Module, feat: Any, layer: str) -> tuple[Any, Any]:
    """A layer's ``(source, destination)`` features after its ``feat_drop``, as DGL drops
    them: each end of a pair on its own, one tensor once for both ends. The dropout pass
    keys the masks by node id (see :mod:`sarcompile.compile.passes.dropout`)."""
    src, dst = split_pair(feat, layer)
    if src is dst:
        src = dst = drop(src)
        return src, dst
    return drop(src), drop(dst)


class _Shared(nn.Module):
    """Base of the stand-ins: the DGL layer's own submodules and parameters (never copies),
    and its training flag at compile time (a program is compiled per training flag)."""

    def __init__(self, m: nn.Module, names: tuple[str, ...]):
        super().__init__()
        for name in names:
            value = getattr(m, name, None)
            if isinstance(value, (nn.Module, nn.Parameter)) or value is None:
                setattr(self, name, value)
            else:  # a plain activation function
                object.__setattr__(self, name, value)
        self.training = m.training


class DGLSAGEConv(_Shared):
    """``dgl.nn.SAGEConv`` with ``aggregator_type`` ``mean``, ``gcn`` or ``pool``."""

    def __init__(self, m: SAGEConv):
        aggr = m._aggre_type
        if aggr not in ("mean", "gcn", "pool"):
            raise CompileError(
                f"dgl.nn.SAGEConv(aggregator_type={aggr!r}) is not supported: its reducer runs an LSTM "
                "over each node's in-edges in DGL's order. Use 'mean', 'gcn' or 'pool'."
            )
        super().__init__(m, ("feat_drop", "fc_neigh", "fc_self", "fc_pool", "bias", "activation", "norm"))
        self.aggr = aggr
        self.lin_before_mp = m._in_src_feats > m._out_feats  # DGL's order of the linear map

    # Note: every argument is a symbolic value when this is traced (see check_call).
    def forward(self, graph, feat, edge_weight=None):
        feat_src, feat_dst = dropped_pair(self.feat_drop, feat, "dgl.nn.SAGEConv")
        if self.aggr == "pool":
            feat_src = check_call(feat_src, "dgl.nn.SAGEConv(aggregator_type='pool')", edge_weight=edge_weight)
            h_neigh = self.fc_neigh(spmm(graph, F.relu(self.fc_pool(feat_src)), "max"))
        else:
            feat_src = check_call(feat_src, "dgl.nn.SAGEConv")
            h = self.fc_neigh(feat_src) if self.lin_before_mp else feat_src
            if self.aggr == "mean":
                h_neigh = spmm(graph, h, "mean", edge_weight)
            else:  # gcn: the node itself counts as one more neighbour
                if isinstance(feat, (tuple, list)):  # a pair: the destination's own row, mapped as DGL maps it
                    h_dst = self.fc_neigh(feat_dst) if self.lin_before_mp else feat_dst
                else:
                    h_dst = h
                deg = graph.in_degrees().to(h.dtype)
                h_neigh = (spmm(graph, h, "sum", edge_weight) + h_dst) / (deg.unsqueeze(-1) + 1)
            if not self.lin_before_mp:
                h_neigh = self.fc_neigh(h_neigh)
        if self.aggr == "gcn":
            rst = h_neigh if self.bias is None else h_neigh + self.bias
        else:
            rst = self.fc_self(feat_dst) + h_neigh
        if self.activation is not None:
            rst = self.activation(rst)
        if self.norm is not None:
            rst = self.norm(rst)
        return rst


class DGLGraphConv(_Shared):
    """``dgl.nn.GraphConv``: ``norm`` in both, right, left, none; an own or a given weight."""

    def __init__(self, m: GraphConv):
        super().__init__(m, ("weight", "bias", "_activation"))
        self.norm, self.allow_zero_in_degree = m._norm, m._allow_zero_in_degree
        self.in_feats, self.out_feats = m._in_feats, m._out_feats

    def forward(self, graph, feat, weight=None, edge_weight=None):
        feat, feat_dst = split_pair(feat, "dgl.nn.GraphConv")  # feat: the sources' rows
        feat = check_call(feat, "dgl.nn.GraphConv")
        if not self.allow_zero_in_degree:
            feat = require_in_edges(graph, feat, "dgl.nn.GraphConv")
        weight = own_or_given(self.weight, weight)
        if self.norm in ("left", "both"):
            degs = out_degrees(graph, graph.src_global_ids).clamp(min=1).to(feat.dtype)
            feat = scale_rows(feat, degs.pow(-0.5) if self.norm == "both" else 1.0 / degs)
        if self.in_feats > self.out_feats:  # DGL's order: multiply first when it shrinks the rows
            rst = spmm(graph, matmul_opt(feat, weight), "sum", edge_weight)
        else:
            rst = matmul_opt(spmm(graph, feat, "sum", edge_weight), weight)
        if self.norm in ("right", "both"):
            degs = graph.in_degrees().clamp(min=1).to(feat_dst.dtype)
            rst = scale_rows(rst, degs.pow(-0.5) if self.norm == "both" else 1.0 / degs)
        if self.bias is not None:
            rst = rst + self.bias
        if self._activation is not None:
            rst = self._activation(rst)
        return rst


class DGLEdgeWeightNorm(nn.Module):
    """``dgl.nn.EdgeWeightNorm``: ``w_uv / sqrt(out_w(u) in_w(v))`` (``both``), ``w_uv / in_w(v)``
    (``right``) or ``w_uv`` (``none``), with the weighted degrees plus ``eps``, in DGL's order
    of operations (source norm, times destination norm, times weight)."""

    def __init__(self, m: EdgeWeightNorm):
        super().__init__()
        self.norm, self.eps = m._norm, m._eps

    def forward(self, graph, edge_weight):
        w = check_edge_weights(graph, edge_weight, positive=self.norm == "both")
        if self.norm == "none":
            return w
        degs = edge_reduce(graph, w) + self.eps
        dst = degs.pow(-0.5) if self.norm == "both" else 1.0 / degs
        dst = gather_dst(graph, dst)
        if self.norm != "both":
            return dst * w  # DGL's 1 * dst * w
        src = (edge_reduce_src(graph, w) + self.eps).pow(-0.5)  # weighted out-degrees
        return gather_src(graph, src) * dst * w  # src[u] * dst[v] * w_uv

class DGLTypedLinear(nn.Module):
    """``dgl.nn.TypedLinear``: row ``i`` times the weight of its type ``x_type[i]``, written
    per row (DGL's ``gather_mm`` picks its kernel by the row count)."""

    def __init__(self, m: TypedLinear):
        super().__init__()
        self.m = m  # its get_weight() (the bases or the blocks) runs on its own parameters

    def forward(self, x, x_type, sorted_by_type=False):
        w = self.m.get_weight()[x_type]  # [rows, in, out]; bdd: [rows, blocks * in/blocks * out/blocks]
        if self.m.regularizer == "bdd":
            b, si, so = self.m.num_bases, self.m.submat_in, self.m.submat_out
            return torch.matmul(x.reshape(-1, b, 1, si), w.reshape(-1, b, si, so)).reshape(-1, b * so)
        return torch.matmul(x.unsqueeze(1), w).squeeze(1)


class DGLGATConv(_Shared):
    """``dgl.nn.GATConv``: output ``[n, heads, out]`` as DGL's. Attention scores
    ``leaky_relu(attn_l . h[u] + attn_r . h[v])`` are soft-maxed over the in-edges as given
    (DGL adds no self-loops); the compiler fuses the chain into one attention op.
    ``attn_drop`` uses sarcompile's counter-based edge dropout (see the module docstring)."""

    def __init__(self, m: GATConv):
        # fc, or fc_src and fc_dst when built with a pair of input sizes
        super().__init__(m, ("feat_drop", "fc", "fc_src", "fc_dst", "attn_l", "attn_r", "res_fc", "activation"))
        self.bias = m.bias if m.has_explicit_bias else None
        self.heads, self.out_feats = m._num_heads, m._out_feats
        self.negative_slope = float(m.leaky_relu.negative_slope)
        self.attn_p = float(m.attn_drop.p)
        self.allow_zero_in_degree = m._allow_zero_in_degree
        if m.training and self.attn_p > 0:
            # (kept across recompiles; DGL's state_dict has no room for it: see sarcompile.nn.LAYER_STREAMS)
            self.attn_stream = layer_stream(m)
            self.attn_stream.training = True

    def forward(self, graph, feat, edge_weight=None, get_attention=False):
        paired = isinstance(feat, (tuple, list))
        if self.fc is None and not paired:  # DGL fails here too (it has no fc)
            raise CompileError("dgl.nn.GATConv built with a pair of input sizes takes a (source, destination) pair "
                               "of features")
        feat_src, feat_dst = dropped_pair(self.feat_drop, feat, "dgl.nn.GATConv")
        # The compiled attention keeps no per-edge tensor: nothing to return or to reweight.
        feat_src = check_call(feat_src, "dgl.nn.GATConv", edge_weight=edge_weight, get_attention=get_attention)
        if not self.allow_zero_in_degree:
            feat_src = require_in_edges(graph, feat_src, "dgl.nn.GATConv")
        n_src, n_dst = feat_src.size(0), feat_dst.size(0)  # (view(-1, ...) fails on a worker with no rows)
        h_src = (self.fc if self.fc is not None else self.fc_src)(feat_src).view(n_src, self.heads, self.out_feats)
        h_dst = h_src
        if paired:
            h_dst = (self.fc if self.fc is not None else self.fc_dst)(feat_dst).view(n_dst, self.heads, self.out_feats)
        a_src = (h_src * self.attn_l).sum(-1)
        a_dst = (h_dst * self.attn_r).sum(-1)
        score = F.leaky_relu(sddmm(graph, a_src, a_dst, "add"), self.negative_slope)
        weight = edge_softmax(graph, score)
        if self.training and self.attn_p > 0:
            weight = edge_dropout(graph, weight, self.attn_p, self.attn_stream())
        rst = spmm(graph, h_src, "sum", edge_weight=weight)
        if self.res_fc is not None:
            rst = rst + self.res_fc(feat_dst).view(n_dst, self.heads, self.out_feats)
        if self.bias is not None:
            rst = rst + self.bias.view(1, self.heads, self.out_feats)
        if self.activation is not None:
            rst = self.activation(rst)
        return rst


class DGLHGTConv(nn.Module):
    """``dgl.nn.HGTConv`` on a graph with a type per node and per edge (``ntype``, ``etype``,
    as ``dgl.to_homogeneous`` gives them): keys and values of the sources and queries of the
    destinations gathered onto the edges, DGL's own message function on them, the edge
    softmax and the sum into the destinations, then DGL's typed output map and skip mix.
    (DGL's forward picks the skip by comparing two shapes in Python, which a traced row
    count cannot answer; on a whole graph the feature sizes decide it, as here.)

    Its ``dropout`` gets masks keyed by node id, as every dropout of node rows does."""

    def __init__(self, m: HGTConv):
        super().__init__()
        self.m = m  # its typed linear maps, relation parameters and message function, called through it

    def forward(self, graph, x, ntype, etype, *, presorted=False):
        m, n = self.m, x.size(0)  # (view(-1, ...) fails on a worker with no rows)
        heads, size = m.num_heads, m.head_size
        # DGL's forward stores `presorted` for its message function's typed linear maps; it only picks
        # their kernel (the compiled maps compute per row), so it is False here, and not a traced value.
        m.presorted = False
        k = m.linear_k(x, ntype).view(n, heads, size)
        q = m.linear_q(x, ntype).view(n, heads, size)
        v = m.linear_v(x, ntype).view(n, heads, size)
        edges = SimpleNamespace(src={"k": gather_src(graph, k), "v": gather_src(graph, v)},
                                dst={"q": gather_dst(graph, q)}, data={"etype": etype})
        out = m.message(edges)
        h = edge_reduce(graph, out["m"] * edge_softmax(graph, out["a"]).unsqueeze(-1), "sum").view(n, heads * size)
        h = m.drop(m.linear_a(h, ntype))
        alpha = torch.sigmoid(m.skip[ntype]).unsqueeze(-1)
        if m.in_size != heads * size:
            h = h * alpha + torch.matmul(x, m.residual_w) * (1 - alpha)
        else:
            h = h * alpha + x * (1 - alpha)
        if m.use_norm:
            h = m.norm(h)
        return h


register_lowering(SAGEConv, DGLSAGEConv)
register_lowering(GraphConv, DGLGraphConv)
register_lowering(GATConv, DGLGATConv)
register_lowering(EdgeWeightNorm, DGLEdgeWeightNorm)
register_lowering(TypedLinear, DGLTypedLinear)
register_lowering(HGTConv, DGLHGTConv)
