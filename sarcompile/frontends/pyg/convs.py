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
``GraphConv``       ``lin_rel(spmm(g, x, aggr, edge_weight)) + lin_root(x)``
``BatchNorm``       the ``batch_norm`` IR op on the wrapped ``BatchNorm1d``'s parameters and
                    running statistics: statistics over the nodes of *all* workers
==================  =========================================================================

``SAGEConv``, ``GraphConv`` and ``GINConv`` also take ``(x_src, x_dst)``, as ``HeteroConv``
and ``to_hetero`` call them on a relation between two node types: the aggregation reads
the source type's rows, the root term the destination type's own.

``GATConv`` and ``GATv2Conv`` are lowered by :mod:`.attention`. Any other
``MessagePassing`` layer gets the general lowering (:mod:`.message_passing`). PyG norms
that reduce over the nodes they see (``GraphNorm``, ``InstanceNorm``, ``PairNorm``, ...)
fail at compile time with a :class:`~sarcompile.CompileError` naming the layer.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch_geometric import nn as gnn

from sarcompile.errors import CompileError
from sarcompile.ir.ops import batch_norm, spmm
from sarcompile.ir.lowering import declare, register_lowering
from sarcompile.ir.vocab import Residency
from sarcompile.frontends.edge_index import as_edge_index
from sarcompile.frontends.pyg.adjacency import _aggregate_weighted, _values
from sarcompile.frontends.pyg.message_passing import _unless_overridden
from sarcompile.frontends.pyg.standin import _check_common, _ends, _name, _plain_call, _reduce, _refuse, _StandIn
from sarcompile.frontends.pyg.utils import add_remaining_self_loops, add_self_loops

torch.fx.wrap("_plain_call")  # the stand-ins' run-time check, one node here too

__all__ = ["SUPPORTED"]

# The PyG layers with a lowering rule (named in error messages).
SUPPORTED = ("SAGEConv", "GCNConv", "GINConv", "GATConv", "GATv2Conv", "GraphConv", "BatchNorm")


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


def _node_reducing(m: nn.Module) -> nn.Module | None:
    if isinstance(m, gnn.LayerNorm) and m.mode == "node":
        return None  # per node: traced through as it is
    raise CompileError(
        f"{_name(m)} normalises over the nodes it sees, which on a worker are only its own, so N workers would "
        "not match one machine; it is not supported yet. Use torch_geometric.nn.BatchNorm (statistics across all "
        "workers) or a per-node norm (torch.nn.LayerNorm, torch_geometric.nn.LayerNorm(mode='node'))"
    )


for _layer, _rule in (
    (gnn.SAGEConv, _lower_sage),
    (gnn.GCNConv, _lower_gcn),
    (gnn.GINConv, _lower_gin),
    (gnn.GraphConv, _lower_graph_conv),
):
    register_lowering(_layer, _unless_overridden(_rule, _layer))
register_lowering(gnn.BatchNorm, _lower_batch_norm)
# The run-time helpers above are row-local (the residency pass cannot look inside them).
declare(_no_weight_for, "x")
declare(_gcn_inv_sqrt_degree, Residency.NODE)
for _name_ in ("InstanceNorm", "GraphNorm", "PairNorm", "MeanSubtractionNorm", "DiffGroupNorm", "GraphSizeNorm",
               "HeteroBatchNorm", "LayerNorm"):
    if hasattr(gnn, _name_):
        register_lowering(getattr(gnn, _name_), _node_reducing)
