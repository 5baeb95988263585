"""PyG's heterogeneous models: ``HeteroConv``, ``to_hetero`` and ``to_hetero_with_bases``.

They need no rule of their own. A model over a :class:`~sarcompile.graph.hetero.HeteroGraph` is
traced leaf by leaf (:mod:`sarcompile.compile.leaves`): ``x_dict`` is a dict of per-type inputs,
the typed graph serves as ``edge_index_dict`` (a relation by its triple, ``.get``,
``in``), so ``HeteroConv.forward`` and the code ``to_hetero`` generates run as they are,
calling each relation's conv with ``(x_src, x_dst)`` where the two types differ (the
bipartite forms of the rules in :mod:`sarcompile.frontends.pyg.convs` and
:mod:`sarcompile.frontends.pyg.attention`). ``HeteroConv`` may be the model itself,
``forward(*args_dict, **kwargs_dict)``: keyword dicts of edge tensors (``edge_attr_dict``,
``edge_weight_dict``, keyed by relation, in each relation's edge order) reach the convs of
the relations they hold.

What this module replaces is the one step that would read as mixing rows:
``HeteroConv``'s grouping of the outputs into one destination type,
``torch.stack(outs, dim=0)`` reduced over dim 0 -- a stack of rows along a new first
axis, which the residency pass cannot tell from stacking two types' rows. The stand-in
computes the same reduction elementwise across the list.

``to_hetero_with_bases`` is refused, naming the model and what to use instead: the code it
generates concatenates every type's rows into one tensor and every relation's edges into
one homogeneous graph (``group_node_placeholder``, ``group_edge_placeholder``), runs each
conv there with a weight per relation on its messages, and cuts the result by row offsets.
A row offset of one type is not a row of another on a worker, and sarcompile has no
homogeneous view of a typed partition yet.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch_geometric.nn import to_hetero_with_bases_transformer as with_bases
from torch_geometric.nn.conv import hetero_conv

from sarcompile.errors import CompileError
from sarcompile.ir.lowering import register_function_lowering, register_lowering

__all__ = ["group"]


def group(xs: list, aggr: str | None):
    """``hetero_conv.group``: the outputs of the relations into one destination type,
    combined as ``aggr`` says, elementwise (the same values PyG's stack-and-reduce gives)."""
    if len(xs) == 0:
        return None
    if aggr is None:
        return torch.stack(xs, dim=1)
    if len(xs) == 1:
        return xs[0]
    if aggr == "cat":
        return torch.cat(xs, dim=-1)
    pairwise = {"sum": torch.add, "mean": torch.add, "max": torch.maximum, "min": torch.minimum,
                "mul": torch.mul}.get(aggr)
    if pairwise is None:
        raise CompileError(f"HeteroConv(aggr={aggr!r}) is not supported; use 'sum', 'mean', 'max', 'min', 'mul', "
                           "'cat' or None")
    out = functools.reduce(pairwise, xs)
    return out / len(xs) if aggr == "mean" else out


register_function_lowering(hetero_conv.group, group, homes=(hetero_conv,))


def _with_bases_refusal() -> CompileError:
    return CompileError(
        "a torch_geometric.nn.to_hetero_with_bases(...) model is not supported yet: its generated forward "
        "concatenates the rows of every node type into one tensor and the edges of every relation into one "
        "homogeneous graph (group_node_placeholder / group_edge_placeholder), runs each conv on it with a weight "
        "per relation on the messages (HeteroBasisConv) and splits the output by row offsets, which on N workers "
        "do not name the same rows; use to_hetero(model, metadata) (a conv per relation), or RGCNConv / "
        "FastRGCNConv(num_bases=...) on data.to_homogeneous() (sc.Graph.from_pyg, edge_type per edge)"
    )


def _refuse_with_bases(original):
    """The generated code's helper ``original``, refused while a model is traced."""

    @functools.wraps(original)
    def refused(*args, **kwargs):
        raise _with_bases_refusal()

    return refused


def _lower_basis_conv(m: nn.Module) -> nn.Module:
    raise _with_bases_refusal()


for _helper in (with_bases.get_node_offset_dict, with_bases.get_edge_offset_dict, with_bases.get_edge_type,
                with_bases.group_node_placeholder, with_bases.group_edge_placeholder, with_bases.split_output):
    register_function_lowering(_helper, _refuse_with_bases(_helper), homes=(with_bases,))
register_lowering(with_bases.HeteroBasisConv, _lower_basis_conv)
