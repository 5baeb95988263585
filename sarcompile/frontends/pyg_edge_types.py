"""PyG layers over typed edges (relations), lowered with :func:`~sarcompile.ir.ops.edge_subset`.

``RGCNConv`` and ``FiLMConv(num_relations > 1)`` loop over the relations and propagate
over the edges of each, ``masked_edge_index(edge_index, edge_type == i)`` or
``edge_index[:, edge_type == i]``; traced, that selection is the ``edge_subset`` IR op, a
graph of the kept edges (made at run time from the mask, once per mask content), and
each ``propagate`` runs over it as over the whole graph. ``FastRGCNConv`` keeps every
edge and picks each edge's weight by its type (``weight[edge_type]``), normalising by the
number of in-edges of the same type (``scatter(one_hot(edge_type), index)[index]``);
``RGATConv`` too (``index_select(weight, 0, edge_type)``). All go through the general
MessagePassing lowering (:func:`~sarcompile.frontends.pyg._lower_message_passing`);
``RGCNConv``, ``FastRGCNConv`` and ``RGATConv`` with, while they are traced:

* ``torch_geometric.backend.use_segment_matmul = False``: ``RGCNConv`` would choose
  between ``segment_matmul`` and its loop from ``int(count.max())`` of the edge counts
  per relation, a value of the data; the loop computes the same (up to rounding);
* ``torch.is_floating_point(features) == True``: the layers branch on it (node indices
  as features, ``in_channels = num_nodes``, take another path); the compiled program
  checks at its first call that the features are floating point, and refuses otherwise;
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

from ..errors import CompileError
from ..ir.lowering import declare, register_lowering
from .pyg import _lower_message_passing, _name
from .pyg_utils import EdgeIndex, handles

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
            f"{layer} got {what}; sarcompile lowers it for floating-point node features only (node indices "
            "as features, in_channels = num_nodes, are not supported yet): pass features, e.g. an "
            "nn.Embedding's output"
        )
    return x


declare(_floating_features, "x")


def _traced_relationally(cls: type, layer: str) -> type:
    """A subclass of ``cls`` (a layer traced by the general lowering) whose forward is traced
    under :func:`_relational_trace`, its features checked by :func:`_floating_features`."""
    traced = cls.forward

    @functools.wraps(traced)
    def forward(self, x, *args, **kwargs):
        with _relational_trace():
            return traced(self, _floating_features(x, layer), *args, **kwargs)

    return type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__})


# -- the rule -----------------------------------------------------------------------------------
def _lower_relational(m: nn.Module) -> nn.Module:
    """``RGCNConv``, ``FastRGCNConv``, ``RGATConv``: the general MessagePassing lowering,
    traced relationally. (``FiLMConv`` needs no more than the general lowering: its
    ``edge_index[:, mask]`` is :class:`~.pyg_utils.EdgeIndex`'s.)"""
    view = _lower_message_passing(m)
    view.__class__ = _traced_relationally(type(view), _name(m))
    return view


for _layer in (gnn.RGCNConv, gnn.RGATConv):  # FastRGCNConv subclasses RGCNConv
    register_lowering(_layer, _lower_relational)
