"""PyG's layers over one graph whose nodes carry a type: ``HeteroLinear(x, type_vec)``.

``HeteroLinear`` applies one weight per type, each row by its own type. PyG sorts the
rows by type (when they are not sorted) and multiplies each type's segment -- a Python
branch on the values of ``type_vec`` and a reordering of rows. The rule computes the same
row by row: ``x[i] @ weight[type_vec[i]] + bias[type_vec[i]]``, the weight looked up by
each row's own type (a parameter indexed by a per-row index, as an embedding). Layers
built on it (``HEATConv``) then take the general MessagePassing lowering.
"""

from __future__ import annotations

from torch import nn
from torch_geometric import nn as gnn

from sarcompile.errors import CompileError
from sarcompile.ir.lowering import register_lowering
from sarcompile.frontends.pyg.standin import _check_common, _StandIn

__all__: list[str] = []


class _HeteroLinear(_StandIn):
    def forward(self, x, type_vec):
        m = self.layer
        if x.dim() != 2:
            raise CompileError(f"HeteroLinear got features of {x.dim()} dims; sarcompile lowers it for [rows, "
                               "channels] with one type per row")
        out = (x.unsqueeze(-2) @ m.weight[type_vec]).squeeze(-2)
        if m.bias is not None:
            out = out + m.bias[type_vec]
        return out


def _lower_hetero_linear(m: gnn.HeteroLinear) -> nn.Module:
    _check_common(m, gnn.HeteroLinear)
    return _HeteroLinear(m)


register_lowering(gnn.HeteroLinear, _lower_hetero_linear)
