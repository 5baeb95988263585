"""The heterogeneous DGL zoo: does every heterogeneous DGL layer and model compile exactly, or
is it refused clearly?

The heterogeneous twin of ``benchmarks/dgl_zoo.py``. Every ``dgl.nn`` class for graphs with
node and edge types, and the heterograph API DGL code uses, each run as a DGL user runs it:

* on the heterograph, ``model(g, feat_dict[, edge_dict])``: ``HeteroGraphConv`` over every
  conv that takes a ``(source, destination)`` pair (edge features through ``mod_args``) and
  its ``aggregate`` variants, ``HeteroLinear``, ``HeteroEmbedding`` (looked up by
  ``g.nodes(ntype)`` or used as ``.weight``), DGL's ogbn-mag RGCN example model (from
  ``tests/frontends/dgl_hetero_models.py``) and an RGCN over ``WeightBasis``, and
  hand-written heterograph code: ``multi_update_all`` with every cross reducer,
  ``update_all`` over all relations, ``apply_edges`` per relation, ``edge_softmax`` over the
  relations;
* on the heterograph's homogeneous form (one graph, a type per node and per edge, as
  ``dgl.to_homogeneous`` numbers it): ``RelGraphConv``, ``HGTConv``, ``TypedLinear``.

Each is compared with ``sc.distribute(model)`` on one machine (``sc.HeteroGraph.from_dgl`` /
``sc.Graph.from_dgl``) and on 1, 2 and 3 gloo workers (``sc.partition`` + ``sc.load_partition``,
random parts). Graph: paper / author / field / institution with writes, cites (self-loops,
duplicate edges), has_topic, affiliated_with and their reverses, isolated nodes of every
type, on 3 workers types and relations with no rows on a worker; float64; features and
float edge features require grad.

DGL 2.1's own ``edge_softmax`` on a heterograph crashes the process at times (a segfault in
its ``SDDMMHetero`` kernel, always when a relation has no edges), so the eager side computes
that softmax with DGL's ``edge_softmax`` on the homogeneous form (the equivalent DGL's
maintainers advise); everything else eager is DGL's own.

Each case ends as exactly one of

* ``exact``: outputs of every type, the gradients of every type's features, of the edge
  features, of every parameter and of every node table's rows equal eager DGL within 1e-9
  (relative to max(1, |eager|)) everywhere;
* ``refused``: a ``sarcompile.SarcompileError`` subclass was raised (class, first line);
* ``n/a``: eager DGL itself fails here, or the class is no layer or model over a graph's
  node features (explainers, random-walk embeddings);
* ``WRONG``: compiled and ran, but differs (max abs difference per run);
* ``CRASH``: any other exception from the compiled model (type and message).

Usage (DGL runs in the torch 2.2 environment of ``scripts/dgl_env.sh``)::

    DGLBACKEND=pytorch python benchmarks/dgl_hetero_zoo.py --table   # full sweep -> results/dgl_hetero_zoo.json, .md
    python benchmarks/dgl_hetero_zoo.py --only RGCN "HeteroGraphConv(GATConv)" --table   # a subset (not saved)
    python benchmarks/dgl_hetero_zoo.py --load --table                # print the table of the saved results
    python benchmarks/dgl_hetero_zoo.py --load --summary              # ... in the README's shorter form

The workers are ``benchmarks/zoo_pool.py``'s pool, running this zoo's cases; what judges a
case (the outcomes, the detail), the table and the command line are ``benchmarks/zoo_sweep.py``'s,
shared with the other zoos.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("DGLBACKEND", "pytorch")

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "frontends"))  # the tests' models (DGL's ogbn-mag RGCN)
import zoo_sweep  # noqa: E402  (the zoos' judging, sweep and command line, shared)
from dgl_zoo import FRONTEND, float64_default  # noqa: E402
from zoo_pool import Pool, describe_error, in_server  # noqa: E402
from zoo_sweep import (  # noqa: E402, F401  (the outcomes: tests read them)
    CRASH, DT, EXACT, NA, REFUSED, WORLD_SIZES, WRONG, Record, diff,
)

NODES = {"paper": 60, "author": 40, "field": 8, "institution": 6}
ISOLATED = {"paper": 3, "author": 2, "field": 1, "institution": 1}  # the last nodes of each type: no edges
EDGE_DIM = 3
W_COLS = 64  # width of the loss weights; outputs use their first columns
RESULTS = HERE / "results" / "dgl_hetero_zoo.json"
# The heterograph-capable classes of dgl.nn, each swept (tests/frontends/test_dgl_hetero_zoo.py checks it).
HETERO_CLASSES = ("HeteroGraphConv", "HeteroLinear", "HeteroEmbedding", "RelGraphConv", "HGTConv", "TypedLinear",
                  "WeightBasis", "CuGraphRelGraphConv", "HeteroGNNExplainer", "HeteroPGExplainer", "HeteroSubgraphX",
                  "MetaPath2Vec")


def _models():
    import dgl_hetero_models

    return dgl_hetero_models


# --- the graph and the inputs --------------------------------------------------------------
def make_edges() -> dict[tuple[str, str, str], tuple[torch.Tensor, torch.Tensor]]:
    """The relations: random edges among the non-isolated nodes of their types, ``cites``
    with self-loops and duplicate edges, each relation's reverse named ``rev_<name>``."""
    gen = torch.Generator().manual_seed(2024)
    edges = {}
    for (s, r, d), m in {("author", "writes", "paper"): 120, ("paper", "cites", "paper"): 150,
                         ("paper", "has_topic", "field"): 70, ("author", "affiliated_with", "institution"): 45}.items():
        src = torch.randint(0, NODES[s] - ISOLATED[s], (m,), generator=gen)
        dst = torch.randint(0, NODES[d] - ISOLATED[d], (m,), generator=gen)
        if r == "cites":
            loops = torch.randperm(NODES[s] - ISOLATED[s], generator=gen)[:10]
            dup = torch.randint(0, m, (15,), generator=gen)
            src, dst = torch.cat([src, loops, src[dup]]), torch.cat([dst, loops, dst[dup]])
        edges[(s, r, d)] = (src, dst)
        if s != d:
            edges[(d, f"rev_{r}", s)] = (dst, src)
    return edges


def hetero_graph():
    import dgl

    return dgl.heterograph(make_edges(), num_nodes_dict=NODES)


@dataclass
class Inputs:
    x: dict[str, torch.Tensor]  # per node type
    w: dict[Any, torch.Tensor]  # loss weights per node type and per relation
    edge: dict[str, dict[tuple, torch.Tensor]]  # per kind, per relation, in DGL's edge order
    x_h: torch.Tensor  # the homogeneous form: features, loss weights, node and edge types
    w_h: torch.Tensor
    ntype: torch.Tensor
    etype: torch.Tensor


_INPUTS: Inputs | None = None


def inputs() -> Inputs:
    global _INPUTS
    if _INPUTS is None:
        _INPUTS = make_inputs()
    return _INPUTS


def make_inputs() -> Inputs:
    hg = hetero_graph()
    f = _models().F_IN
    gen = torch.Generator().manual_seed(7)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=DT)  # noqa: E731
    x = {t: rand(hg.num_nodes(t), f) for t in hg.ntypes}
    w = {t: rand(hg.num_nodes(t), W_COLS) for t in hg.ntypes}
    w.update({rel: rand(hg.num_edges(rel), W_COLS) for rel in hg.canonical_etypes})
    edge = {
        "attr": {rel: rand(hg.num_edges(rel), EDGE_DIM) for rel in hg.canonical_etypes},
        "attr_f": {rel: rand(hg.num_edges(rel), f) for rel in hg.canonical_etypes},  # GINEConv: as wide as the nodes
        "pweight": {rel: torch.rand(hg.num_edges(rel), generator=gen, dtype=DT) + 0.1 for rel in hg.canonical_etypes},
        "pseudo": {rel: torch.rand(hg.num_edges(rel), 2, generator=gen, dtype=DT) for rel in hg.canonical_etypes},
        "dist": {rel: torch.rand(hg.num_edges(rel), 1, generator=gen, dtype=DT) * 2 for rel in hg.canonical_etypes},
    }
    _, ntype, etype = _models().homogeneous(hg)
    order = [t for t in hg.ntypes]  # the homogeneous form numbers the types in this order
    return Inputs(x, w, edge, torch.cat([x[t] for t in order]), torch.cat([w[t] for t in order]), ntype, etype)


# --- the models a DGL user writes ----------------------------------------------------------
def mlp(d_in: int, d_out: int, hidden: int = 8) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


class Conv(nn.Module):
    """``HeteroGraphConv`` with ``make(src_type, dst_type)`` on every relation; edge features,
    when given, to each relation's module as ``mod_args`` (or as ``mod_kwargs[keyword]``)."""

    def __init__(self, make: Callable[[str, str], nn.Module], aggregate: Any = "sum", keyword: str | None = None):
        super().__init__()
        hg = hetero_graph()
        self.keyword = keyword
        self.conv = dgl_nn().HeteroGraphConv({r: make(s, d) for s, r, d in hg.canonical_etypes}, aggregate=aggregate)

    def forward(self, g, x, e=None):
        if e is None:
            return self.conv(g, x)
        if self.keyword:
            return self.conv(g, x, mod_kwargs={rel[1]: {self.keyword: v} for rel, v in e.items()})
        return self.conv(g, x, mod_args={rel[1]: (v,) for rel, v in e.items()})


class Lin(nn.Module):
    """``HeteroLinear`` on the node features (or, with ``edge``, on the edge features by relation)."""

    def __init__(self, edge: bool = False):
        super().__init__()
        hg, f = hetero_graph(), _models().F_IN
        sizes = {rel: EDGE_DIM for rel in hg.canonical_etypes} if edge else {t: f for t in hg.ntypes}
        self.edge = edge
        self.lin = dgl_nn().HeteroLinear(sizes, 5)

    def forward(self, g, x, e=None):
        return self.lin(e if self.edge else x)


class Embedded(nn.Module):
    """``HeteroEmbedding``, a learnable row per node of every type, added to the features
    and convolved: looked up by ``g.nodes(ntype)`` (``lookup="nodes"``), by all ids
    (``lookup="arange"``), or used as ``.weight``."""

    def __init__(self, lookup: str):
        super().__init__()
        hg, f = hetero_graph(), _models().F_IN
        self.lookup = lookup
        self.embed = dgl_nn().HeteroEmbedding({t: hg.num_nodes(t) for t in hg.ntypes}, f)
        self.conv = dgl_nn().HeteroGraphConv({r: dgl_nn().GraphConv(f, 5) for r in hg.etypes})

    def forward(self, g, x):
        if self.lookup == "nodes":
            h = self.embed({t: g.nodes(t) for t in g.ntypes})
        elif self.lookup == "arange":
            h = self.embed({t: torch.arange(g.num_nodes(t)) for t in g.ntypes})
        else:
            h = self.embed.weight
        return self.conv(g, {t: x[t] + h[t] for t in x})


class BasisRGCN(nn.Module):
    """An RGCN layer as DGL's earlier RGCN examples write it: per-relation weights from a
    ``WeightBasis``, given to ``GraphConv(weight=False)`` through ``mod_kwargs``."""

    def __init__(self):
        super().__init__()
        hg, f = hetero_graph(), _models().F_IN
        self.rels = list(hg.etypes)
        self.basis = __import__("dgl.nn.pytorch.utils", fromlist=["WeightBasis"]).WeightBasis((f, 5), 2, len(self.rels))
        self.conv = dgl_nn().HeteroGraphConv({r: dgl_nn().GraphConv(f, 5, norm="right", weight=False)
                                              for r in self.rels})

    def forward(self, g, x):
        weight = self.basis()
        return self.conv(g, x, mod_kwargs={r: {"weight": weight[i]} for i, r in enumerate(self.rels)})


class Messages(nn.Module):
    """``multi_update_all`` of ``copy_u`` with ``reduce`` on every relation, combined by
    ``cross``; or (``cross=None``) ``update_all`` over all relations at once."""

    def __init__(self, reduce: str, cross: str | None):
        super().__init__()
        self.reduce, self.cross = reduce, cross
        self.lin = dgl_nn().HeteroLinear({t: _models().F_IN for t in NODES}, 4)

    def forward(self, g, x):
        import dgl.function as fn

        with g.local_scope():
            g.ndata["h"] = self.lin(x)
            reduce = getattr(fn, self.reduce)("m", "o")
            if self.cross is None:
                g.update_all(fn.copy_u("h", "m"), reduce)
            else:
                g.multi_update_all({rel: (fn.copy_u("h", "m"), reduce) for rel in g.canonical_etypes}, self.cross)
            return {t: g.nodes[t].data["o"] for t in g.ntypes if "o" in g.nodes[t].data}


class EdgeFunctions(nn.Module):
    """Per relation, ``apply_edges`` with ``u_add_v`` and a function of the user's, then the
    per-edge values summed into the destinations (``copy_e``)."""

    def __init__(self):
        super().__init__()
        self.lin = dgl_nn().HeteroLinear({t: _models().F_IN for t in NODES}, 4)

    def forward(self, g, x, e):
        import dgl.function as fn

        with g.local_scope():
            g.ndata["h"] = self.lin(x)
            out = {}
            for rel in g.canonical_etypes:
                g.edges[rel].data["w"] = e[rel].unsqueeze(-1)
                g.apply_edges(fn.u_add_v("h", "h", "s"), etype=rel)
                g.apply_edges(lambda edges: {"t": torch.tanh(edges.data["s"]) * edges.data["w"]}, etype=rel)
                g[rel].update_all(fn.copy_e("t", "m"), fn.sum("m", "o"))
                out[rel[2]] = g.nodes[rel[2]].data["o"] + out.get(rel[2], 0)
            return out


class Homogeneous(nn.Module):
    """A layer on the homogeneous form: ``forward(g, x, ntype, etype)``."""

    def __init__(self, layer: nn.Module, takes: str):
        super().__init__()
        self.layer, self.takes = layer, takes

    def forward(self, g, x, ntype, etype):
        if self.takes == "etype":  # RelGraphConv
            return self.layer(g, x, etype)
        if self.takes == "ntype":  # TypedLinear: no graph
            return self.layer(x, ntype)
        return self.layer(g, x, ntype, etype)  # HGTConv


def dgl_nn():
    import dgl.nn as dglnn

    return dglnn


@dataclass
class Case:
    name: str
    group: str  # "layer", "variant" or "graph"
    build: Callable[[], nn.Module] | None  # the user's model; None: not applicable (na says why)
    kind: str = "hetero"  # "hetero": model(g, x_dict[, e_dict]); "homogeneous": model(g, x, ntype, etype)
    edge: str | None = None  # edge features per relation: a key of Inputs.edge
    na: str | None = None


def _cases() -> list[Case]:
    import dgl.nn as c

    m = _models()
    f = m.F_IN
    hg = hetero_graph()
    num_ntypes, num_rels = len(hg.ntypes), len(hg.canonical_etypes)

    def pair(s: str, d: str):
        return (f, f) if s != d else f

    explainer = "explains a trained model (masks over a graph's nodes and edges), not a layer over node features"
    layer = [
        Case("HeteroGraphConv(GraphConv)", "layer", lambda: Conv(lambda s, d: c.GraphConv(f, 5))),
        Case("HeteroGraphConv(SAGEConv)", "layer", lambda: Conv(lambda s, d: c.SAGEConv(pair(s, d), 5, "mean"))),
        Case("HeteroGraphConv(GATConv)", "layer", lambda: Conv(lambda s, d: c.GATConv(pair(s, d), 3, num_heads=2))),
        Case("HeteroGraphConv(GATv2Conv)", "layer", lambda: Conv(lambda s, d: c.GATv2Conv(pair(s, d), 3, num_heads=2))),
        Case("HeteroGraphConv(DotGatConv)", "layer",
             lambda: Conv(lambda s, d: c.DotGatConv(f, 3, num_heads=2, allow_zero_in_degree=True))),
        Case("HeteroGraphConv(GINConv)", "layer", lambda: Conv(lambda s, d: c.GINConv(mlp(f, f), "sum"))),
        Case("HeteroGraphConv(GINEConv)", "layer", lambda: Conv(lambda s, d: c.GINEConv(mlp(f, f))), edge="attr_f"),
        Case("HeteroGraphConv(EdgeConv)", "layer", lambda: Conv(lambda s, d: c.EdgeConv(f, 5))),
        Case("HeteroGraphConv(GMMConv)", "layer", lambda: Conv(lambda s, d: c.GMMConv(pair(s, d), 5, 2, 2)),
             edge="pseudo"),
        Case("HeteroGraphConv(NNConv)", "layer",
             lambda: Conv(lambda s, d: c.NNConv(pair(s, d), 5, nn.Linear(EDGE_DIM, f * 5), "mean")), edge="attr"),
        Case("HeteroGraphConv(CFConv)", "layer", lambda: Conv(lambda s, d: c.CFConv(f, 1, 8, 5)), edge="dist"),
        Case("HeteroGraphConv(AGNNConv)", "layer", lambda: Conv(lambda s, d: c.AGNNConv())),
        Case("HeteroGraphConv(EdgeGATConv)", "layer",
             lambda: Conv(lambda s, d: c.EdgeGATConv(f, EDGE_DIM, 3, num_heads=2)), edge="attr"),
        Case("HeteroGraphConv(TAGConv)", "layer", lambda: Conv(lambda s, d: c.TAGConv(f, 5, k=2))),
        Case("HeteroGraphConv(SGConv)", "layer", lambda: Conv(lambda s, d: c.SGConv(f, 5, k=2))),
        Case("HeteroLinear", "layer", lambda: Lin()),
        Case("HeteroEmbedding", "layer", lambda: Embedded("nodes")),
        Case("RelGraphConv", "layer", lambda: Homogeneous(c.RelGraphConv(f, 5, num_rels, "basis", 2, self_loop=True),
                                                          "etype"), kind="homogeneous"),
        Case("HGTConv", "layer", lambda: Homogeneous(c.HGTConv(f, 2, 2, num_ntypes, num_rels, dropout=0.0), "all"),
             kind="homogeneous"),
        Case("TypedLinear", "layer", lambda: Homogeneous(c.TypedLinear(f, 5, num_ntypes), "ntype"),
             kind="homogeneous"),
        Case("RGCN (DGL's ogbn-mag example)", "layer",
             lambda: m.RGCN(hg.ntypes, hg.etypes, NODES, f, 5, hidden=8, dropout=0.0)),
        Case("RGCN (DGL's ogbn-mag example, dropout=0.5)", "layer",
             lambda: m.RGCN(hg.ntypes, hg.etypes, NODES, f, 5, hidden=8, dropout=0.5)),
        Case("WeightBasis (RGCN with bases)", "layer", lambda: BasisRGCN()),
        Case("CuGraphRelGraphConv", "layer", lambda: Homogeneous(c.CuGraphRelGraphConv(f, 5, num_rels), "etype"),
             kind="homogeneous"),
        Case("HeteroGNNExplainer", "layer", None, na=explainer),
        Case("HeteroPGExplainer", "layer", None, na=explainer),
        Case("HeteroSubgraphX", "layer", None, na=explainer),
        Case("MetaPath2Vec", "layer", None, na="learns node embeddings from random walks along a metapath, not a layer "
                                               "over node features"),
    ]
    variant = [
        Case("HeteroGraphConv(GraphConv, aggregate=mean)", "variant",
             lambda: Conv(lambda s, d: c.GraphConv(f, 5, norm="right"), "mean")),
        Case("HeteroGraphConv(GraphConv, aggregate=max)", "variant",
             lambda: Conv(lambda s, d: c.GraphConv(f, 5, norm="left"), "max")),
        Case("HeteroGraphConv(GraphConv, aggregate=min)", "variant",
             lambda: Conv(lambda s, d: c.GraphConv(f, 5, norm="none"), "min")),
        Case("HeteroGraphConv(GraphConv, aggregate=stack)", "variant", lambda: Conv(lambda s, d: c.GraphConv(f, 5),
                                                                                    "stack")),
        Case("HeteroGraphConv(GraphConv, aggregate=function)", "variant",
             lambda: Conv(lambda s, d: c.GraphConv(f, 5), _product)),
        Case("HeteroGraphConv(GraphConv, edge_weight)", "variant",
             lambda: Conv(lambda s, d: c.GraphConv(f, 5), keyword="edge_weight"), edge="pweight"),
        Case("HeteroGraphConv(SAGEConv, gcn)", "variant", lambda: Conv(lambda s, d: c.SAGEConv(f, 5, "gcn"))),
        Case("HeteroGraphConv(SAGEConv, pool)", "variant",
             lambda: Conv(lambda s, d: c.SAGEConv(pair(s, d), 5, "pool"))),
        Case("HeteroGraphConv(GATConv, residual)", "variant",
             lambda: Conv(lambda s, d: c.GATConv(pair(s, d), 3, num_heads=2, residual=True), "max")),
        Case("HeteroGraphConv(GATConv, edge_weight)", "variant",
             lambda: Conv(lambda s, d: c.GATConv(f, 3, num_heads=2), keyword="edge_weight"), edge="pweight"),
        Case("HeteroLinear(edge features)", "variant", lambda: Lin(edge=True), edge="attr"),
        Case("HeteroEmbedding(.weight)", "variant", lambda: Embedded("weight")),
        Case("HeteroEmbedding(torch.arange ids)", "variant", lambda: Embedded("arange")),
        Case("RelGraphConv(bdd)", "variant", lambda: Homogeneous(
            c.RelGraphConv(f, 4, num_rels, "bdd", 2, self_loop=True), "etype"), kind="homogeneous"),
        Case("RelGraphConv(no regularizer, layer_norm)", "variant", lambda: Homogeneous(
            c.RelGraphConv(f, 5, num_rels, layer_norm=True), "etype"), kind="homogeneous"),
        Case("HGTConv(use_norm, residual map)", "variant", lambda: Homogeneous(
            c.HGTConv(f, 3, 2, num_ntypes, num_rels, dropout=0.0, use_norm=True), "all"), kind="homogeneous"),
        Case("HGTConv(dropout=0.2)", "variant", lambda: Homogeneous(c.HGTConv(f, 2, 2, num_ntypes, num_rels), "all"),
             kind="homogeneous"),
        Case("TypedLinear(bdd)", "variant", lambda: Homogeneous(
            c.TypedLinear(f, 4, num_ntypes, regularizer="bdd", num_bases=2), "ntype"), kind="homogeneous"),
    ]
    graph = [
        Case("multi_update_all(sum, sum)", "graph", lambda: Messages("sum", "sum")),
        Case("multi_update_all(mean, mean)", "graph", lambda: Messages("mean", "mean")),
        Case("multi_update_all(max, max)", "graph", lambda: Messages("max", "max")),
        Case("multi_update_all(min, sum)", "graph", lambda: Messages("min", "sum")),
        Case("multi_update_all(max, min)", "graph", lambda: Messages("max", "min")),
        Case("multi_update_all(mean, stack)", "graph", lambda: Messages("mean", "stack")),
        Case("update_all over all relations (max)", "graph", lambda: Messages("max", None)),
        Case("update_all over all relations (mean)", "graph", lambda: Messages("mean", None)),
        Case("apply_edges per relation", "graph", lambda: EdgeFunctions(), edge="pweight"),
        Case("edge_softmax over the relations", "graph", lambda: m.UserCode(hg)),
    ]
    return layer + variant + graph


def _product(tensors: list, dsttype: str):
    """A HeteroGraphConv aggregate of the user's: the elementwise product of the relations' outputs."""
    out = tensors[0]
    for t in tensors[1:]:
        out = out * t
    return out


@functools.cache
def cases() -> dict[str, Case]:
    return {c.name: c for c in _cases()}


def swept_classes() -> set[str]:
    """The dgl.nn classes the sweep covers (each case's name up to its first parenthesis or space)."""
    return {name.split("(")[0].split(" ")[0] for name in cases()}


def build(name: str, seed: int = 0) -> nn.Module:
    """The case's model, float64, every parameter drawn at random (DGL starts some at zero)."""
    torch.manual_seed(seed)
    with float64_default():
        model = cases()[name].build().to(DT)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5)
    return model.train()


# --- running one model ---------------------------------------------------------------------
def _tables(model: nn.Module) -> set[str]:
    import sarcompile.graph.tables as tables

    return set(tables.find_node_tables(model, NODES))


def run_model(model: nn.Module, case: Case, graph: Any, args: dict, w: Any) -> dict:
    """Output and the gradients of ``sum(out * w)`` w.r.t. the features, the edge features,
    every parameter and every node table (eager and compiled alike)."""
    leaf = zoo_sweep.leaf
    leaves = {k: ({key: leaf(v) for key, v in a.items()} if isinstance(a, dict) else leaf(a))
              for k, a in args.items()}
    with float64_default():
        if case.kind == "homogeneous":
            out = model(graph, leaves["x"], leaves["ntype"], leaves["etype"])
        else:
            out = model(graph, leaves["x"]) if case.edge is None else model(graph, leaves["x"], leaves["e"])
        if isinstance(out, dict):
            loss = sum((v * zoo_sweep.loss_weight(v, w[k])).sum() for k, v in sorted(out.items(), key=str))
        elif isinstance(out, torch.Tensor):
            loss = (out * zoo_sweep.loss_weight(out, w)).sum()
        else:
            raise TypeError(f"the model returned {type(out).__name__}, not a tensor or a dict of tensors")
        model.zero_grad()
        if loss.requires_grad:
            loss.backward()
    # (an input or a table row nothing reached has no gradient: zero, as on a worker without rows)
    grad = lambda t: t.grad if t.grad is not None else torch.zeros_like(t)  # noqa: E731
    x, tables = leaves["x"], _tables(model)
    return {
        "out": {k: v.detach() for k, v in out.items()} if isinstance(out, dict) else out.detach(),
        "x_grad": {k: grad(v) for k, v in x.items()} if isinstance(x, dict) else grad(x),
        "edge_grad": {k: grad(v) for k, v in leaves["e"].items() if v.is_floating_point()} if "e" in leaves else {},
        "grads": zoo_sweep.param_grads(model, skip=tables),
        "table_grads": {k: grad(p).clone() for k, p in model.named_parameters() if k in tables},
    }


def eager_args(case: Case) -> dict:
    inp = inputs()
    if case.kind == "homogeneous":
        return {"x": inp.x_h, "ntype": inp.ntype, "etype": inp.etype}
    x = {"paper": inp.x["paper"]} if case.name.startswith("RGCN") else inp.x
    return {"x": x} if case.edge is None else {"x": x, "e": inp.edge[case.edge]}


def _items(got: dict, want: dict) -> list[tuple[str, Any, Any]]:
    """(what, got, want) for every output and gradient, dicts taken apart."""
    items = []
    for key, label in (("out", "output"), ("x_grad", "x grad"), ("edge_grad", "edge grad"), ("grads", "grad of"),
                       ("table_grads", "grad of table")):
        a, b = got.get(key), want.get(key)
        if isinstance(b, dict) or isinstance(a, dict):
            a, b = a or {}, b or {}
            if set(a) != set(b):
                items.append((f"{label}: keys differ {sorted(map(str, set(a) ^ set(b)))}", None, float("inf")))
                continue
            items += [(f"{label} {k}", a[k], b[k]) for k in b]
        else:
            items.append((label, a, b))
    return items


def compare(got: dict, want: dict) -> tuple[float, float, str]:
    """Max abs and relative difference over outputs and gradients, and where the worst is."""
    worst = (0.0, 0.0, "")
    for what, a, b in _items(got, want):
        m, r = (float("inf"), float("inf")) if isinstance(b, float) else diff(a, b)
        if r > worst[1] or (r == worst[1] == float("inf") and not worst[2]):
            worst = (m, r, what)
    return worst


# --- workers -------------------------------------------------------------------------------
def _worker_case(part, payload: dict) -> dict:
    """One case on a worker: its rows of the inputs, the compiled model, gradients synced."""
    import sarcompile as sc
    from sarcompile.graph.tables import table_type

    case = cases()[payload["name"]]
    model = build(case.name)
    model.load_state_dict(payload["state"])
    inp, ids, shard = inputs(), part.global_ids, part.graph
    full = eager_args(case)
    if case.kind == "homogeneous":
        args = {"x": full["x"][ids], "ntype": full["ntype"][ids], "etype": full["etype"][shard.edge_ids]}
        w = inp.w_h[ids]
        edge_ids = None
    else:
        edge_ids = {rel: shard[rel].edge_ids for rel in shard.edge_types}
        args = {"x": {t: v[ids[t]] for t, v in full["x"].items()}}
        if "e" in full:
            args["e"] = {rel: v[edge_ids[rel]] for rel, v in full["e"].items()}
        w = {k: v[ids[k]] if k in ids else v[edge_ids[k]] for k, v in inp.w.items()}
    try:
        r = run_model(zoo_sweep.distribute(model), case, shard, args, w)
        sc.sync_gradients(model)
        tables = _tables(model)
        r["grads"] = zoo_sweep.param_grads(model, skip=tables)
    except Exception as e:
        return {"error": describe_error(e)}
    r["ids"], r["edge_ids"] = ids, edge_ids
    r["table_types"] = {k: table_type(p) for k, p in model.named_parameters() if k in r["table_grads"]}
    return r


def _assemble(results: list[dict], want: dict) -> dict:
    """The workers' rows put back in the whole graph's order (NaN where none came)."""
    def put(like: torch.Tensor, pieces: list) -> torch.Tensor:
        out = torch.full_like(like, float("nan"))
        for ids, v in pieces:
            if v.shape[1:] == like.shape[1:]:
                out[ids] = v.to(out.dtype)
        return out

    def rows(r: dict, key: Any) -> torch.Tensor:
        """A worker's rows of node type / relation ``key`` (its nodes when None)."""
        if key is None:
            return r["ids"]
        return r["ids"][key] if key in r["ids"] else r["edge_ids"][key]

    got: dict = {}
    for key in ("out", "x_grad", "edge_grad"):
        w = want[key]
        if isinstance(w, dict):
            got[key] = {k: put(v, [(rows(r, k), r[key][k]) for r in results]) for k, v in w.items()}
        else:
            got[key] = put(w, [(rows(r, None), r[key]) for r in results])
    got["table_grads"] = {k: put(v, [(r["ids"][r["table_types"][k]], r["table_grads"][k]) for r in results])
                          for k, v in want["table_grads"].items()}
    return got


def reference(name: str) -> tuple[Record, dict | None, dict | None]:
    """Eager DGL and the compiled model on one machine; see ``zoo_sweep.reference``."""
    import sarcompile as sc

    case = cases()[name]
    inp = inputs()
    w = inp.w_h if case.kind == "homogeneous" else inp.w

    def eager(model: nn.Module) -> dict:
        graph = _models().homogeneous(hetero_graph())[0] if case.kind == "homogeneous" else hetero_graph()
        with _models().as_oracle(model):
            return run_model(model, case, graph, eager_args(case), w)

    def compiled(model: nn.Module) -> dict:
        hg = hetero_graph()
        homogeneous = case.kind == "homogeneous"
        g = sc.Graph.from_dgl(_models().homogeneous(hg)[0]) if homogeneous else sc.HeteroGraph.from_dgl(hg)
        return run_model(zoo_sweep.distribute(model), case, g, eager_args(case), w)

    return zoo_sweep.reference(case, build, eager, compiled, "DGL", compare)


def distributed(rec: Record, want: dict, state: dict, pool: Pool, part_dir: str) -> None:
    zoo_sweep.distributed(rec, want, pool, {"name": rec.name, "state": state, "dir": part_dir},
                          lambda results: _assemble(results, want), compare)


def sweep(names: list[str], world_sizes=WORLD_SIZES, log=print) -> list[Record]:
    import sarcompile as sc

    hg = hetero_graph()
    graphs = {"hetero": sc.HeteroGraph.from_dgl(hg), "homogeneous": sc.Graph.from_dgl(_models().homogeneous(hg)[0])}

    def partition(tmp: str, world_size: int, names: list[str]) -> dict[str, str]:
        """The graphs these cases run on, cut into ``world_size`` random parts under ``tmp``;
        each case's directory."""
        dirs = {}
        for kind in sorted({cases()[n].kind for n in names}):
            dirs[kind] = os.path.join(tmp, f"{kind}-w{world_size}")
            sc.partition(graphs[kind], world_size, dirs[kind], method="random", seed=1)
        return {n: dirs[cases()[n].kind] for n in names}

    return zoo_sweep.sweep(names, world_sizes, log, reference=reference, partition=partition,
                           distributed=distributed, width=48,
                           case=_worker_case, frontend=FRONTEND)


# --- output --------------------------------------------------------------------------------
_TITLES = {"layer": "heterogeneous `dgl.nn` layers and models", "variant": "option variants",
           "graph": "heterograph API in user code"}


def table(records: list[Record], meta: dict) -> str:
    compared = (f"float64, nodes {', '.join(f'{t} {n}' for t, n in NODES.items())}, {meta['edges']} edges in "
                f"{meta['relations']} relations; compared: one machine (`sc.HeteroGraph.from_dgl`) and")
    return zoo_sweep.table(records, meta, zoo_sweep.header(meta, "DGL heterogeneous zoo", FRONTEND, compared),
                           column="case", noun="cases", untagged={"layer"})


def summary(records: list[Record], meta: dict) -> str:
    header = zoo_sweep.header(meta, "DGL heterogeneous zoo", FRONTEND, "float64; one machine and", seconds=False)
    return zoo_sweep.summary(records, header, _TITLES, column="case", empty_tables=False)


def _describe() -> dict:
    hg = hetero_graph()
    return {"edges": hg.num_edges(), "relations": len(hg.canonical_etypes)}


def main(argv: list[str] | None = None) -> int:
    return zoo_sweep.main(argv, doc=__doc__, script=__file__, results=RESULTS, frontend=FRONTEND, cases=cases,
                          sweep=sweep, table=table, summary=summary, describe=_describe)


if in_server(__name__):  # the workers fork with every case built once
    zoo_sweep.build_each(cases(), build)

if __name__ == "__main__":
    sys.exit(main())
