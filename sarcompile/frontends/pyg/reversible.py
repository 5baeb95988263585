"""PyG's reversible layers: ``GroupAddRev`` (RevGNN, "Graph Neural Networks with 1000 Layers").

PyG runs ``GroupAddRev`` inside a ``torch.autograd.Function`` that frees its input and
rebuilds it in backward from the output (the layer is invertible), and it splits the
features into groups only where ``isinstance(x, Tensor)``, which a traced value is not: so
traced as it is, the program would give each block all the features. The rule computes
what PyG's forward computes, group by group, and lets autograd keep what backward needs:
the same values and gradients, with the memory of an ordinary layer (sarcompile's own
aggregations already keep no remote rows).

=====================  =======================================================================
PyG layer              lowered to
=====================  =======================================================================
``GroupAddRev``        ``x`` split in ``num_groups`` along ``split_dim`` (and so an extra
                       argument of that width, as RevGNN's dropout mask); ``y_0 = sum(x_1..x_C)``,
                       ``y_i = x_i + block_i(y_{i-1}, edge_index, *args_i)``; ``cat(y_1..y_C)``
=====================  =======================================================================
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch_geometric.nn import GroupAddRev

from sarcompile.errors import CompileError
from sarcompile.ir.lowering import register_lowering
from sarcompile.frontends.pyg.standin import _StandIn

__all__: list[str] = []


class _GroupAddRev(_StandIn):
    def forward(self, x, edge_index, extra=None):
        """PyG's ``forward(x, edge_index, *args)`` with at most one extra argument (RevGNN's
        dropout mask), which fx traces as an argument of its own."""
        m = self.layer
        channels = x.size(m.split_dim)  # (a feature width: a constant when tracing)
        xs = _groups(x, m)
        per_group = [()] * m.num_groups if extra is None else [(a,) for a in self._split(extra, channels)]
        y_in = sum(xs[1:])
        ys = []
        for i, block in enumerate(m.convs):
            y_in = xs[i] + block(y_in, edge_index, *per_group[i])
            ys.append(y_in)
        return torch.cat(ys, dim=m.split_dim)

    def _split(self, a: Any, channels: int) -> list:
        """An extra argument, in groups as PyG splits it: a tensor as wide as ``x`` is split,
        anything else given whole to every group."""
        m = self.layer
        if not hasattr(a, "size") or not hasattr(a, "dim") or a.dim() == 0 or a.size(m.split_dim) != channels:
            return [a] * m.num_groups
        return _groups(a, m)


def _groups(x, m: GroupAddRev) -> list:
    """``torch.chunk(x, num_groups, split_dim)`` as a list (a traced chunk is one value)."""
    chunks = torch.chunk(x, m.num_groups, dim=m.split_dim)
    return [chunks[i] for i in range(m.num_groups)]


def _lower_group_add_rev(m: GroupAddRev) -> nn.Module:
    overridden = [k for k in ("forward", "_forward", "_fn_apply", "_chunk") if getattr(type(m), k) is not
                  getattr(GroupAddRev, k)]
    if overridden:
        raise CompileError(f"{type(m).__name__} subclasses torch_geometric.nn.GroupAddRev but overrides "
                           f"{', '.join(overridden)}, so the rule for GroupAddRev does not apply: use GroupAddRev "
                           "itself, or write the grouped blocks with torch.chunk and torch.cat")
    return _GroupAddRev(m)


register_lowering(GroupAddRev, _lower_group_add_rev)
