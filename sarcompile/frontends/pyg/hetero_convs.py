"""PyG's layers over all relations at once: ``HGTConv``, ``HANConv``, ``HeteroDictLinear``.

They take ``(x_dict, edge_index_dict)``. PyG computes them on one homogeneous view --
every type's rows concatenated, every relation's edges renumbered into it (HGTConv), or
the relations' outputs stacked into one ``[relations, nodes, channels]`` tensor (HANConv)
-- which mixes the rows of different types. The rules below compute the same values
relation by relation with IR ops, referring to the layers' own parameters, as the rules
of :mod:`sarcompile.frontends.pyg.convs` do. Called inside a model, such a layer is traced in
place of the call (see :class:`sarcompile.compile.sar_tracer.SarTracer`).

=====================  =======================================================================
PyG layer              lowered to
=====================  =======================================================================
``HGTConv``            per relation ``r``: ``k_r = k_src @ k_rel[h, r]``, the score
                       ``sddmm(g_r, k_r, q_dst, "dot") * p_rel[r] / sqrt(D)``; a softmax over every
                       in-edge of a node across its relations (:func:`softmax_across`), the
                       weighted ``spmm`` of ``v_r = v_src @ v_rel[h, r]`` summed over relations;
                       then ``out_lin(gelu(.))`` and the gated skip, as PyG
``HANConv``            per relation: GAT-style attention (``sddmm(add) -> leaky_relu ->
                       edge_softmax -> [edge_dropout] -> spmm``, fused into one op), ``relu``; per
                       type the semantic attention over its relations, whose score is a mean over
                       *all* the type's nodes: the ``node_mean`` op (all-reduced on N workers)
``HeteroDictLinear``   each type's ``Linear`` on its own rows
=====================  =======================================================================
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric import nn as gnn

from sarcompile.errors import CompileError
from sarcompile.ir.lowering import register_lowering
from sarcompile.ir.ops import edge_dropout, edge_reduce, edge_softmax, gather_dst, node_mean, sddmm, spmm
from sarcompile.frontends.pyg.attention import _stream
from sarcompile.frontends.pyg.standin import _check_common, _refuse, _StandIn

__all__ = ["softmax_across"]


def softmax_across(scores: list[tuple]) -> list:
    """``[(g_r, e_r)]``: per-edge scores of relations into one node type. The softmax of
    each node's in-edges over all those relations together, per relation: what PyG's
    ``softmax`` over the edges of the concatenated relations gives (shifted by each node's
    largest score, as PyG). Local: a node's in-edges of every relation live on its worker."""
    peak = None
    for g, e in scores:
        e = e.detach()
        # (a node without in-edges of this relation has max 0 there: not a score of it)
        reached = edge_reduce(g, torch.ones_like(e), "sum") > 0
        top = edge_reduce(g, e, "max").masked_fill(~reached, float("-inf"))
        peak = top if peak is None else torch.maximum(peak, top)
    exps = [torch.exp(e - gather_dst(g, peak)) for g, e in scores]
    total = None
    for (g, _), z in zip(scores, exps):
        part = edge_reduce(g, z, "sum")
        total = part if total is None else total + part
    return [z / gather_dst(g, total) for (g, _), z in zip(scores, exps)]


def _relations(m: nn.Module, edge_index_dict) -> list:
    """The relations of the call PyG's layer uses: those of ``edge_index_dict``, in order;
    a relation the layer was not built for is refused as PyG would fail on it."""
    known = [tuple(r) for r in m.metadata[1]] if hasattr(m, "metadata") else [tuple(r) for r in m.edge_types]
    rels = [tuple(r) for r in edge_index_dict]
    unknown = [r for r in rels if r not in known]
    if unknown:
        raise CompileError(f"{type(m).__name__} was called with relations {unknown} it was not built for (its "
                           f"metadata has {known}); build it with the graph's metadata()")
    return rels


# ------------------------------------------------------------------------------ HGTConv
class _HGTConv(_StandIn):
    def forward(self, x_dict, edge_index_dict):
        m = self.layer
        F_, H = m.out_channels, m.heads
        D = F_ // H
        k, q, v = {}, {}, {}
        for t, kqv in m.kqv_lin(x_dict).items():  # HeteroDictLinear: each type's own rows
            k[t], q[t], v[t] = (kqv[:, i * F_:(i + 1) * F_].reshape(-1, H, D) for i in range(3))
        rels = _relations(m, edge_index_dict)
        num_rels = len(m.edge_types)
        into: dict = {}
        for rel in rels:
            src, _, dst = rel
            g = edge_index_dict[rel]
            # k_rel / v_rel hold one [D, D] matrix per (head, relation): type h * R + r.
            which = [h * num_rels + m.edge_types_map[rel] for h in range(H)]
            k_r = torch.stack([k[src][:, h] @ m.k_rel.weight[w] for h, w in enumerate(which)], dim=1)
            v_r = torch.stack([v[src][:, h] @ m.v_rel.weight[w] for h, w in enumerate(which)], dim=1)
            score = sddmm(g, k_r, q[dst], "dot") * m.p_rel["__".join(rel)] / math.sqrt(D)
            into.setdefault(dst, []).append((g, score, v_r))
        out_dict = {}
        for t in x_dict:  # PyG's order: the types of x_dict that are a destination of the metadata
            if t not in m.dst_node_types:
                continue
            if t not in into:  # no relation of the call reaches it: PyG's rows of zeros
                out_dict[t] = torch.zeros_like(q[t]).reshape(-1, F_)
                continue
            weights = softmax_across([(g, s) for g, s, _ in into[t]])
            out = None
            for (g, _, v_r), w in zip(into[t], weights):
                part = spmm(g, v_r, "sum", edge_weight=w)
                out = part if out is None else out + part
            out_dict[t] = out.reshape(-1, F_)
        a_dict = m.out_lin({t: F.gelu(o) for t, o in out_dict.items()})
        for t in out_dict:
            out = a_dict[t]
            if out.size(-1) == x_dict[t].size(-1):  # (feature sizes: constants when compiling)
                alpha = m.skip[t].sigmoid()
                out = alpha * out + (1 - alpha) * x_dict[t]
            out_dict[t] = out
        return out_dict


def _lower_hgt(m: gnn.HGTConv) -> nn.Module:
    _check_common(m, gnn.HGTConv)
    if m.k_rel.bias is not None or m.v_rel.bias is not None:
        raise CompileError("torch_geometric.nn.HGTConv with biased k_rel / v_rel is not supported; use PyG's layer "
                           "as it builds them")
    return _HGTConv(m)


# ------------------------------------------------------------------------------ HANConv
class _HANConv(_StandIn):
    def __init__(self, layer: nn.Module):
        super().__init__(layer)
        self.stream = _stream(layer)

    def forward(self, x_dict, edge_index_dict, return_semantic_attention_weights: bool = False):
        m = self.layer
        if return_semantic_attention_weights:
            raise CompileError("HANConv(return_semantic_attention_weights=True) is not supported yet: the weights "
                               "are a value per relation, not per node; call it without")
        H, D = m.heads, m.out_channels // m.heads
        h = {t: m.proj[t](x).reshape(-1, H, D) for t, x in x_dict.items()}
        outs: dict = {t: [] for t in x_dict}
        for rel in _relations(m, edge_index_dict):
            src, _, dst = rel
            g = edge_index_dict[rel]
            key = "__".join(rel)
            a_src = (h[src] * m.lin_src[key]).sum(dim=-1)
            a_dst = (h[dst] * m.lin_dst[key]).sum(dim=-1)
            # The chain the fuse pass makes one attention op of.
            weight = edge_softmax(g, F.leaky_relu(sddmm(g, a_src, a_dst, "add"), m.negative_slope))
            if m.training and m.dropout > 0:
                weight = edge_dropout(g, weight, m.dropout, self.stream())
            out = spmm(g, h[src], "sum", edge_weight=weight).reshape(-1, m.out_channels)
            outs[dst].append(F.relu(out))
        return {t: self._semantic(xs) for t, xs in outs.items()}

    def _semantic(self, xs: list):
        """PyG's ``group``: each relation's output weighted by a softmax over the relations
        of ``(q * mean over the type's nodes of tanh(k_lin(out))).sum()``."""
        m = self.layer
        if not xs:
            return None
        scores = [(m.q * node_mean(torch.tanh(m.k_lin(x)))).sum(-1) for x in xs]
        attn = torch.softmax(torch.stack(scores), dim=0)
        out = None
        for i, x in enumerate(xs):
            part = attn[i] * x
            out = part if out is None else out + part
        return out


def _lower_han(m: gnn.HANConv) -> nn.Module:
    _check_common(m, gnn.HANConv)
    if not 0.0 <= m.dropout < 1.0:
        raise _refuse(m, "dropout", m.dropout, "use a probability in [0, 1)")
    return _HANConv(m)


# ------------------------------------------------------------------------- HeteroDictLinear
class _HeteroDictLinear(_StandIn):
    def forward(self, x_dict):
        return {key: lin(x_dict[key]) for key, lin in self.layer.lins.items() if key in x_dict}


def _lower_hetero_dict_linear(m: gnn.HeteroDictLinear) -> nn.Module:
    _check_common(m, gnn.HeteroDictLinear)
    return _HeteroDictLinear(m)


register_lowering(gnn.HGTConv, _lower_hgt)
register_lowering(gnn.HANConv, _lower_han)
register_lowering(gnn.HeteroDictLinear, _lower_hetero_dict_linear)
