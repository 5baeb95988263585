"""The typed models ``python -m sarcompile.train`` trains on heterogeneous partitions.

Both are ordinary single-machine modules written with sarcompile's ops, called as
``model(g, x)`` with a typed graph and a dict of features per node type, and return the
logits of the *target* type's rows (the type whose class is predicted: ogbn-mag's
papers). :func:`sarcompile.distribute` compiles them like any other model. Node types
without features get a learnable table each (``embed.<type>.weight``, a
:class:`sarcompile.nn.NodeTable`: an ``nn.Embedding`` whose N(0, 1) rows are keyed by node
id), used as their features: a node table (:mod:`sarcompile.graph.tables`), whose rows each worker
holds and updates for its own nodes only. Given ``rows`` (each type's global ids of a
worker's nodes) a worker makes only those rows of each table, never the whole table; one
machine's whole table has the same rows.

* :class:`RGCN` -- the relational GCN of DGL's ogbn-mag example: per relation the mean of
  the source rows over in-neighbours times the relation's weight, summed over the
  relations into a type, plus the type's own self-loop linear (with bias); ReLU and
  dropout between layers.
* :class:`HGT` -- the Heterogeneous Graph Transformer (Hu et al., WWW 2020): per node type
  key / query / value linears, per relation a key and a value transform per head and a
  prior per head; each node's attention is a softmax over *all* its in-edges, of every
  relation into its type; GELU, an output linear per type and a learnable gated skip.

Dropout between layers is :class:`sarcompile.nn.NodeDropout`, one per node type and
layer, keyed by the node's id within its type, so every node draws the same mask on any
number of workers. Only what the target's logits need is computed: the last layer only
the target's rows, each earlier one only the types the next reads.

>>> import torch, sarcompile as sc
>>> g = sc.HeteroGraph.from_edges({("author", "writes", "paper"): (torch.tensor([0, 1]), torch.tensor([1, 1]))},
...                               num_nodes={"author": 2, "paper": 3})
>>> net = RGCN({"author": 2, "paper": 3}, g.edge_types, {"paper": 4}, "paper", num_classes=5, embed_dim=4)
>>> net(g, {"paper": torch.randn(3, 4)}).shape
torch.Size([3, 5])
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from sarcompile.graph.hetero import Relation, relation_key
from sarcompile.nn import NodeDropout, NodeTable
from sarcompile.ir.ops import edge_reduce, gather_dst, sddmm, spmm

__all__ = ["TYPED_MODELS", "TypedNet", "RGCN", "HGT", "build_typed"]

TYPED_MODELS = ("rgcn", "hgt")


class TypedNet(nn.Module):
    """What both models share: the graph's types and relations, the embedding tables of
    the featureless types, which types each layer computes, and the per-type dropout.

    ``node_counts``: nodes of every type in the whole graph; ``edge_types``: the relations
    ``(src, name, dst)``; ``in_dims``: the feature width of each type that has features;
    every other type gets a ``NodeTable(count, embed_dim)``: with ``rows`` (a worker's
    global ids per type, ``part.graph.global_ids``) only the worker's rows of it.
    """

    def __init__(self, node_counts: Mapping[str, int], edge_types: Iterable[Sequence[str]],
                 in_dims: Mapping[str, int], target: str, embed_dim: int, layers: int,
                 rows: Mapping[str, torch.Tensor] | None = None):
        super().__init__()
        self.edge_types: tuple[Relation, ...] = tuple(tuple(r) for r in edge_types)
        linked = {t for s, _, d in self.edge_types for t in (s, d)}
        unknown = [t for t in {target, *in_dims} if t not in node_counts]
        if unknown:
            raise ValueError(f"node types {sorted(unknown)} are not among the graph's {list(node_counts)}")
        if target not in linked:
            raise ValueError(f"the target type {target!r} is in no relation: a graph model has nothing to aggregate "
                             "into it")
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        self.target = target
        self.in_dims = {t: int(in_dims[t]) if t in in_dims else embed_dim for t in node_counts if t in linked}
        self.computes = self._computed_types(layers)
        # the types the first layer reads: its own, and the sources of the relations into them
        first = set(self.computes[0]) | {s for s, _, d in self.edge_types if d in self.computes[0]}
        self.reads = [t for t in self.in_dims if t in first]
        self.embed = nn.ModuleDict({t: NodeTable(node_counts[t], embed_dim, rows=None if rows is None else rows[t],
                                                 node_type=t) for t in self.reads if t not in in_dims})
        # The relation whose ids key a type's dropout masks: one into it, else one out of it.
        self.keyed_by = {}
        for t in self.in_dims:
            into = [r for r in self.edge_types if r[2] == t]
            self.keyed_by[t] = (into[0], False) if into else (next(r for r in self.edge_types if r[0] == t), True)

    def _computed_types(self, layers: int) -> list[list[str]]:
        """Per layer, the types whose rows it outputs: the last only the target, each
        earlier one the types the next one reads (its own types, and the sources of the
        relations into them)."""
        need = [self.target]
        out = [need]
        for _ in range(layers - 1):
            wanted = set(need) | {s for s, _, d in self.edge_types if d in need}
            need = [t for t in self.in_dims if t in wanted]
            out.append(need)
        return out[::-1]

    def dropouts(self, p: float, layers: int) -> nn.ModuleList | None:
        """One :class:`NodeDropout` per type computed by each hidden layer (None for p=0)."""
        if p <= 0:
            return None
        return nn.ModuleList(
            nn.ModuleDict({t: NodeDropout(p, source=self.keyed_by[t][1]) for t in self.computes[i]})
            for i in range(layers - 1)
        )

    def features(self, x: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The input rows of each type the first layer reads: its features, or its
        embedding table's rows (on a worker, the worker's own rows of the table)."""
        out = {t: x[t] for t in self.reads if t not in self.embed}
        out.update({t: self.embed[t].weight for t in self.embed})
        return out

    def drop(self, drops: nn.ModuleDict, g, h: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each type's rows through its own dropout, keyed by the ids of the type's nodes."""
        return {t: drops[t](g[self.keyed_by[t][0]], v) for t, v in h.items()}


class RGCNLayer(nn.Module):
    """``out[t] = sum over relations r = (s, _, t) of mean_{u->v} (x[s][u]) W_r + loop_t(x[t])``
    for each type ``t`` of ``types``; a type with no relation into it gets its self-loop
    term only."""

    def __init__(self, in_dims: Mapping[str, int], out_dim: int, types: Sequence[str],
                 edge_types: Sequence[Relation]):
        super().__init__()
        self.edge_types = tuple(r for r in edge_types if r[2] in types)
        self.weight = nn.ModuleDict({relation_key(r): nn.Linear(in_dims[r[0]], out_dim, bias=False)
                                     for r in self.edge_types})
        self.loop = nn.ModuleDict({t: nn.Linear(in_dims[t], out_dim) for t in types})

    def forward(self, g, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {t: loop(x[t]) for t, loop in self.loop.items()}
        for rel in self.edge_types:
            out[rel[2]] = out[rel[2]] + self.weight[relation_key(rel)](spmm(g[rel], x[rel[0]], "mean"))
        return out


class RGCN(TypedNet):
    """``layers`` :class:`RGCNLayer` (``hidden`` wide; the last ``num_classes``), ReLU then
    per-type node dropout between them; the target's logits."""

    def __init__(self, node_counts: Mapping[str, int], edge_types: Iterable[Sequence[str]],
                 in_dims: Mapping[str, int], target: str, num_classes: int, hidden: int = 64, layers: int = 2,
                 dropout: float = 0.0, embed_dim: int = 128, rows: Mapping[str, torch.Tensor] | None = None):
        super().__init__(node_counts, edge_types, in_dims, target, embed_dim, layers, rows)
        dims = [dict(self.in_dims)] + [{t: hidden for t in self.in_dims}] * (layers - 1)
        widths = [hidden] * (layers - 1) + [num_classes]
        self.layers = nn.ModuleList(RGCNLayer(dims[i], widths[i], self.computes[i], self.edge_types)
                                    for i in range(layers))
        self.drops = self.dropouts(dropout, layers)

    def forward(self, g, x: dict[str, torch.Tensor]) -> torch.Tensor:
        h = self.features(x)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            h = layer(g, h)
            if i < last:
                h = {t: F.relu(v) for t, v in h.items()}
                if self.drops is not None:
                    h = self.drop(self.drops[i], g, h)
        return h[self.target]


class HGTLayer(nn.Module):
    """One HGT layer, ``dim`` wide in and out, ``heads`` heads of ``dim // heads``.

    For an edge u->v of relation r = (s, _, t): ``score = (K_s(x[u]) M_r^k) . Q_t(x[v]) *
    prior_r / sqrt(d)`` per head, soft-maxed over all in-edges of v across the relations
    into t; ``message = V_s(x[u]) M_r^v``; ``out[v] = A_t(gelu(sum of score * message))``,
    mixed with ``x[v]`` by the gate ``sigmoid(skip_t)``. ``M_r`` are per-head ``d x d``
    matrices (applied as one block-diagonal matrix). A node without in-edges aggregates 0.
    """

    def __init__(self, dim: int, heads: int, types: Sequence[str], edge_types: Sequence[Relation]):
        super().__init__()
        if dim % heads:
            raise ValueError(f"HGT's width {dim} is not a multiple of its {heads} heads")
        self.heads, self.head_dim = heads, dim // heads
        self.edge_types = tuple(r for r in edge_types if r[2] in types)
        sources = list(dict.fromkeys(r[0] for r in self.edge_types))
        for name, of in (("k", sources), ("q", types), ("v", sources), ("a", types)):
            setattr(self, name, nn.ModuleDict({t: nn.Linear(dim, dim) for t in of}))
        keys = [relation_key(r) for r in self.edge_types]
        self.k_rel = nn.ParameterDict({k: nn.Parameter(torch.empty(heads, self.head_dim, self.head_dim)) for k in keys})
        self.v_rel = nn.ParameterDict({k: nn.Parameter(torch.empty(heads, self.head_dim, self.head_dim)) for k in keys})
        self.prior = nn.ParameterDict({k: nn.Parameter(torch.ones(heads)) for k in keys})
        self.skip = nn.ParameterDict({t: nn.Parameter(torch.tensor(1.0)) for t in types})
        self.register_buffer("eye", torch.eye(heads), persistent=False)
        for p in (*self.k_rel.values(), *self.v_rel.values()):
            nn.init.xavier_uniform_(p)

    def _per_head(self, m: torch.Tensor) -> torch.Tensor:
        """``[heads, d, d]`` as the block-diagonal ``[heads * d, heads * d]`` matrix."""
        h, d = self.heads, self.head_dim
        return (self.eye[:, None, :, None] * m[:, :, None, :]).reshape(h * d, h * d)

    def forward(self, g, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        h, d = self.heads, self.head_dim
        q = {t: lin(x[t]).reshape(-1, h, d) for t, lin in self.q.items()}
        scores, values, peak = {}, {}, {}
        for rel in self.edge_types:
            s, _, t = rel
            key, rg = relation_key(rel), g[rel]
            k = (self.k[s](x[s]) @ self._per_head(self.k_rel[key])).reshape(-1, h, d)
            values[rel] = (self.v[s](x[s]) @ self._per_head(self.v_rel[key])).reshape(-1, h, d)
            scores[rel] = sddmm(rg, k, q[t], "dot") * self.prior[key] / math.sqrt(d)
            # The largest score into each node, over every relation into its type: only a
            # shift that keeps exp() in range, so no gradient flows through it.
            top = edge_reduce(rg, scores[rel].detach(), "max")
            top = torch.where((rg.in_degrees() > 0).unsqueeze(-1), top, float("-inf"))
            peak[t] = top if t not in peak else torch.maximum(peak[t], top)
        total, agg = {}, {}
        for rel, e in scores.items():
            t, rg = rel[2], g[rel]
            w = torch.exp(e - gather_dst(rg, peak[t]))
            part_total, part = edge_reduce(rg, w, "sum"), spmm(rg, values[rel], "sum", edge_weight=w)
            total[t] = part_total if t not in total else total[t] + part_total
            agg[t] = part if t not in agg else agg[t] + part
        out = {}
        for t in q:
            if t in agg:
                norm = torch.where(total[t] > 0, total[t], torch.ones_like(total[t]))
                m = (agg[t] / norm.unsqueeze(-1)).reshape(-1, h * d)
            else:  # no relation into this type: nothing to attend to
                m = torch.zeros_like(x[t])
            gate = torch.sigmoid(self.skip[t])
            out[t] = gate * self.a[t](F.gelu(m)) + (1 - gate) * x[t]
        return out


class HGT(TypedNet):
    """Per-type input linears to ``hidden`` (ReLU), ``layers`` :class:`HGTLayer` with
    per-type node dropout between them, and a linear from the target's rows to
    ``num_classes`` logits."""

    def __init__(self, node_counts: Mapping[str, int], edge_types: Iterable[Sequence[str]],
                 in_dims: Mapping[str, int], target: str, num_classes: int, hidden: int = 64, layers: int = 2,
                 heads: int = 4, dropout: float = 0.0, embed_dim: int = 128,
                 rows: Mapping[str, torch.Tensor] | None = None):
        super().__init__(node_counts, edge_types, in_dims, target, embed_dim, layers, rows)
        self.inp = nn.ModuleDict({t: nn.Linear(self.in_dims[t], hidden) for t in self.reads})
        self.layers = nn.ModuleList(HGTLayer(hidden, heads, self.computes[i], self.edge_types) for i in range(layers))
        self.drops = self.dropouts(dropout, layers)
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, g, x: dict[str, torch.Tensor]) -> torch.Tensor:
        feats = self.features(x)
        h = {t: F.relu(lin(feats[t])) for t, lin in self.inp.items()}
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            h = layer(g, h)
            if i < last and self.drops is not None:
                h = self.drop(self.drops[i], g, h)
        return self.out(h[self.target])


def build_typed(model: str, node_counts: Mapping[str, int], edge_types: Iterable[Sequence[str]],
                in_dims: Mapping[str, int], target: str, num_classes: int, hidden: int, layers: int, heads: int,
                dropout: float, embed_dim: int, rows: Mapping[str, torch.Tensor] | None = None) -> TypedNet:
    """The typed model ``model`` ("rgcn" or "hgt") with these options (see the classes);
    with ``rows``, a worker's: only its rows of the node tables."""
    if model == "rgcn":
        return RGCN(node_counts, edge_types, in_dims, target, num_classes, hidden, layers, dropout, embed_dim, rows)
    if model == "hgt":
        return HGT(node_counts, edge_types, in_dims, target, num_classes, hidden, layers, heads, dropout, embed_dim,
                   rows)
    raise ValueError(f"typed models are {', '.join(TYPED_MODELS)}, got {model!r}")
