"""PyG's heterogeneous models: ``HeteroConv``, ``to_hetero`` and ``to_hetero_with_bases``.

They need no rule of their own. A model over a :class:`~sarcompile.hetero.HeteroGraph` is
traced leaf by leaf (:mod:`sarcompile.leaves`): ``x_dict`` is a dict of per-type inputs,
the typed graph serves as ``edge_index_dict`` (a relation by its triple, ``.get``,
``in``), so ``HeteroConv.forward`` and the code ``to_hetero`` generates run as they are,
calling each relation's conv with ``(x_src, x_dst)`` where the two types differ (the
bipartite forms of the conv rules in :mod:`sarcompile.frontends.pyg`).

What this module replaces is the one step that would read as mixing rows:
``HeteroConv``'s grouping of the outputs into one destination type,
``torch.stack(outs, dim=0)`` reduced over dim 0 -- a stack of rows along a new first
axis, which the residency pass cannot tell from stacking two types' rows. The stand-in
computes the same reduction elementwise across the list.
"""

from __future__ import annotations

import functools

import torch
from torch_geometric.nn.conv import hetero_conv

from ..errors import CompileError
from ..lowering import register_function_lowering

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
