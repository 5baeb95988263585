"""PyG layers over typed edges (relations), lowered with :func:`~sarcompile.ir.ops.edge_subset`.

``RGCNConv`` and ``FiLMConv(num_relations > 1)`` loop over the relations and propagate
over the edges of each, ``masked_edge_index(edge_index, edge_type == i)`` or
``edge_index[:, edge_type == i]``; traced, that selection is the ``edge_subset`` IR op, a
graph of the kept edges (made at run time from the mask, once per mask content), and
each ``propagate`` runs over it as over the whole graph. ``FastRGCNConv`` keeps every
edge and picks each edge's weight by its type (``weight[edge_type]``), normalising by the
number of in-edges of the same type (``scatter(one_hot(edge_type), index)[index]``);
``RGATConv`` too (``index_select(weight, 0, edge_type)``). All go through the general
MessagePassing lowering (:func:`~sarcompile.frontends.pyg.message_passing._lower_message_passing`);
``RGCNConv``, ``FastRGCNConv`` and ``RGATConv`` with, while they are traced:

* ``torch_geometric.backend.use_segment_matmul = False``: ``RGCNConv`` would choose
  between ``segment_matmul`` and its loop from ``int(count.max())`` of the edge counts
  per relation, a value of the data; the loop computes the same (up to rounding);
* ``torch.is_floating_point(features) == True``: the layers branch on it (node indices
  as features, ``in_channels = num_nodes``, take another path); the compiled program
  checks at its first call that the features are floating point, and refuses otherwise
  (``RGCNConv`` / ``FastRGCNConv`` called with ``x=None``, every node's own index, are
  lowered on their own: :func:`_featureless`);
* ``torch.index_select`` is torch's own on traced tensors: PyG replaces it by a function
  that first compares ``dim`` with ``input.dim()``, a Python branch on a traced value.

``one_hot`` of a traced tensor is PyG's own computation without its checks on values.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import torch
import torch.fx
import torch_geometric.backend
from torch import nn
from torch_geometric import nn as gnn
from torch_geometric import utils as pyg_utils
from torch_geometric.nn.conv import rgcn_conv

from sarcompile.errors import CompileError
from sarcompile.ir.lowering import declare, register_lowering
from sarcompile.ir.ops import edge_reduce, gather_table
from sarcompile.ir.vocab import Residency
from sarcompile.frontends.edge_index import EdgeIndex, as_edge_index
from sarcompile.frontends.pyg.message_passing import _lower_message_passing
from sarcompile.frontends.pyg.standin import _name
from sarcompile.frontends.pyg.utils import _reduce_name, handles

__all__: list[str] = []


# -- PyG functions ------------------------------------------------------------------------------
@handles(rgcn_conv.masked_edge_index)
def _masked_edge_index(original, edge_index, edge_mask):
    if isinstance(edge_index, EdgeIndex):
        return edge_index[:, edge_mask]  # the edge_subset op
    return original(edge_index, edge_mask)


@handles(pyg_utils.one_hot)
def _one_hot(original, index, num_classes=None, dtype=None):
    if not isinstance(index, torch.fx.Proxy):
        return original(index, num_classes, dtype)
    if not isinstance(num_classes, int):
        raise CompileError(
            "one_hot(index) without num_classes counts the classes from the data (index.max() + 1), which "
            "differs between workers; give num_classes"
        )
    # PyG's one_hot, less its check that index is 1-D (a value a trace does not have);
    # scatter rather than scatter_, the same values, which the residency pass reads.
    out = torch.zeros((index.size(0), num_classes), dtype=dtype, device=index.device)
    return out.scatter(1, index.unsqueeze(1), 1)


# -- what holds while a relational layer is traced -------------------------------------------------
_is_floating_point = torch.is_floating_point


def _traced_is_floating_point(t: Any) -> bool:
    return True if isinstance(t, torch.fx.Proxy) else _is_floating_point(t)


def _index_select_of(installed: Any) -> Any:
    """``torch.index_select`` as ``installed`` (PyG's, or torch's), but torch's own on a
    traced tensor."""

    def index_select(input: Any, *args: Any, **kwargs: Any) -> Any:
        select = torch._C._VariableFunctions.index_select if isinstance(input, torch.fx.Proxy) else installed
        return select(input, *args, **kwargs)

    return index_select


@contextlib.contextmanager
def _relational_trace() -> Iterator[None]:
    """The settings of the module docstring, restored afterwards."""
    segment_matmul = torch_geometric.backend.use_segment_matmul
    torch_geometric.backend.use_segment_matmul = False
    torch.is_floating_point = _traced_is_floating_point
    index_select = torch.index_select
    torch.index_select = _index_select_of(index_select)
    try:
        yield
    finally:
        torch.index_select = index_select
        torch.is_floating_point = _is_floating_point
        torch_geometric.backend.use_segment_matmul = segment_matmul


@torch.fx.wrap
def _floating_features(x: Any, layer: str) -> Any:
    """``x``, after checking at run time that it is floating-point node features."""
    if isinstance(x, (tuple, list)):
        raise CompileError(f"{layer} got a pair of node tensors; bipartite inputs are not supported yet")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        what = "no features" if x is None else f"features of dtype {getattr(x, 'dtype', type(x).__name__)}"
        raise CompileError(
            f"{layer} got {what}; sarcompile lowers it for floating-point node features, and RGCNConv / "
            "FastRGCNConv also for none (x=None: every node's own index, in_channels = the number of nodes); a "
            "tensor of node indices is not supported: pass x=None, or features (e.g. an nn.Embedding's output)"
        )
    return x


declare(_floating_features, "x")


def _traced_relationally(cls: type, layer: str) -> type:
    """A subclass of ``cls`` (a layer traced by the general lowering) whose forward is traced
    under :func:`_relational_trace`, its features checked by :func:`_floating_features`;
    an ``RGCNConv`` / ``FastRGCNConv`` called without features is :func:`_featureless`."""
    traced = cls.forward

    @functools.wraps(traced)
    def forward(self, x, *args, **kwargs):
        if x is None and isinstance(self, gnn.RGCNConv):
            return _featureless(self, layer, *args, **kwargs)
        with _relational_trace():
            return traced(self, _floating_features(x, layer), *args, **kwargs)

    return type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__})


def _featureless(m: gnn.RGCNConv, layer: str, edge_index: Any, edge_type: Any = None) -> Any:
    """``RGCNConv(num_nodes, ...)`` called with ``x=None`` (PyG's node-index mode; also
    ``FastRGCNConv``, which computes the same): node ``u``'s features are the one-hot
    ``e_u``, so ``u``'s message under relation ``r`` is row ``u`` of ``weight[r]`` (composed
    from the bases, as PyG composes it) and the root term is ``root[v]``. Both tables have a
    row per node of the whole graph and live on every worker, as every parameter does; a
    relation's rows are read per edge (``gather_table``), aggregated over each node's
    in-edges of that relation, and summed over the relations in order, as PyG sums them."""
    if m.num_blocks is not None:
        raise CompileError(f"{layer} with num_blocks has no node-index mode (PyG raises: block-diagonal "
                           "decomposition needs features); pass features, or use num_bases")
    reduce = _reduce_name(m.aggr, f"{layer} called without features", ("sum", "mean", "max", "min"))
    if edge_type is None:
        raise CompileError(f"{layer} was called without edge_type; give the relation of every edge")
    graph = as_edge_index(edge_index)
    out = None
    for r in range(m.num_relations):
        edges = graph[:, edge_type == r]
        part = edge_reduce(edges, gather_table(edges, _relation_table(m, r), "src"), reduce)
        out = part if out is None else out + part
    if m.root is not None:
        out = out + _node_rows(graph, m.root)
    if m.bias is not None:
        out = out + m.bias
    return out


def _relation_table(m: gnn.RGCNConv, r: int) -> Any:
    """Relation ``r``'s ``[num_nodes, out]`` weight: ``weight[r]``, or with bases row ``r``
    of PyG's ``comp @ weight`` (one relation at a time: the ``[relations, num_nodes, out]``
    composition is never held whole)."""
    if m.num_bases is None:
        return m.weight[r]
    return (m.comp[r] @ m.weight.view(m.num_bases, -1)).view(m.in_channels_l, m.out_channels)


@torch.fx.wrap
def _node_rows(graph: Any, table: torch.Tensor) -> torch.Tensor:
    """``table[v]`` for every node ``v`` of ``graph`` (a worker's own nodes, by global id),
    ``table`` having a row per node of the whole graph on every worker (a parameter): PyG's
    ``root[x]`` with ``x`` every node id. Local; each worker's gradient holds its nodes'
    rows, and the all-reduce of the parameter gradients sums them (see ``gather_table``)."""
    ids = graph.global_ids
    total = graph.num_global_nodes if hasattr(graph, "num_global_nodes") else graph.num_nodes
    if table.shape[0] != total and not getattr(graph, "is_probe", False):
        raise CompileError(f"a node table of {table.shape[0]} rows on a graph of {total} nodes: RGCNConv without "
                           "features takes in_channels = the number of nodes of the whole graph")
    return table.index_select(0, (ids % table.shape[0]).to(table.device))


declare(_node_rows, Residency.NODE)


# -- the rule -----------------------------------------------------------------------------------
def _lower_relational(m: nn.Module) -> nn.Module:
    """``RGCNConv``, ``FastRGCNConv``, ``RGATConv``: the general MessagePassing lowering,
    traced relationally. (``FiLMConv`` needs no more than the general lowering: its
    ``edge_index[:, mask]`` is :class:`~.utils.EdgeIndex`'s.)"""
    view = _lower_message_passing(m)
    view.__class__ = _traced_relationally(type(view), _name(m))
    return view


for _layer in (gnn.RGCNConv, gnn.RGATConv):  # FastRGCNConv subclasses RGCNConv
    register_lowering(_layer, _lower_relational)
