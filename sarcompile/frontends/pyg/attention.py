"""PyG's attention layers lowered to IR ops.

==================  =========================================================================
PyG layer           lowered to
==================  =========================================================================
``GATConv``         ``sddmm(add) [+ edge term] -> leaky_relu -> edge_softmax -> [edge_dropout]
                    -> spmm``, which the fuse pass turns into one attention op; ``residual``,
                    ``bias``, ``edge_dim`` (the edge term ``(lin_edge(edge_attr) * att_edge)
                    .sum(-1)``, self-loops' features from ``fill_value`` as PyG)
``GATv2Conv``       ``att . leaky_relu(sddmm(g, lin_l x_src, lin_r x_dst, "add") [+ lin_edge(edge_attr)])``
                    per edge and head, ``edge_softmax``, ``[edge_dropout]``, weighted ``spmm``
                    (not fused); ``edge_dim`` as for GATConv
==================  =========================================================================

Both also take ``(x_src, x_dst)`` on a relation between two node types (self-loops, which
would join rows of two types by position, are refused).

Attention dropout (``dropout > 0`` in training) uses sarcompile's edge-keyed masks, the
same on any number of workers but not PyG's random draws; the mask stream of each layer
is seeded from torch's RNG when the layer is first compiled (call ``torch.manual_seed``
alike on every worker), and its step counter is not part of the model's ``state_dict``.
"""

from __future__ import annotations

import torch.fx
import torch.nn.functional as F
from torch import nn
from torch_geometric import nn as gnn

from sarcompile.errors import CompileError
from sarcompile.nn import RandomStream, layer_stream
from sarcompile.ir.ops import edge_dropout, edge_softmax, sddmm, spmm
from sarcompile.ir.lowering import declare, register_lowering
from sarcompile.frontends.pyg.message_passing import _unless_overridden
from sarcompile.frontends.pyg.standin import _check_common, _ends, _plain_call, _refuse, _StandIn
from sarcompile.frontends.pyg.utils import replace_self_loops

torch.fx.wrap("_plain_call")  # the stand-ins' run-time check, one node here too


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


register_lowering(gnn.GATConv, _unless_overridden(_lower_gat, gnn.GATConv))
register_lowering(gnn.GATv2Conv, _unless_overridden(_lower_gatv2, gnn.GATv2Conv))
declare(_edge_features, "edge_attr")  # row-local (the residency pass cannot look inside it)
