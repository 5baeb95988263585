"""PyTorch Geometric front-end: ``torch_geometric.nn`` layers lowered to sarcompile's IR.

A PyG model compiles unchanged: ``sc.distribute(pyg_model)``, then call it with a
:class:`~sarcompile.Graph` (one machine) or ``part.graph`` (a worker) where it takes
``edge_index``. It computes what the eager model computes with
``edge_index = torch.stack([g.src, g.dst])``, forward and backward.

Each rule below maps a PyG layer to a *stand-in*: a module with the layer's call
signature, written with IR ops, that refers to the layer's own submodules and
parameters (nothing is copied), so gradients land on the user's parameters and the
``state_dict`` keeps PyG's keys. The lower pass inlines the stand-in's traced body.

==================  =========================================================================
PyG layer           lowered to
==================  =========================================================================
``SAGEConv``        ``lin_l(spmm(g, x, aggr)) + lin_r(x)``; aggr mean/sum/max/min, ``project``,
                    ``normalize``, ``root_weight``, ``bias``
``GCNConv``         ``spmm`` over ``g.with_self_loops()`` scaled by ``deg^-1/2`` at both ends;
                    ``normalize``, ``add_self_loops``, ``improved``, ``bias``, ``edge_weight``
``GINConv``         ``nn(spmm(g, x_src, "sum") + (1 + eps) x_dst)``
``GATConv``         ``sddmm(add) [+ edge term] -> leaky_relu -> edge_softmax -> [edge_dropout]
                    -> spmm``, which the fuse pass turns into one attention op; ``residual``,
                    ``bias``, ``edge_dim`` (the edge term ``(lin_edge(edge_attr) * att_edge)
                    .sum(-1)``, self-loops' features from ``fill_value`` as PyG)
``GATv2Conv``       ``att . leaky_relu(sddmm(g, lin_l x_src, lin_r x_dst, "add") [+ lin_edge(edge_attr)])``
                    per edge and head, ``edge_softmax``, ``[edge_dropout]``, weighted ``spmm``
                    (not fused); ``edge_dim`` as for GATConv
``GraphConv``       ``lin_rel(spmm(g, x, aggr, edge_weight)) + lin_root(x)``
``BatchNorm``       the ``batch_norm`` IR op on the wrapped ``BatchNorm1d``'s parameters and
                    running statistics: statistics over the nodes of *all* workers
==================  =========================================================================

``SAGEConv``, ``GraphConv``, ``GINConv``, ``GATConv`` and ``GATv2Conv`` also take ``(x_src,
x_dst)``, as ``HeteroConv`` and ``to_hetero`` call them on a relation between two node types:
the aggregation reads the source type's rows, root and attention terms the destination
type's own (self-loops, which would join rows of two types by position, are refused).

Any other ``MessagePassing`` layer gets the general lowering (:func:`_lower_message_passing`):
its ``forward`` is traced as written, PyG's graph utilities over ``edge_index`` become IR
ops (:mod:`.utils`), and ``propagate`` becomes either the fused ``message_passing`` op
(one node tensor, sum/mean/max) or ``message`` / ``aggregate`` / ``update`` traced inline on
per-edge tensors (several node tensors, ``index`` and PyG's softmax, aggregation modules,
an overridden ``aggregate``). What cannot be lowered exactly -- PyG norms that reduce over
the nodes they see (``GraphNorm``, ``InstanceNorm``, ``PairNorm``, ...), options a rule does
not cover, code that mixes rows -- fails at compile time with a
:class:`~sarcompile.CompileError` naming the layer.

``RGCNConv``, ``FastRGCNConv``, ``RGATConv`` and ``FiLMConv(num_relations > 1)`` take the
general lowering, the edges of one relation (``edge_index[:, edge_type == i]``) being the
``edge_subset`` op (:mod:`.edge_types`).

Optional arguments (``edge_weight``, ``size``, ...) are runtime values to the traced
stand-in, so the few checks that depend on them run in the compiled program (at the
first call, which is also when the model compiles).

Attention dropout (``GATConv``/``GATv2Conv`` with ``dropout > 0`` in training) uses
sarcompile's edge-keyed masks, the same on any number of workers but not PyG's random
draws; the mask stream of each layer is seeded from torch's RNG when the layer is first
compiled (call ``torch.manual_seed`` alike on every worker), and its step counter is not
part of the model's ``state_dict``.
"""

from __future__ import annotations

import builtins
import copy
import functools
import inspect
import sys

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch_geometric import nn as gnn
from torch_geometric.nn.conv import MessagePassing

from sarcompile.errors import CompileError
from sarcompile.compile.trace import ShapeTracer
from sarcompile.compile.trace_errors import user_line
from sarcompile.nn import RandomStream, layer_stream
from sarcompile.ir.ops import batch_norm, edge_dropout, edge_reduce, edge_softmax, gather_dst, gather_src, gather_table, message_passing, sddmm, spmm
from sarcompile.ir.lowering import declare, register_lowering
from sarcompile.ir.vocab import Residency
from sarcompile.frontends.pyg.assign import assignments_settled
from sarcompile.frontends.edge_index import EdgeEnd, EdgeIndex, as_edge_index
from sarcompile.frontends.pyg.utils import add_remaining_self_loops, add_self_loops, intercepting, replace_self_loops

__all__ = ["SUPPORTED"]

# The PyG layers with a lowering rule (named in error messages).
SUPPORTED = ("SAGEConv", "GCNConv", "GINConv", "GATConv", "GATv2Conv", "GraphConv", "BatchNorm")

# The methods that define what a MessagePassing layer computes: a subclass overriding one
# of them computes something else than the rule of its base class. (PyG generates
# `propagate` and `edge_updater` for every subclass, so those do not tell.)
_DEFINING = ("forward", "message", "aggregate", "update", "message_and_aggregate", "edge_update")


def _name(m: nn.Module) -> str:
    return _name_of(type(m))


def _name_of(t: type) -> str:
    return f"torch_geometric.nn.{t.__name__}" if getattr(gnn, t.__name__, None) is t else f"{t.__module__}.{t.__qualname__}"


def _refuse(m: nn.Module, option: str, value, what_to_do: str) -> CompileError:
    return CompileError(f"{_name(m)} with {option}={value!r} is not supported yet; {what_to_do}")


def _check_common(m: nn.Module, base: type, aggrs: tuple[str, ...] | None = None) -> None:
    """Refuse what no rule covers: subclasses that change the computation (only non-
    MessagePassing ones reach here, see :func:`_unless_overridden`), hooks that would not
    run, lazily initialised parameters, other flows and aggregations."""
    if type(m) is not base:
        changed = [k for k in _DEFINING if getattr(type(m), k, None) is not getattr(base, k, None)]
        if changed:
            raise CompileError(
                f"{_name(m)} subclasses torch_geometric.nn.{base.__name__} but overrides {', '.join(changed)}, "
                "so the rule for the base class does not apply (MessagePassing subclasses get the general "
                "lowering; this one is not a MessagePassing layer): use the base class, or write the layer with "
                "sarcompile's ops (e.g. sc.nn.BatchNorm)"
            )
    hooks = [k for k, v in vars(m).items() if k.endswith("hooks") and ("forward" in k or "backward" in k) and v]
    if hooks:
        raise CompileError(
            f"{_name(m)} has hooks registered ({', '.join(sorted(hooks))}); the compiled program does not run "
            "them: remove them before sc.distribute"
        )
    for p in m.parameters():
        if isinstance(p, nn.parameter.UninitializedParameter):
            raise CompileError(
                f"{_name(m)} has lazily initialised parameters (in_channels=-1); run the eager model once on "
                "example inputs (or give in_channels) before compiling it"
            )
    if isinstance(m, MessagePassing):
        if m.flow != "source_to_target":
            raise _refuse(m, "flow", m.flow, "reverse the graph instead (sc.Graph.from_edges(dst, src, n))")
        if aggrs is not None and (not isinstance(m.aggr, str) or m.aggr not in aggrs):
            raise _refuse(m, "aggr", m.aggr, f"use one of {', '.join(map(repr, aggrs))}")


def _reduce(aggr: str) -> str:
    return {"add": "sum"}.get(aggr, aggr)


@torch.fx.wrap
def _plain_call(x, layer: str, **unsupported):
    """``x``, after checking at run time the call arguments no rule covers (their values
    are not known when the stand-in is traced)."""
    if not isinstance(x, torch.Tensor):
        raise CompileError(
            f"{layer} got node features of type {type(x).__name__}; sarcompile supports one feature tensor "
            "(bipartite (x_src, x_dst) inputs are not supported yet)"
        )
    given = [k for k, v in unsupported.items() if v is not None]
    if given:
        raise CompileError(f"{layer} was called with {', '.join(given)}, which is not supported yet; leave it out")
    return x


def _ends(x, layer: str) -> tuple:
    """``(x_src, x_dst)``: a bipartite layer's two inputs (a relation between two node
    types, as ``HeteroConv`` and ``to_hetero`` call it), or one tensor for both ends."""
    if not isinstance(x, tuple):
        return x, x
    if len(x) != 2 or x[1] is None:
        raise CompileError(
            f"{layer} got {'(x_src, None)' if len(x) == 2 else f'a tuple of {len(x)}'} as node features; sarcompile "
            "takes one tensor, or (x_src, x_dst) with the destination type's rows too (every destination row is "
            "computed on its own worker, from its own features)"
        )
    return x


@torch.fx.wrap
def _one_node_set(value, graph, size, layer: str):
    """``value``, after checking at run time that ``size`` (PyG's ``(sources,
    destinations)``) is None or the graph's own nodes on both sides, as a layer that
    passes ``size=(x.size(0), x.size(0))`` gives it: then it changes nothing."""
    if size is not None and tuple(size) != (graph.num_nodes, graph.num_nodes):
        raise CompileError(
            f"{layer} was called with size={tuple(size)!r} on a graph of {graph.num_nodes} nodes; sarcompile "
            "supports one node set (size None, or the number of nodes twice): leave size out"
        )
    return value


# -- a sparse adjacency's values (PyG's normalised adj_t) -------------------------------------
# The layers whose rule reads a sparse adjacency's values as PyG reads a torch.sparse adj_t.
ADJACENCY_LAYERS = ("GCNConv", "SAGEConv", "GINConv", "GraphConv", "GATConv", "GATv2Conv")


@torch.fx.wrap
def adjacency_values(graph, like: torch.Tensor) -> torch.Tensor:
    """The values of the sparse adjacency ``graph`` was made from (``adj_values``), one per
    edge in its edge order (a worker's shard: in shard order), on ``like``'s device."""
    values = graph.adj_values
    if values is None:
        raise CompileError(
            "the model was compiled for a sparse adjacency with values (adj_t) and called with a graph without "
            "them; on a worker give the shard of that adjacency's graph (sc.Graph.from_adjacency(adj_t), "
            "partitioned: part.graph carries the values)"
        )
    return values.to(like.device)


def _has_values(graph) -> bool:
    """Whether ``graph`` is a sparse adjacency's with values (``adj_values``): asked of the
    graph itself when a stand-in runs on an example, else of its example values (a graph
    input with values has probes with values, see :func:`~sarcompile.ir.probe.example`)."""
    if not isinstance(graph, torch.fx.Proxy):
        return getattr(graph, "adj_values", None) is not None
    tracer = graph.tracer
    examples = tracer.value(graph.node) if isinstance(tracer, ShapeTracer) else None
    return bool(examples) and getattr(examples[0], "adj_values", None) is not None


def _values(graph, like):
    """The adjacency values of ``graph`` (see :func:`adjacency_values`) where it has them, else None."""
    return adjacency_values(graph, like) if _has_values(graph) else None


def _aggregate_weighted(graph, x, reduce: str, weight):
    """``torch.sparse.mm(adj_t, x, reduce)`` (PyG's ``spmm``) on an adjacency of values
    ``weight`` (None: ones): ``reduce`` over the in-edges of ``weight * x[src]``; max and
    min as per-edge rows reduced (spmm takes weights with sum and mean only)."""
    if weight is None or reduce in ("sum", "mean"):
        return spmm(graph, x, reduce, edge_weight=weight)
    return edge_reduce(graph, gather_src(graph, x) * weight.unsqueeze(-1), reduce)


def _no_adjacency_values(layer: str, graph) -> None:
    """Refuse a sparse adjacency with values or self-loops where ``layer``'s rule does not
    read them as PyG does (the general lowering traces the layer's edge_index path)."""
    if _has_values(graph):
        raise CompileError(
            f"{layer} was given a sparse adjacency with values other than 1 or with self-loops (a normalised "
            f"adj_t); PyG reads such a matrix otherwise than the same edges as edge_index, and sarcompile reads it "
            f"as PyG does in {', '.join(ADJACENCY_LAYERS)} only. Give {layer} the graph of edges "
            "(sc.Graph.from_edges(src, dst, n), or the adjacency of ones without self-loops) and the values as "
            "its edge_weight where it takes one"
        )


class _StandIn(nn.Module):
    """A PyG layer written with IR ops. ``self.layer`` is the PyG layer itself: every
    parameter is read from it, never copied."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def extra_repr(self) -> str:
        return f"lowered {_name(self.layer)}"


# ---------------------------------------------------------------------------- SAGEConv
class _SAGEConv(_StandIn):
    def forward(self, x, edge_index, size=None):
        m = self.layer
        x_src, x_dst = _ends(x, "SAGEConv")
        x_src = _plain_call(x_src, "SAGEConv", size=size)
        src = m.lin(x_src).relu() if m.project else x_src
        out = m.lin_l(_aggregate_weighted(edge_index, src, _reduce(m.aggr), _values(edge_index, src)))
        if m.root_weight:
            out = out + m.lin_r(x_dst)
        if m.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out


def _lower_sage(m: gnn.SAGEConv) -> nn.Module:
    _check_common(m, gnn.SAGEConv, ("mean", "add", "sum", "max", "min"))
    return _SAGEConv(m)


# ----------------------------------------------------------------------------- GCNConv
@torch.fx.wrap
def _gcn_inv_sqrt_degree(graph, edge_weight, like: torch.Tensor) -> torch.Tensor:
    """``deg^-1/2`` per node as a column (0 where the degree is 0), the degree being the
    sum of the in-edge weights (the in-edge count without weights). Local: every in-edge
    of a node lives on its worker."""
    if edge_weight is None:
        deg = graph.in_degrees().to(like.dtype)
    else:
        deg = torch.zeros(graph.num_dst, dtype=edge_weight.dtype).index_add(0, graph.dst_index, edge_weight)
    inv = deg.pow(-0.5)
    return inv.masked_fill(inv == float("inf"), 0.0).unsqueeze(-1)


class _GCNConv(_StandIn):
    def forward(self, x, edge_index, edge_weight=None):
        m = self.layer
        h = m.lin(_plain_call(x, "GCNConv"))
        values = _values(edge_index, h)
        if values is not None:  # a sparse adjacency: PyG reads its values and ignores edge_weight
            edge_weight = values
        if m.normalize:
            g, w = edge_index, edge_weight
            fill = 2.0 if m.improved else 1.0
            if m.add_self_loops and values is not None:  # PyG's add_self_loops: a second loop where one is
                g, w = add_self_loops(as_edge_index(edge_index), w, fill)
            elif m.add_self_loops:  # PyG's add_remaining_self_loops, edge weights carried
                g, w = add_remaining_self_loops(as_edge_index(edge_index), edge_weight, fill)
            # Scale at the source before the aggregation and at the destination after:
            # each node's own degree is all a worker needs.
            norm = _gcn_inv_sqrt_degree(g, w, h)
            out = spmm(g, h * norm, "sum", edge_weight=w) * norm
        else:
            out = spmm(edge_index, h, "sum", edge_weight=edge_weight)
        if m.bias is not None:
            out = out + m.bias
        return out


def _lower_gcn(m: gnn.GCNConv) -> nn.Module:
    _check_common(m, gnn.GCNConv, ("add", "sum"))
    # cached=True: PyG keeps the first call's normalisation for every later call, the same
    # numbers on the one graph of full-batch training; here each call normalises the graph
    # it is given, so a model also called on another graph gets that graph's.
    return _GCNConv(m)


# ----------------------------------------------------------------------------- GINConv
class _GINConv(_StandIn):
    def forward(self, x, edge_index, size=None):
        m = self.layer
        x_src, x_dst = _ends(x, "GINConv")
        x_src = _plain_call(x_src, "GINConv", size=size)
        agg = spmm(edge_index, x_src, "sum", edge_weight=_values(edge_index, x_src))
        return m.nn(agg + (1 + m.eps) * x_dst)


def _lower_gin(m: gnn.GINConv) -> nn.Module:
    _check_common(m, gnn.GINConv, ("add", "sum"))
    return _GINConv(m)


# ----------------------------------------------------------------------------- GraphConv
@torch.fx.wrap
def _no_weight_for(reduce: str, x, edge_weight):
    if edge_weight is not None:
        raise CompileError(
            f"GraphConv(aggr={reduce!r}) with edge_weight is not supported yet; use aggr 'add' or 'mean', or scale "
            "the features before the layer"
        )
    return x


class _GraphConv(_StandIn):
    def forward(self, x, edge_index, edge_weight=None, size=None):
        m = self.layer
        x_src, x_dst = _ends(x, "GraphConv")
        x_src = _plain_call(x_src, "GraphConv", size=size)
        reduce = _reduce(m.aggr)
        values = _values(edge_index, x_src)
        if values is not None:  # a sparse adjacency: PyG reads its values and ignores edge_weight
            agg = _aggregate_weighted(edge_index, x_src, reduce, values)
        elif reduce in ("max", "min"):
            agg = spmm(edge_index, _no_weight_for(reduce, x_src, edge_weight), reduce)
        else:
            agg = spmm(edge_index, x_src, reduce, edge_weight=edge_weight)
        return m.lin_rel(agg) + m.lin_root(x_dst)


def _lower_graph_conv(m: gnn.GraphConv) -> nn.Module:
    _check_common(m, gnn.GraphConv, ("add", "sum", "mean", "max", "min"))
    return _GraphConv(m)


# ----------------------------------------------------------------------------- attention
def _stream(m: nn.Module) -> RandomStream | None:
    """The layer's attention dropout stream (see :data:`sarcompile.nn.LAYER_STREAMS`)."""
    return layer_stream(m) if m.dropout > 0 else None


@torch.fx.wrap
def _edge_features(edge_attr, layer: str, edge_dim: int):
    """``edge_attr`` as rows ``[E, F]`` (PyG views ``[E]`` as ``[E, 1]``), after checking at
    run time that the call gave it."""
    if edge_attr is None:
        raise CompileError(
            f"{layer}(edge_dim={edge_dim}) was called without edge_attr; PyG then leaves the edge term out, which "
            "is not supported yet: pass edge_attr, or build the layer without edge_dim"
        )
    return edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr


# The reductions a self-loop's edge features may be filled with: every in-edge of a node
# is on its worker, and each of these gives the same whatever the order of the edges.
_FILLS = ("mean", "add", "sum", "max", "min", "amax", "amin", "mul")


def _check_attention(m: nn.Module, base: type) -> None:
    _check_common(m, base, ("add", "sum"))
    if not 0.0 <= m.dropout < 1.0:
        raise _refuse(m, "dropout", m.dropout, "use a probability in [0, 1)")
    if m.edge_dim is not None and m.add_self_loops and isinstance(m.fill_value, str) and m.fill_value not in _FILLS:
        # ('any' keeps whichever in-edge's features are written last: not the same on N workers)
        raise _refuse(m, "fill_value", m.fill_value, f"use a float, a tensor or one of {', '.join(map(repr, _FILLS))}")


class _Attention(_StandIn):
    def __init__(self, layer: nn.Module):
        super().__init__(layer)
        self.stream = _stream(layer)

    def _edge_messages(self, edge_index, g, edge_attr):
        """``lin_edge(edge_attr)`` per edge of ``g`` as ``[E, H, C]``, the new self-loops'
        edge features filled in as PyG fills them."""
        m = self.layer
        e = _edge_features(edge_attr, type(m).__name__, m.edge_dim)
        if m.add_self_loops:
            e = replace_self_loops(edge_index, g, e, m.fill_value)  # PyG: remove, then add with fill_value
        return m.lin_edge(e).view(-1, m.heads, m.out_channels)

    def _aggregate(self, g, score, h, x_dst):
        """Softmax of ``score`` [E, H] over in-edges, [dropout], weighted sum of ``h``
        [n, H, C]; then concat or mean of the heads, residual and bias as PyG."""
        m = self.layer
        weight = edge_softmax(g, score)
        if m.training and m.dropout > 0:
            weight = edge_dropout(g, weight, m.dropout, self.stream())
        out = spmm(g, h, "sum", edge_weight=weight)
        out = out.reshape(-1, m.heads * m.out_channels) if m.concat else out.mean(dim=1)
        if m.res is not None:
            out = out + m.res(x_dst)
        if m.bias is not None:
            out = out + m.bias
        return out


def _no_loops_across(m: nn.Module, x) -> None:
    """Refuse self-loops on a relation between two node types: PyG would join source row i
    to destination row i, by position."""
    if isinstance(x, tuple) and m.add_self_loops:
        name = type(m).__name__
        raise CompileError(
            f"{name}(add_self_loops=True) got (x_src, x_dst): a relation between two node types has no node "
            "joined to itself; build the layer with add_self_loops=False (to_hetero and PyG ask the same)"
        )


class _GATConv(_Attention):
    def forward(self, x, edge_index, edge_attr=None, size=None, return_attention_weights=None):
        m = self.layer
        # Without edge_dim PyG ignores edge_attr: so does this.
        x_src, x_dst = _ends(x, "GATConv")
        _no_loops_across(m, x)
        x_src = _plain_call(x_src, "GATConv", size=size, return_attention_weights=return_attention_weights)
        H, C = m.heads, m.out_channels
        lin_src, lin_dst = (m.lin, m.lin) if m.lin is not None else (m.lin_src, m.lin_dst)
        h = lin_src(x_src).view(-1, H, C)
        h_dst = h if not isinstance(x, tuple) and lin_dst is lin_src else lin_dst(x_dst).view(-1, H, C)
        a_src = (h * m.att_src).sum(dim=-1)
        a_dst = (h_dst * m.att_dst).sum(dim=-1)
        g = edge_index.with_self_loops() if m.add_self_loops else edge_index
        # The chain the fuse pass turns into one attention op (no per-edge tensor kept
        # beyond the edge term, an input of the op).
        score = sddmm(g, a_src, a_dst, "add")
        if m.lin_edge is not None:
            score = score + (self._edge_messages(edge_index, g, edge_attr) * m.att_edge).sum(dim=-1)
        return self._aggregate(g, F.leaky_relu(score, m.negative_slope), h, x_dst)


class _GATv2Conv(_Attention):
    def forward(self, x, edge_index, edge_attr=None, return_attention_weights=None):
        m = self.layer
        # Without edge_dim PyG fails on an edge_attr (an assert): refused.
        unused = edge_attr if m.lin_edge is None else None
        x_src, x_dst = _ends(x, "GATv2Conv")
        _no_loops_across(m, x)
        x_src = _plain_call(
            x_src, "GATv2Conv (without edge_dim)" if unused is not None else "GATv2Conv", edge_attr=unused,
            return_attention_weights=return_attention_weights,
        )
        x_l = m.lin_l(x_src).view(-1, m.heads, m.out_channels)
        if isinstance(x, tuple):  # (lin_r is lin_l with share_weights)
            x_r = m.lin_r(x_dst).view(-1, m.heads, m.out_channels)
        else:
            x_r = x_l if m.share_weights else m.lin_r(x_src).view(-1, m.heads, m.out_channels)
        g = edge_index.with_self_loops() if m.add_self_loops else edge_index
        # Per edge u->v and head: att . leaky_relu(x_l[u] + x_r[v] [+ lin_edge(e)]), an [E, H, C] tensor.
        pre = sddmm(g, x_l, x_r, "add")
        if m.lin_edge is not None:
            pre = pre + self._edge_messages(edge_index, g, edge_attr)
        score = (F.leaky_relu(pre, m.negative_slope) * m.att).sum(dim=-1)
        return self._aggregate(g, score, x_l, x_dst)


def _lower_gat(m: gnn.GATConv) -> nn.Module:
    _check_attention(m, gnn.GATConv)
    return _GATConv(m)


def _lower_gatv2(m: gnn.GATv2Conv) -> nn.Module:
    _check_attention(m, gnn.GATv2Conv)
    return _GATv2Conv(m)


# ----------------------------------------------------------------------------- BatchNorm
class _BatchNorm(_StandIn):
    def forward(self, x):
        bn = self.layer.module  # the torch.nn.BatchNorm1d PyG's BatchNorm wraps
        return batch_norm(
            x,
            bn.weight,
            bn.bias,
            bn.running_mean,
            bn.running_var,
            bn.num_batches_tracked,
            bn.training or not bn.track_running_stats,
            bn.momentum,
            bn.eps,
        )


def _lower_batch_norm(m: gnn.BatchNorm) -> nn.Module:
    _check_common(m, gnn.BatchNorm)
    if m.allow_single_element:
        raise _refuse(m, "allow_single_element", True, "use allow_single_element=False")
    return _BatchNorm(m)


# --------------------------------------------------------------- any other MessagePassing
class _Message(nn.Module):
    """A MessagePassing layer's ``message`` as ``fn(x_j, x_i, edge)`` for the
    ``message_passing`` IR op: maps the per-edge rows to ``message``'s own argument names.
    The layer is a submodule, so its parameters get their gradients through the op."""

    def __init__(self, layer: MessagePassing, node: str, edge: str | None, names: list[str]):
        super().__init__()
        self.layer = layer
        self.node, self.edge, self.names = node, edge, names

    def forward(self, x_j, x_i, edge):
        given = {f"{self.node}_j": x_j, f"{self.node}_i": x_i, self.edge: edge}
        return self.layer.message(**{k: given[k] for k in self.names})


# Message arguments that PyG fills in from the graph rather than from propagate's kwargs.
_GRAPH_ARGS = ("index", "ptr", "size_i", "size_j", "dim_size", "size", "edge_index_i", "edge_index_j", "edge_index")


def _fused_signature(m: MessagePassing, names: list[str]) -> tuple[str, str | None] | None:
    """(node tensor name, edge tensor name or None) where ``message`` fits the fused
    ``message_passing`` op -- one node tensor as ``<name>_j`` / ``<name>_i``, at most one
    edge tensor, nothing from the graph, PyG's own aggregate with a sum, mean or max --
    else None."""
    nodes = {k[:-2] for k in names if k.endswith(("_i", "_j"))}
    edges = [k for k in names if not k.endswith(("_i", "_j"))]
    aggr = m.aggr if isinstance(m.aggr, str) else None
    overridden = type(m).aggregate is not MessagePassing.aggregate
    if len(nodes) != 1 or len(edges) > 1 or set(edges) & set(_GRAPH_ARGS) or overridden:
        return None
    if aggr not in ("add", "sum", "mean", "max"):
        return None
    return nodes.pop(), (edges[0] if edges else None)


def _collect(names: list[str], graph: EdgeIndex, kwargs: dict) -> dict:
    """What PyG's ``_collect`` hands ``message`` / ``aggregate`` / ``edge_update``, as IR
    values: ``x_j`` and ``x_i`` gathered onto the edges (``x`` may be a pair (source,
    destination) of node tensors), ``index`` / ``edge_index_i`` / ``edge_index_j`` as
    edge-end markers, sizes and ``ptr`` as None, anything else as given (edge tensors)."""
    out = {}
    for name in names:
        if name in ("index", "edge_index_i"):
            out[name] = EdgeEnd(graph, "dst")  # (not graph[1]: the graph is a real one when run on examples)
        elif name == "edge_index_j":
            out[name] = EdgeEnd(graph, "src")
        elif name == "edge_index":
            out[name] = graph
        elif name in _GRAPH_ARGS:
            out[name] = None
        elif name.endswith(("_i", "_j")) and name[:-2] in kwargs:
            value = kwargs[name[:-2]]
            if isinstance(value, (tuple, list)):
                value = value[0] if name.endswith("_j") else value[1]
            if _is_parameter(value):  # a row per node of the whole graph, on every worker (LINKX)
                value = gather_table(graph, value, "src" if name.endswith("_j") else "dst")
            elif value is not None:
                value = gather_src(graph, value) if name.endswith("_j") else gather_dst(graph, value)
            out[name] = value
        else:
            out[name] = kwargs.get(name)
    return out


def _is_parameter(value) -> bool:
    return isinstance(value, torch.fx.Proxy) and value.node.op == "get_attr"


def _arguments(fn) -> list[str]:
    return [k for k, p in inspect.signature(fn).parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _lower_message_passing(m: MessagePassing) -> nn.Module:
    """Any other MessagePassing layer: its ``forward`` traced as written, with PyG's graph
    utilities as IR ops (:mod:`.utils`) and ``propagate`` as one of two lowerings:

    * a message of one node tensor and at most one edge tensor, aggregated by sum, mean or
      max: the fused ``message_passing`` op around the layer's own ``message``
      (recomputed per block in backward, no per-edge tensor kept);
    * anything else: ``message``, ``aggregate`` (its aggregation module or an overridden
      ``aggregate``) and ``edge_update`` traced inline on per-edge tensors -- node tensors
      gathered onto the edges (``gather_src`` / ``gather_dst``), PyG's ``scatter`` and
      ``softmax`` over ``index`` lowered to ``edge_reduce`` / ``edge_softmax``. Exact, as
      every in-edge of a node lives on its worker; it keeps per-edge tensors as PyG does.

    Then the layer's ``update``."""
    # (message_and_aggregate only runs for SparseTensor adjacencies, never here.)
    _check_common(m, type(m))
    if isinstance(m, gnn.ARMAConv):
        raise CompileError(
            f"{_name(m)} is not supported yet: it keeps its {m.num_stacks} stacks as one [stacks, nodes, channels] "
            "tensor and aggregates over axis node_dim=-2, while sarcompile keeps the node axis first (axis 0) so "
            "that each worker's rows are its own nodes; stack GCN-normalised layers (e.g. torch_geometric.nn.SGConv "
            "with K=1) per stack instead"
        )
    if getattr(m, "decomposed_layers", 1) != 1:
        raise _refuse(m, "decomposed_layers", m.decomposed_layers, "use decomposed_layers=1")
    view = copy.copy(m)  # shares parameters and submodules; gets its own submodule table below
    view._modules = dict(m._modules)
    names = _arguments(m.message)
    fused = _fused_signature(m, names)
    update_args = _arguments(m.update)[1:]
    layer = type(m).__name__
    if fused is not None:
        view._sc_message = _Message(m, *fused, names)
        reduce = _reduce(m.aggr)

    def propagate(edge_index, size=None, **kwargs):
        if _GRAD_AT_ENTRY and _GRAD_AT_ENTRY[-1] and not torch.is_grad_enabled():
            raise CompileError(
                f"{_name(m)} propagates under torch.no_grad() (its forward, or part of it, is decorated or wrapped "
                "so): a traced program does not keep grad modes, so it would give gradients where PyG gives none; "
                "not supported yet: call the model under torch.no_grad(), or detach what goes into the layer"
            )
        graph = as_edge_index(edge_index)
        x = kwargs.get(fused[0]) if fused is not None else None
        if isinstance(x, (tuple, list)) and len(x) == 2 and x[0] is x[1]:
            x = x[0]  # PyG's idiom for a plain graph: x = (x, x)
        if fused is not None and not isinstance(x, (tuple, list)) and not _is_parameter(x):
            x = _plain_call(_one_node_set(x, graph, size, layer), layer)
            out = message_passing(graph, view._sc_message, x, kwargs.get(fused[1]) if fused[1] else None, reduce)
        else:  # (a pair of different node tensors, e.g. GMMConv's (x @ g, x), goes this way too)
            # The view's methods: what they store on self (RGATConv's _alpha) is the view's,
            # where its forward reads it, and never reaches the user's layer.
            msg = view.message(**_collect(names, graph, kwargs))
            if size is not None:
                msg = _one_node_set(msg, graph, size, layer)
            aggregate_args = _collect(_arguments(m.aggregate)[1:], graph, kwargs)
            out = view.aggregate(msg, **aggregate_args)
        return view.update(out, **{k: kwargs[k] for k in update_args})

    def edge_updater(edge_index, size=None, **kwargs):
        graph = as_edge_index(edge_index)
        return view.edge_update(**_collect(_arguments(m.edge_update), graph, kwargs))

    object.__setattr__(view, "propagate", propagate)
    object.__setattr__(view, "edge_updater", edge_updater)
    view.__class__ = _tracing_type(type(m))
    return view


_real_isinstance = builtins.isinstance
# Whether grad was enabled when each layer being traced was called (innermost last): a
# propagate that finds it off was put under torch.no_grad() by the layer itself.
_GRAD_AT_ENTRY: list[bool] = []


def _isinstance_seeing_proxies_as_tensors(obj, cls) -> bool:
    """``isinstance``, except that outside torch's own code an fx Proxy counts as a Tensor."""
    if _real_isinstance(obj, torch.fx.Proxy) and (
        cls is torch.Tensor or (_real_isinstance(cls, tuple) and torch.Tensor in cls)
    ):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller != "torch" and not caller.startswith("torch."):  # fx itself must see a Proxy
            return True
    return _real_isinstance(obj, cls)


def _tracing_type(cls: type) -> type:
    """A subclass of ``cls`` whose forward, while it is traced, sees the features as the
    tensors they stand for. Layers start with ``if isinstance(x, Tensor): x = (x, x)``;
    under fx the features are a Proxy, the branch would be skipped and a later ``x[1]``
    would silently take row 1 instead of x. So for the duration of the trace,
    ``isinstance(proxy, Tensor)`` is True in code that is not torch's (fx's own checks are
    unchanged). Errors of the layer's code become a CompileError naming it and the line."""
    original = cls.forward
    layer_name = _name_of(cls)
    signature = inspect.signature(original)

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        if "edge_index" in bound.arguments:  # the traced graph, answering what PyG asks of edge_index
            _no_adjacency_values(layer_name, bound.arguments["edge_index"])
            bound.arguments["edge_index"] = as_edge_index(bound.arguments["edge_index"])
        builtins.isinstance = _isinstance_seeing_proxies_as_tensors
        _GRAD_AT_ENTRY.append(torch.is_grad_enabled())
        try:
            with intercepting():
                return assignments_settled(lambda: original(*bound.args, **bound.kwargs))
        except CompileError:
            raise
        except Exception as e:  # whatever the layer's own code raised: say which layer and where
            raise CompileError(
                f"{layer_name} could not be lowered: its forward failed while traced with symbolic tensors and "
                f"a graph in place of edge_index ({type(e).__name__}: {e}{user_line(e)}). Layers that compute with "
                "edge_index in ways sarcompile does not lower, or branch on tensor values, are not supported yet"
            ) from None
        finally:
            builtins.isinstance = _real_isinstance
            _GRAD_AT_ENTRY.pop()

    return type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__})


def _node_reducing(m: nn.Module) -> nn.Module | None:
    if isinstance(m, gnn.LayerNorm) and m.mode == "node":
        return None  # per node: traced through as it is
    raise CompileError(
        f"{_name(m)} normalises over the nodes it sees, which on a worker are only its own, so N workers would "
        "not match one machine; it is not supported yet. Use torch_geometric.nn.BatchNorm (statistics across all "
        "workers) or a per-node norm (torch.nn.LayerNorm, torch_geometric.nn.LayerNorm(mode='node'))"
    )


def _unless_overridden(rule, base: type):
    """``rule`` for ``base`` itself; a subclass that overrides what ``base`` computes with
    (``forward``, ``message``, ...), or a layer aggregating with a list of aggregations or
    an aggregation module, gets the general MessagePassing lowering instead."""

    def lower(m: nn.Module) -> nn.Module:
        if type(m) is not base and any(getattr(type(m), k, None) is not getattr(base, k, None) for k in _DEFINING):
            return _lower_message_passing(m)
        if not isinstance(getattr(m, "aggr", ""), str):  # a list of aggregations, or a module
            return _lower_message_passing(m)
        return rule(m)

    return lower


for _layer, _rule in (
    (gnn.SAGEConv, _lower_sage),
    (gnn.GCNConv, _lower_gcn),
    (gnn.GINConv, _lower_gin),
    (gnn.GraphConv, _lower_graph_conv),
    (gnn.GATConv, _lower_gat),
    (gnn.GATv2Conv, _lower_gatv2),
    (gnn.BatchNorm, _lower_batch_norm),
    (MessagePassing, _lower_message_passing),
):
    overridable = issubclass(_layer, MessagePassing) and _layer is not MessagePassing
    register_lowering(_layer, _unless_overridden(_rule, _layer) if overridable else _rule)
# The run-time helpers above are row-local (the residency pass cannot look inside them).
declare(_plain_call, "x")
declare(_one_node_set, "value")
declare(_no_weight_for, "x")
declare(_edge_features, "edge_attr")
declare(_gcn_inv_sqrt_degree, Residency.NODE)
declare(adjacency_values, Residency.EDGE)
for _name_ in ("InstanceNorm", "GraphNorm", "PairNorm", "MeanSubtractionNorm", "DiffGroupNorm", "GraphSizeNorm",
               "HeteroBatchNorm", "LayerNorm"):
    if hasattr(gnn, _name_):
        register_lowering(getattr(gnn, _name_), _node_reducing)
