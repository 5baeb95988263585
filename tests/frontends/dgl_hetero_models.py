"""DGL heterogeneous models for the tests and the DGL heterogeneous zoo, and their worker side
(imported by the pool's workers too).

The oracle is DGL itself: each model run eagerly on a ``dgl.heterograph`` (or, for the
layers that take a homogeneous graph with types, ``dgl.to_homogeneous`` of it). The compiled
model gets the same features and ``sc.HeteroGraph.from_dgl(hg)`` (``sc.Graph.from_dgl``) on
one machine, or a worker's shard of its partition.

:class:`RGCN` is DGL's ogbn-mag RGCN example model (``examples/pytorch/ogb/ogbn-mag/
hetero_rgcn.py``), written here for full-graph training: per layer a ``HeteroGraphConv`` of
``GraphConv(norm="right", weight=False, bias=False)`` with the relation weights passed
through ``mod_kwargs``, a self-loop weight per node type, and a ``HeteroEmbedding`` for the
featureless types, looked up by each type's node ids.
"""

from __future__ import annotations

import contextlib

import dgl
import dgl.function as fn
import dgl.nn as dglnn
import torch
import torch.nn.functional as F
from dgl.nn.functional import edge_softmax
from torch import nn

import sarcompile as sc

DT = torch.float64
F_IN = 4


# -- graphs ------------------------------------------------------------------------------------
def homogeneous(hg: dgl.DGLGraph) -> tuple[dgl.DGLGraph, torch.Tensor, torch.Tensor]:
    """``hg`` as one graph, as ``dgl.to_homogeneous`` numbers it (types one after another,
    relations' edges in order), and the type of each node and edge."""
    whole = sc.HeteroGraph.from_dgl(hg)
    flat = whole.to_homogeneous()
    counts = torch.tensor([whole[rel].num_edges for rel in whole.edge_types], dtype=torch.long)
    etype = torch.repeat_interleave(torch.arange(len(counts)), counts)
    return dgl.graph((flat.src, flat.dst), num_nodes=flat.num_nodes), whole.node_type_ids(), etype


# -- models ------------------------------------------------------------------------------------
class HeteroGCN(nn.Module):
    """Two ``HeteroGraphConv`` layers of ``GraphConv`` (sum, then mean over the relations),
    with a ``HeteroLinear`` per-type skip."""

    def __init__(self, hg: dgl.DGLGraph, hidden: int = 5):
        super().__init__()
        self.skip = dglnn.HeteroLinear({t: F_IN for t in hg.ntypes}, hidden)
        self.conv1 = dglnn.HeteroGraphConv({r: dglnn.GraphConv(F_IN, hidden, norm="both") for r in hg.etypes},
                                           aggregate="sum")
        self.conv2 = dglnn.HeteroGraphConv({r: dglnn.GraphConv(hidden, 3, norm="right") for r in hg.etypes},
                                           aggregate="mean")

    def forward(self, g, x):
        h = self.skip(x)
        for t, v in self.conv1(g, x).items():
            h[t] = h[t] + torch.relu(v)
        return self.conv2(g, h)


class FlatGAT(nn.Module):
    """GATConv with its heads concatenated, so it combines with the other relations' outputs."""

    def __init__(self, in_feats, out_feats: int, heads: int, residual: bool):
        super().__init__()
        self.gat = dglnn.GATConv(in_feats, out_feats, num_heads=heads, allow_zero_in_degree=True, residual=residual)

    def forward(self, g, feat):
        return self.gat(g, feat).flatten(1)


# Bugs of DGL 2.1 the models step around, so that DGL stays a valid oracle: its max reduction
# over a graph with no edges sends the gradient of every row to source node 0 (the value is 0,
# as it should be), so models use max only on relations with edges; and its edge_softmax over a
# heterograph (the SDDMMHetero kernel) crashes the process at times (segfault), always when some
# relation has no edges, so the eager oracle computes it with DGL's edge_softmax on the graph's
# homogeneous form, as DGL's maintainers advise for a softmax over all relations.
def _max_ok(hg: dgl.DGLGraph, rel) -> bool:
    return hg.num_edges(rel) > 0


def softmax_via_homogeneous(g: dgl.DGLGraph, logits: dict) -> dict:
    """DGL's ``edge_softmax(g, logits)`` on a heterograph, computed eagerly with its
    homogeneous ``edge_softmax`` on the relations' edges numbered in one graph."""
    offset = dict(zip(g.ntypes, torch.cumsum(torch.tensor([0] + [g.num_nodes(t) for t in g.ntypes]), 0).tolist()))
    ends = [g.edges(etype=rel) for rel in g.canonical_etypes]
    src = torch.cat([u + offset[rel[0]] for rel, (u, _) in zip(g.canonical_etypes, ends)])
    dst = torch.cat([v + offset[rel[2]] for rel, (_, v) in zip(g.canonical_etypes, ends)])
    flat = dgl.graph((src, dst), num_nodes=sum(g.num_nodes(t) for t in g.ntypes))
    out = edge_softmax(flat, torch.cat([logits[rel] for rel in g.canonical_etypes]))
    return dict(zip(g.canonical_etypes, out.split([g.num_edges(rel) for rel in g.canonical_etypes])))


class HeteroSageGat(nn.Module):
    """``HeteroGraphConv`` of SAGEConv (pool, gcn, mean) and GATConv (one ``in_feats``, or a
    pair on a relation between two types), combined by max."""

    def __init__(self, hg: dgl.DGLGraph, hidden: int = 6):
        super().__init__()
        mods = {}
        for i, (s, r, d) in enumerate(hg.canonical_etypes):
            if i % 2:
                # (DGL's residual map fails on a type with no nodes: view(0, -1, out))
                mods[r] = FlatGAT((F_IN, F_IN) if s != d else F_IN, hidden // 2, 2, residual=hg.num_nodes(d) > 0)
            else:
                aggr = ("pool", "gcn", "mean")[i // 2 % 3]
                mods[r] = dglnn.SAGEConv(F_IN, hidden, aggr if aggr != "pool" or _max_ok(hg, (s, r, d)) else "mean")
        self.conv = dglnn.HeteroGraphConv(mods, aggregate="max")

    def forward(self, g, x):
        return self.conv(g, x)


class RelGraph(nn.Module):
    """Two ``RelGraphConv`` layers (basis, then block-diagonal) on a homogeneous graph with edge types."""

    def __init__(self, num_rels: int, hidden: int = 4):
        super().__init__()
        self.conv1 = dglnn.RelGraphConv(F_IN, hidden, num_rels, regularizer="basis", num_bases=2, self_loop=True)
        self.conv2 = dglnn.RelGraphConv(hidden, 4, num_rels, regularizer="bdd", num_bases=2, self_loop=True)

    def forward(self, g, x, ntype, etype):
        return self.conv2(g, torch.relu(self.conv1(g, x, etype)), etype)


class HGT(nn.Module):
    """Two ``HGTConv`` layers on a homogeneous graph with node and edge types (the second
    with a layer norm and a residual map)."""

    def __init__(self, num_ntypes: int, num_rels: int):
        super().__init__()
        self.conv1 = dglnn.HGTConv(F_IN, 2, 2, num_ntypes, num_rels, dropout=0.0)
        self.conv2 = dglnn.HGTConv(F_IN, 3, 2, num_ntypes, num_rels, dropout=0.0, use_norm=True)

    def forward(self, g, x, ntype, etype):
        return self.conv2(g, self.conv1(g, x, ntype, etype), ntype, etype)


class RelGraphConvLayer(nn.Module):
    """A layer of DGL's ogbn-mag RGCN: ``GraphConv(norm="right")`` per relation with the
    relation's weight given in ``mod_kwargs``, summed over the relations into a type, plus the
    type's self-loop map, an activation and dropout."""

    def __init__(self, in_feat: int, out_feat: int, ntypes: list[str], rel_names: list[str], activation=None,
                 dropout: float = 0.0):
        super().__init__()
        self.rel_names, self.activation = rel_names, activation
        self.conv = dglnn.HeteroGraphConv({
            rel: dglnn.GraphConv(in_feat, out_feat, norm="right", weight=False, bias=False) for rel in rel_names})
        self.weight = nn.ModuleDict({rel: nn.Linear(in_feat, out_feat, bias=False) for rel in rel_names})
        self.loop_weights = nn.ModuleDict({t: nn.Linear(in_feat, out_feat, bias=True) for t in ntypes})
        self.dropout = nn.Dropout(dropout)

    def forward(self, g, inputs: dict) -> dict:
        g = g.local_var()
        weights = {rel: {"weight": self.weight[rel].weight.T} for rel in self.rel_names}
        inputs_dst = {t: v[: g.number_of_dst_nodes(t)] for t, v in inputs.items()}
        hs = self.conv(g, inputs, mod_kwargs=weights)
        out = {}
        for t, h in hs.items():
            h = h + self.loop_weights[t](inputs_dst[t])
            if self.activation is not None:
                h = self.activation(h)
            out[t] = self.dropout(h)
        return out


class RGCN(nn.Module):
    """DGL's ogbn-mag RGCN example model for full-graph training (see the module docstring):
    ``forward(g, feat_dict)`` with features for ``feat_types`` and a learnable embedding per
    node for every other type (``num_nodes`` gives their counts)."""

    def __init__(self, ntypes: list[str], rel_names: list[str], num_nodes: dict[str, int], in_dim: int,
                 out_dim: int, hidden: int = 64, feat_types: tuple[str, ...] = ("paper",), dropout: float = 0.5):
        super().__init__()
        self.embed_types = [t for t in ntypes if t not in feat_types]
        self.embed = dglnn.HeteroEmbedding({t: num_nodes[t] for t in self.embed_types}, in_dim)
        rels = sorted(set(rel_names))
        self.layers = nn.ModuleList([
            RelGraphConvLayer(in_dim, hidden, ntypes, rels, activation=F.relu, dropout=dropout),
            RelGraphConvLayer(hidden, out_dim, ntypes, rels),
        ])

    def forward(self, g, feat_dict: dict) -> dict:
        h = dict(feat_dict)
        h.update(self.embed({t: g.nodes(t) for t in self.embed_types}))
        for layer in self.layers:
            h = layer(g, h)
        return h


class UserCode(nn.Module):
    """DGL code over a heterograph written by hand: per-type fields, attention scores per
    relation soft-maxed over each node's in-edges of all relations, and ``multi_update_all``
    with sum, max (empty neighbourhoods are -inf until combined, then 0) and stack."""

    def __init__(self, hg: dgl.DGLGraph, hidden: int = 4):
        super().__init__()
        self.lin = dglnn.HeteroLinear({t: F_IN for t in hg.ntypes}, hidden)
        self.max_rels = [rel for rel in hg.canonical_etypes if _max_ok(hg, rel)]
        self.eager_oracle = False  # True: the typed edge_softmax as the eager oracle computes it

    def forward(self, g, x):
        with g.local_scope():
            h = self.lin(x)
            for t in g.ntypes:
                g.nodes[t].data["h"] = h[t]
            scores = {}
            for rel in g.canonical_etypes:
                g.apply_edges(fn.u_dot_v("h", "h", "s"), etype=rel)
                scores[rel] = g.edges[rel].data["s"]
            if len(scores) == 1:  # DGL takes the tensor of a graph's one relation as it is
                attention = {rel: edge_softmax(g, s) for rel, s in scores.items()}
            elif self.eager_oracle:
                attention = softmax_via_homogeneous(g, scores)
            else:
                attention = edge_softmax(g, scores)
            for rel, a in attention.items():
                g.edges[rel].data["a"] = a
            g.multi_update_all({rel: (fn.u_mul_e("h", "a", "m"), fn.sum("m", "z")) for rel in g.canonical_etypes},
                               "sum")
            g.multi_update_all({rel: (fn.copy_u("h", "m"), fn.max("m", "y")) for rel in self.max_rels}, "max")
            g.multi_update_all({rel[1]: (fn.copy_u("h", "m"), fn.mean("m", "w")) for rel in g.canonical_etypes},
                               "stack")
            out = {}
            for t in sorted({d for _, _, d in g.canonical_etypes}):
                data = g.nodes[t].data
                z = data["z"] + torch.sin(data["y"]) if "y" in data else data["z"]
                out[t] = torch.cat([z, data["w"].flatten(1)], dim=1)
            return out


MODELS = ("HeteroGraphConv(GraphConv)", "HeteroGraphConv(SAGE+GAT)", "RelGraphConv", "HGTConv", "RGCN", "user code")
HOMOGENEOUS = ("RelGraphConv", "HGTConv")  # these take dgl.to_homogeneous(hg) with node and edge types


def build(name: str, hg: dgl.DGLGraph, seed: int = 0) -> nn.Module:
    """One of :data:`MODELS` for ``hg``, float64, every parameter drawn at random (DGL starts
    biases and some weights at zero or one)."""
    torch.manual_seed(seed)
    if name == "HeteroGraphConv(GraphConv)":
        model = HeteroGCN(hg)
    elif name == "HeteroGraphConv(SAGE+GAT)":
        model = HeteroSageGat(hg)
    elif name == "RelGraphConv":
        model = RelGraph(len(hg.canonical_etypes))
    elif name == "HGTConv":
        model = HGT(len(hg.ntypes), len(hg.canonical_etypes))
    elif name == "RGCN":
        model = RGCN(hg.ntypes, hg.etypes, {t: hg.num_nodes(t) for t in hg.ntypes}, F_IN, 3, hidden=5, dropout=0.0)
    elif name == "user code":
        model = UserCode(hg)
    else:
        raise KeyError(name)
    model = model.double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, dtype=DT) * 0.5)
    return model


@contextlib.contextmanager
def as_oracle(model: nn.Module):
    """``model`` as the eager oracle runs it (see :func:`softmax_via_homogeneous`)."""
    flagged = [m for m in model.modules() if hasattr(m, "eager_oracle")]
    for m in flagged:
        m.eager_oracle = True
    try:
        yield model
    finally:
        for m in flagged:
            m.eager_oracle = False


def features(name: str, hg: dgl.DGLGraph, seed: int) -> dict:
    """The inputs: features per type (only ``paper`` for RGCN), or for the homogeneous
    layers one tensor and the node and edge types."""
    gen = torch.Generator().manual_seed(seed)
    if name in HOMOGENEOUS:
        g, ntype, etype = homogeneous(hg)
        return {"x": torch.randn(g.num_nodes(), F_IN, generator=gen, dtype=DT), "ntype": ntype, "etype": etype}
    types = ["paper"] if name == "RGCN" else hg.ntypes
    return {"x": {t: torch.randn(hg.num_nodes(t), F_IN, generator=gen, dtype=DT) for t in types}}


def loss_weights(out, seed: int):
    gen = torch.Generator().manual_seed(seed + 1)
    if isinstance(out, dict):
        return {t: torch.randn(v.shape, generator=gen, dtype=v.dtype) for t, v in out.items()}
    return torch.randn(out.shape, generator=gen, dtype=out.dtype)


def _is_table(name: str) -> bool:
    return name.startswith("embed.")


def step(model: nn.Module, graph, inputs: dict, weights, ids=None, edge_ids=None) -> dict:
    """Forward, a loss weighted per row, backward. On a worker ``ids`` names its rows (per
    type, or of the homogeneous graph) and ``edge_ids`` its edges of the homogeneous graph;
    ``weights`` and ``inputs`` are the whole graph's."""
    rows = (lambda t, v: v) if ids is None else (lambda t, v: v[ids[t] if isinstance(ids, dict) else ids])
    x = inputs["x"]
    if isinstance(x, dict):
        x = {t: rows(t, v).clone().requires_grad_() for t, v in x.items()}
        out = model(graph, x)
        loss = sum((v * rows(t, weights[t])).sum() for t, v in sorted(out.items()))
    else:
        x = rows(None, x).clone().requires_grad_()
        etype = inputs["etype"] if edge_ids is None else inputs["etype"][edge_ids]
        out = model(graph, x, rows(None, inputs["ntype"]), etype)
        loss = (out * rows(None, weights)).sum()
    model.zero_grad()
    loss.backward()
    grad = lambda v: torch.zeros_like(v) if v.grad is None else v.grad  # noqa: E731 (an unused input has none)
    return {
        "out": {t: v.detach() for t, v in out.items()} if isinstance(out, dict) else out.detach(),
        "x_grad": {t: grad(v) for t, v in x.items()} if isinstance(x, dict) else grad(x),
        # (a parameter no row reached has no gradient: zero, as on a worker without rows)
        "param_grads": {k: sc.global_sum(grad(p)) for k, p in model.named_parameters() if not _is_table(k)},
        # a node table's rows are the worker's own: its gradient rows too
        "table_grads": {k: grad(p).clone() for k, p in model.named_parameters() if _is_table(k)},
    }


def table_type(name: str) -> str:
    """The node type of a table parameter (``embed.embeds.<type>.weight``)."""
    return name.split(".")[2]


def run_worker(rank: int, world_size: int, payload: dict) -> dict:
    """One worker: its part of the partition, one step of the compiled model."""
    part = sc.load_partition(payload["dir"], rank=rank, world_size=world_size)
    model = sc.distribute(payload["model"])
    edge_ids = None if isinstance(part.global_ids, dict) else part.graph.edge_ids
    result = step(model, part.graph, payload["inputs"], payload["weights"], part.global_ids, edge_ids)
    result["ids"] = part.global_ids
    return result
