"""PyG's graph utilities as IR ops, while a PyG layer is traced.

PyG layers compute with ``edge_index`` itself: ``index`` (``edge_index[1]``) goes into
``scatter``, ``softmax`` and ``degree``; ``gcn_norm`` and the self-loop helpers rebuild
the edge list. Under sarcompile the graph is a :class:`~sarcompile.Graph` or a worker's
shard, so those calls cannot run as written. While a layer is traced
(:func:`intercepting`), every ``torch_geometric`` module sees, in place of each such
function, a dispatcher that turns a call on the traced graph into IR ops and leaves any
other call to PyG. The rules are registered with :func:`handles`, one per PyG function.

The graph a layer gets is an :class:`~.edge_index.EdgeIndex` proxy whose ``edge_index[0]``
and ``edge_index[1]`` are :class:`~.edge_index.EdgeEnd` markers (:mod:`.edge_index`, shared
with plain torch's rules in :mod:`.plain`); the rules here give them a meaning as the
arguments of PyG's functions, and PyG's aggregation modules aggregate over them, in a
layer and in a model's own forward alike.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import weakref
from typing import Any, Callable, Iterator

import torch
import torch.fx
from torch import nn
from torch_geometric import utils as pyg_utils
from torch_geometric.nn.aggr import Aggregation, MultiAggregation
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from sarcompile.errors import CompileError
from sarcompile.graph.graph import Graph
from sarcompile.ir.lowering import declare, register_function_lowering, register_trace_context
from sarcompile.ir.ops import edge_max, edge_reduce, edge_reduce_src, edge_softmax, edge_subset, gather_dst, gather_src
from sarcompile.ir.vocab import Residency
from sarcompile.dist.collectives import global_max
from sarcompile.compile.source_lines import where_line
from sarcompile.compile.assignments import assign
from sarcompile.frontends.edge_index import (EdgeEnd, EdgeIndex, LoopMask, _edge_axis, _graph_argument, _in_degree, _loop_mask, _LoopRows,
                         _ones_per_edge, _patched, as_edge_index, in_forward)
from sarcompile.frontends.pyg.assign import assign_where

__all__ = ["handles", "aggregating", "intercepting", "add_remaining_self_loops", "add_self_loops",
           "replace_self_loops"]

for _helper in (_edge_axis, _in_degree, _ones_per_edge, _loop_mask):  # edge_index's run-time helpers, one node each here too
    torch.fx.wrap(_helper.__name__)

_UPDATES = {"set": None, "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}


# -- the dispatch ------------------------------------------------------------------------------
def handles(original: Callable) -> Callable[[Callable], Callable]:
    """Register ``rule(original, *args, **kwargs)`` for the PyG function ``original``: it
    returns the IR-op result for a call on the traced graph, or calls ``original``. The
    tracer puts it in place of ``original`` in every ``torch_geometric`` module and in the
    traced layer's own (:func:`sarcompile.ir.lowering.register_function_lowering`)."""

    def register(rule: Callable) -> Callable:
        @functools.wraps(original)
        def dispatch(*args: Any, **kwargs: Any) -> Any:
            return rule(original, *args, **kwargs)

        register_function_lowering(original, dispatch, homes=("torch_geometric",))
        return rule

    return register


@contextlib.contextmanager
def aggregating() -> Iterator[None]:
    """For the duration (any trace, see :func:`sarcompile.ir.lowering.register_trace_context`):
    PyG's aggregation modules aggregate over an :class:`EdgeEnd` (``aggr(x_j, dst)`` in a
    model's own forward too)."""
    with _patched(Aggregation, {"__call__": _aggregation_call}):
        yield


@contextlib.contextmanager
def intercepting() -> Iterator[None]:
    """For the duration (a PyG layer's trace): :func:`~.edge_index.in_forward` and
    :func:`aggregating`, and fx proxies can be updated on a :class:`LoopMask` and assigned
    into by a bool mask (:mod:`.assign`). Restored afterwards. (The PyG functions with
    a rule are swapped by the tracer itself, see :func:`handles`.)"""
    # (the tracer's own proxies defer to Proxy.__setitem__ where there is one)
    with in_forward(), aggregating(), _patched(torch.fx.Proxy, {"__setitem__": _proxy_setitem}):
        yield


_aggregation_call_of_pyg = Aggregation.__call__


def _aggregation_call(self: Aggregation, x: Any, index: Any = None, ptr: Any = None, dim_size: Any = None,
                      dim: int = -2, **kwargs: Any) -> Any:
    if not isinstance(index, EdgeEnd):
        return _aggregation_call_of_pyg(self, x, index, ptr, dim_size, dim, **kwargs)
    if isinstance(self, MultiAggregation):
        # Its fused path indexes with `index` itself; the plain path computes the same.
        return self.combine([aggr(x, index, dim_size=dim_size, dim=dim) for aggr in self.aggrs])
    # PyG's __call__ checks index.max() against dim_size; an EdgeEnd is right by construction.
    return nn.Module.__call__(self, x, index, ptr=None, dim_size=dim_size, dim=dim, **kwargs)


def _proxy_setitem(self: torch.fx.Proxy, i: Any, value: Any) -> None:
    if isinstance(i, LoopMask):
        _update_on_loops(self, i, value)
    elif isinstance(i, torch.fx.Proxy) and not isinstance(i, EdgeIndex):
        assign_where(self, i, value)
    elif isinstance(i, EdgeEnd):
        raise i.refusal()
    elif getattr(self.tracer, "examples", None) is not None:  # the tracer's own (h[:, 0] = v) where it has examples
        assign(self, i, value)
    else:
        raise CompileError(
            f"assigning into a tensor at {i!r} (`t[...] = value`) is not supported inside a PyG layer{where_line()}: "
            "sarcompile rewrites only t[mask] = value with a bool mask of t's rows; build the tensor without "
            "assigning into it (torch.where(mask, value, t), torch.cat, scatter)"
        )


def _update_on_loops(self: torch.fx.Proxy, i: LoopMask, value: Any) -> None:
    """``e[mask] = value`` / ``e[mask] op= value`` for a :class:`LoopMask`."""
    op, v = "set", value
    if isinstance(value, _LoopRows):
        if value.e is not self or value.mask is not i:
            raise value.refusal()
        if value.op is None:
            return  # e[mask] = e[mask]
        op, v = value.op, value.value
    per_node = isinstance(v, torch.fx.Proxy)
    if per_node and not (i.loops and i.graph.loops == "one"):
        raise CompileError(
            "e[edge_index[0] == edge_index[1]] updated with a tensor is supported where the graph has exactly one "
            "self-loop per node (after add_self_loops on a graph without loops, or add_remaining_self_loops), "
            "whose rows are then the nodes' rows; update it with a number, or use torch.where"
        )
    _update_loops_(i.graph, self, i.loops, op, v, per_node)


# -- run-time helpers (one node each in the program) -------------------------------------------
_SEEN: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()


@torch.fx.wrap
def _seen_nodes(graph: Any) -> int:
    """PyG's ``maybe_num_nodes(edge_index)``: one more than the largest node id of any edge
    (so PyG adds no loop to the isolated nodes after it). On a worker, the largest over
    every worker's edges: one all-reduce, the first time the graph is asked (cached)."""
    if graph not in _SEEN:
        if isinstance(graph, Graph):
            _SEEN[graph] = int(torch.cat([graph.src, graph.dst]).max()) + 1 if graph.num_edges else 0
        else:
            ends = [graph.global_ids[graph.dst_index]] + [b.src_gids[b.col] for b in graph.blocks]
            local = torch.cat(ends).max() if graph.num_edges else torch.tensor(-1)
            _SEEN[graph] = int(global_max(local.reshape(1))) + 1
    return _SEEN[graph]


@torch.fx.wrap
def _update_loops_(graph: Any, e: torch.Tensor, loops: bool, op: str, value: Any, per_node: bool) -> torch.Tensor:
    """``e[mask] op= value`` in place, ``mask`` being :func:`_loop_mask`; a ``per_node``
    value has one row per node, which on a graph with one self-loop per node is the row of
    that node's loop (as in PyG, whose loops are appended in node order)."""
    mask = _loop_mask(graph, loops)
    if per_node:
        value = value[graph.dst_index[mask]]
    e[mask] = value if _UPDATES[op] is None else _UPDATES[op](e[mask], value)
    return e


@torch.fx.wrap
def _fill_loops(graph: Any, e: torch.Tensor, fill: Any) -> torch.Tensor:
    """PyG's ``compute_loop_attr`` for a ``fill_value`` that is None (ones), a number or a
    tensor: the value of every node's new self-loop, one row per node."""
    size = (graph.num_dst, *e.shape[1:])
    if fill is None:
        return e.new_ones(size)
    if isinstance(fill, (int, float)):
        return e.new_full(size, fill)
    loop = fill.to(e.device, e.dtype)
    if e.dim() != loop.dim():
        loop = loop.unsqueeze(0)
    return loop.expand(size).contiguous()


@torch.fx.wrap
def _remaining_loops(graph: Any, e: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """The value of each node's one self-loop under PyG's ``add_remaining_self_loops``:
    its last existing self-loop's (by edge id, PyG's edge order), else ``fill``'s row.
    Local: a node's self-loops are in-edges of it."""
    loops, dst, ids = graph.loop_mask, graph.dst_index, graph.edge_ids.long()  # (a shard's may be int32)
    last = torch.full((graph.num_dst,), -1, dtype=torch.long).scatter_reduce(0, dst[loops], ids[loops], "amax")
    chosen = loops & (ids == last[dst])
    out = fill.index_put((dst[chosen],), e[chosen].detach())
    # PyG writes the loop values with an index assignment, whose backward gives *every*
    # self-loop of a node the gradient of the one kept; adding exact zeros does the same.
    old = e[loops]
    return out + torch.zeros_like(out).index_add(0, dst[loops], old - old.detach())


@torch.fx.wrap
def _carry(graph: Any, derived: Any, e: torch.Tensor, loops: torch.Tensor | None) -> torch.Tensor:
    """``e`` (in ``graph``'s edge order) in the edge order of ``derived`` (a graph derived
    from it): an edge both have (the same global edge id) keeps its row, a self-loop
    ``derived`` added takes its node's row of ``loops``. Local on a shard: edges are
    matched by global id and a node's loops are in-edges of it."""
    ids, wanted, num_edges = graph.edge_ids.long(), derived.edge_ids.long(), graph.num_edges  # (int32 or int64)
    index = num_edges + derived.dst_index  # a new loop reads its node's row of `loops`
    if num_edges:
        order = torch.argsort(ids)
        pos = torch.searchsorted(ids[order], wanted).clamp(max=num_edges - 1)
        index = torch.where(ids[order][pos] == wanted, order[pos], index)
    rows = e if loops is None else torch.cat([e, loops.to(e.dtype)])
    return rows[index]


for _helper, _residency in ((_seen_nodes, Residency.CONST), (_update_loops_, "e"), (_fill_loops, Residency.NODE),
                            (_remaining_loops, Residency.NODE), (_carry, Residency.EDGE)):
    declare(_helper, _residency)


register_trace_context(aggregating)


def _end(index: Any) -> EdgeEnd | None:
    return index if isinstance(index, EdgeEnd) else None


def _node_count(num_nodes: Any, what: str) -> None:
    if isinstance(num_nodes, (tuple, list)):
        raise CompileError(
            f"{what} with num_nodes={num_nodes!r} (a bipartite size) is not supported: sarcompile adds a self-loop "
            "to every node of the graph"
        )


# -- the rules ---------------------------------------------------------------------------------
_PYG_REDUCES = {"sum": "sum", "add": "sum", "mean": "mean", "max": "max", "amax": "max", "min": "min",
                "amin": "min", "mul": "mul"}
_ALL_REDUCES = ("sum", "mean", "max", "min", "mul")  # edge_reduce's


def _reduce_name(reduce: Any, what: str, allowed: tuple[str, ...]) -> str:
    name = _PYG_REDUCES.get(reduce) if isinstance(reduce, str) else None
    if name not in allowed:
        raise CompileError(f"{what} with reduce={reduce!r} is not supported; use one of "
                           f"{sorted(k for k, v in _PYG_REDUCES.items() if v in allowed)}")
    return name


@handles(pyg_utils.scatter)
def _scatter(original, src, index, dim=0, dim_size=None, reduce="sum"):
    end = _end(index)
    if end is None:
        return original(src, index, dim, dim_size, reduce)
    if end.end == "dst":
        return edge_reduce(end.graph, src, _reduce_name(reduce, "scatter", _ALL_REDUCES), dim)
    # A node's out-edges live on other workers, which push their partial sums to it.
    name = _reduce_name(reduce, "scatter over edge_index[0] (onto the sources)", ("sum", "mean"))
    return edge_reduce_src(end.graph, _edge_axis(src, dim, "scatter"), name)


@handles(pyg_utils.softmax)
def _softmax(original, src, index=None, ptr=None, num_nodes=None, dim=0):
    end = _end(index)
    if end is None:
        return original(src, index, ptr, num_nodes, dim)
    if end.end != "dst":
        raise CompileError(
            "softmax over edge_index[0] (over the out-edges of each node) is not supported: a node's out-edges "
            "live on other workers; take the softmax over edge_index[1] or reverse the graph"
        )
    # PyG adds 1e-16 to the denominator, which is at least 1 (the largest score gives
    # exp(0)): a difference below float rounding.
    return edge_softmax(end.graph, _edge_axis(src, dim, "softmax"))


@handles(pyg_utils.degree)
def _degree(original, index, num_nodes=None, dtype=None):
    end = _end(index)
    if end is None:
        return original(index, num_nodes, dtype)
    if end.end == "dst":
        return _in_degree(end.graph, dtype)
    return edge_reduce_src(end.graph, _ones_per_edge(end.graph, dtype), "sum")


def _loop_values(graph: EdgeIndex, edge_attr: Any, fill_value: Any) -> Any:
    """PyG's ``compute_loop_attr``: one row per node, the value of its added self-loop."""
    if isinstance(fill_value, str):
        reduce = _reduce_name(fill_value, "a self-loop fill_value", _ALL_REDUCES)
        return edge_reduce(graph, edge_attr, reduce)  # over each node's in-edges
    if fill_value is not None and not isinstance(fill_value, (int, float, torch.Tensor, torch.fx.Proxy)):
        raise CompileError(f"fill_value={fill_value!r} is not one PyG allows (a number, a tensor or a reduction)")
    return _fill_loops(graph, edge_attr, fill_value)


def _with_edges(graph: EdgeIndex, derived: EdgeIndex, edge_attr: Any, loops: Any = None) -> tuple:
    return derived, None if edge_attr is None else _carry(graph, derived, edge_attr, loops)


def replace_self_loops(graph: Any, looped: Any, edge_attr: Any, fill_value: Any) -> Any:
    """``edge_attr`` carried over to ``looped = graph.with_self_loops()`` as PyG's
    ``remove_self_loops`` then ``add_self_loops(fill_value=...)`` make it (GATConv's way):
    other edges keep theirs; each node's new self-loop gets ``fill_value`` reduced over its
    remaining in-edges ('mean', 'add', 'max', ...), or the given number or tensor."""
    graph, looped = as_edge_index(graph), as_edge_index(looped)
    removed = graph.derive("remove_self_loops", "none")
    loops = _loop_values(removed, _carry(graph, removed, edge_attr, None), fill_value)
    return _carry(graph, looped, edge_attr, loops)


@handles(pyg_utils.dropout_edge)
def _dropout_edge(original, edge_index, p=0.5, force_undirected=False, training=True):
    """PyG's edge dropout, ``(edge_index[:, mask], mask)``, with ``mask`` drawn by ``F.dropout``
    of a weight per edge: the dropout pass keys it by global edge id, so N workers drop the
    edges one machine drops."""
    edge_index = _graph_argument(edge_index)
    if edge_index is None:
        return original(edge_index, p, force_undirected, training)
    if force_undirected:
        raise CompileError(
            "dropout_edge(force_undirected=True) drops u->v and v->u together, pairing edges that live on different "
            "workers; drop each direction on its own (force_undirected=False), or build the graph with the "
            "dropped edges removed"
        )
    if not 0.0 <= p < 1.0:
        raise CompileError(f"dropout_edge(p={p}): use a probability in [0, 1)")
    if not training or p == 0.0:
        return edge_index, _ones_per_edge(edge_index, torch.bool)
    mask = torch.nn.functional.dropout(_ones_per_edge(edge_index, None), p, True) != 0
    return as_edge_index(edge_subset(edge_index, mask)), mask


@handles(pyg_utils.dropout_adj)
def _dropout_adj(original, edge_index, edge_attr=None, p=0.5, force_undirected=False, num_nodes=None, training=True):
    """PyG's deprecated edge dropout: :func:`_dropout_edge`'s, where no edge features come along."""
    graph = _graph_argument(edge_index)
    if graph is None:
        return original(edge_index, edge_attr, p, force_undirected, num_nodes, training)
    if edge_attr is not None and training and p > 0:
        raise CompileError(
            "dropout_adj(edge_index, edge_attr, p) with edge features is not supported: the kept edges' features "
            "would be rows picked by a mask; call dropout_edge(edge_index, p) (PyG's replacement) and weight the "
            "edges by its mask instead (edge_attr * mask.unsqueeze(-1)), or drop the features with F.dropout"
        )
    return _dropout_edge(None, graph, p, force_undirected, training)[0], edge_attr


@handles(pyg_utils.remove_self_loops)
def _remove_self_loops(original, edge_index, edge_attr=None):
    if not isinstance(edge_index, EdgeIndex):
        return original(edge_index, edge_attr)
    return _with_edges(edge_index, edge_index.derive("remove_self_loops", "none"), edge_attr)


@handles(pyg_utils.add_self_loops)
def _add_self_loops(original, edge_index, edge_attr=None, fill_value=None, num_nodes=None):
    if not isinstance(edge_index, EdgeIndex):
        return original(edge_index, edge_attr, fill_value, num_nodes)
    _node_count(num_nodes, "add_self_loops")
    if num_nodes is None:  # PyG: loops up to the largest node id an edge has
        derived = edge_index.derive("plus_self_loops", "any", _seen_nodes(edge_index))
    else:
        derived = edge_index.derive("plus_self_loops", "one" if edge_index.loops == "none" else "any")
    loops = None if edge_attr is None else _loop_values(edge_index, edge_attr, fill_value)
    return _with_edges(edge_index, derived, edge_attr, loops)


@handles(pyg_utils.add_remaining_self_loops)
def _add_remaining_self_loops(original, edge_index, edge_attr=None, fill_value=None, num_nodes=None):
    if not isinstance(edge_index, EdgeIndex):
        return original(edge_index, edge_attr, fill_value, num_nodes)
    return add_remaining_self_loops(edge_index, edge_attr, fill_value, num_nodes is not None)


def add_remaining_self_loops(edge_index: EdgeIndex, edge_attr: Any = None, fill_value: Any = None,
                             every_node: bool = True) -> tuple:
    """PyG's ``add_remaining_self_loops`` on the traced graph: ``g.with_self_loops()``,
    and ``edge_attr`` in its edge order, each node's loop keeping the value of its last
    existing self-loop, else getting ``fill_value``. Unless ``every_node`` (PyG given
    ``num_nodes``), loops only up to the largest node id an edge has, as PyG.
    (The GCN stand-in uses it too.)"""
    if every_node:
        derived = edge_index.derive("with_self_loops", "one")
    else:
        derived = edge_index.derive("with_self_loops", "any", _seen_nodes(edge_index))
    if edge_attr is None:
        return derived, None
    loops = _remaining_loops(edge_index, edge_attr, _loop_values(edge_index, edge_attr, fill_value))
    return _with_edges(edge_index, derived, edge_attr, loops)


def add_self_loops(edge_index: EdgeIndex, edge_attr: Any, fill_value: Any) -> tuple:
    """PyG's ``add_self_loops`` given ``num_nodes`` on the traced graph: every edge kept and
    one more self-loop per node, ``edge_attr`` carried over, the loops' from ``fill_value``
    (GCNConv's normalisation of a sparse adjacency uses it)."""
    return _add_self_loops(None, edge_index, edge_attr, fill_value, num_nodes=-1)  # (any count: every node)


def _symmetric(graph: EdgeIndex, weight: Any, deg: Any) -> Any:
    """``deg^-1/2[u] * w_uv * deg^-1/2[v]``, 0 where a degree is 0 (as PyG)."""
    inv = deg.pow(-0.5)
    inv = inv.masked_fill(inv == float("inf"), 0.0)
    return gather_src(graph, inv) * weight * gather_dst(graph, inv)


@handles(gcn_norm)
def _gcn_norm(original, edge_index, edge_weight=None, num_nodes=None, improved=False, add_self_loops=True,
              flow="source_to_target", dtype=None):
    if not isinstance(edge_index, EdgeIndex):
        return original(edge_index, edge_weight, num_nodes, improved, add_self_loops, flow, dtype)
    if flow not in ("source_to_target", "target_to_source"):
        raise CompileError(f"gcn_norm with flow={flow!r}: PyG allows 'source_to_target' or 'target_to_source'")
    graph, weight = edge_index, edge_weight
    if add_self_loops:
        graph, weight = add_remaining_self_loops(edge_index, edge_weight, 2.0 if improved else 1.0, num_nodes is not None)
    if weight is None:
        weight = _ones_per_edge(graph, dtype)
    deg = _scatter(pyg_utils.scatter, weight, graph[1 if flow == "source_to_target" else 0], 0, None, "sum")
    return graph, _symmetric(graph, weight, deg)


class _EdgeValues(torch.fx.Proxy):
    """A per-edge tensor a rule returns: ``.max()`` over it is the maximum over every
    edge of the graph (all workers), as ChebConv's ``lambda_max`` needs."""

    graph: EdgeIndex

    @classmethod
    def of(cls, graph: EdgeIndex, e: torch.fx.Proxy) -> "_EdgeValues":
        out = cls(e.node, e.tracer)
        out.graph = graph
        return out

    def max(self, *args: Any, **kwargs: Any) -> torch.fx.Proxy:
        if args or kwargs:
            return self.tracer.create_proxy("call_method", "max", (self, *args), kwargs)
        return edge_max(self.graph, self)


@handles(pyg_utils.get_laplacian)
def _get_laplacian(original, edge_index, edge_weight=None, normalization=None, dtype=None, num_nodes=None):
    if not isinstance(edge_index, EdgeIndex):
        return original(edge_index, edge_weight, normalization, dtype, num_nodes)
    if normalization not in (None, "sym", "rw"):
        raise CompileError(f"get_laplacian with normalization={normalization!r}: PyG allows None, 'sym' or 'rw'")
    graph, weight = _remove_self_loops(pyg_utils.remove_self_loops, edge_index, edge_weight)
    if weight is None:
        weight = _ones_per_edge(graph, dtype)
    deg = edge_reduce_src(graph, weight, "sum")  # PyG: scatter(edge_weight, row), the out-degree
    if normalization is None:  # L = D - A: the degrees on the added self-loops
        looped, _ = _add_self_loops(pyg_utils.add_self_loops, graph, None, None, num_nodes)
        return looped, _EdgeValues.of(looped, _carry(graph, looped, -weight, deg))
    if normalization == "sym":  # L = I - D^-1/2 A D^-1/2
        weight = _symmetric(graph, weight, deg)
    else:  # L = I - D^-1 A
        inv = 1.0 / deg
        weight = gather_src(graph, inv.masked_fill(inv == float("inf"), 0.0)) * weight
    looped, weight = _add_self_loops(pyg_utils.add_self_loops, graph, -weight, 1.0, num_nodes)
    return looped, _EdgeValues.of(looped, weight)
