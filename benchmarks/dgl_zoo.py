"""The DGL zoo: does every DGL layer compile exactly, or is it refused clearly?

The DGL twin of ``benchmarks/pyg_zoo.py``. For every class in ``dgl.nn.pytorch.conv.__all__``
(and a few option variants), build the model a DGL user writes -- ``forward(self, g, feat[,
edge_weight])`` around one layer with small constructor arguments -- run it eagerly on the
``DGLGraph``, and compare it with ``sc.distribute(model)`` on one machine
(``sc.Graph.from_dgl(g)``) and on 1, 2 and 3 gloo workers (``sc.partition(sc.Graph.from_dgl(g),
n, dir, node_data=..., method="random")`` + ``sc.load_partition``). Graph: 320 nodes with
isolated nodes, self-loops, duplicate edges and a hub; float64; features and float edge
features require grad.

DGL's GraphConv, GATConv, GATv2Conv, DotGatConv, EdgeGATConv, SGConv, AGNNConv, GMMConv,
EdgeConv and GCN2Conv refuse a graph with 0-in-degree nodes; the graph here has 20 isolated
nodes, so those layers are built with ``allow_zero_in_degree=True``, as a user would (adding
self-loops instead would change the graph the other layers see). EGATConv has no such option
and TWIRLSUnfoldingAndAttention divides by in-degrees (TWIRLSConv adds the self-loops itself), so
these two get the same graph with one self-loop per node; the variant ``GraphConv(self-loops
added)`` calls ``dgl.add_self_loop`` in forward, the other way a user gets past the check.

Each layer ends as exactly one of

* ``exact``: output, every parameter gradient, the input gradient and the edge-feature
  gradient equal eager DGL within 1e-9 (relative to max(1, |eager|)) everywhere;
* ``refused``: a ``sarcompile.SarcompileError`` subclass was raised (class, first line);
* ``n/a``: eager DGL itself fails here, or the layer needs inputs a node-level
  ``forward(g, feat)`` does not have (dense adjacency, coordinates, eigenvectors...);
* ``WRONG``: compiled and ran, but differs (max abs difference per run);
* ``CRASH``: any other exception from the compiled model (type and message).

Usage (DGL runs in the torch 2.2 environment of ``scripts/dgl_env.sh``)::

    DGLBACKEND=pytorch python benchmarks/dgl_zoo.py --table         # full sweep -> results/dgl_zoo.json, .md
    python benchmarks/dgl_zoo.py --only GraphConv SAGEConv --table  # a subset (not saved unless --out)
    python benchmarks/dgl_zoo.py --load --table                     # print the table of the saved results
    python benchmarks/dgl_zoo.py --load --summary                   # ... in the README's shorter form

The workers are ``benchmarks/zoo_pool.py``'s pool: a few ``torch.multiprocessing`` processes
per world size, in one gloo group on a FileStore, running many cases each. Every wait is
bounded. What judges a case (the outcomes, the detail), the table and the command line are
``benchmarks/zoo_sweep.py``'s, shared with the other zoos.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("DGLBACKEND", "pytorch")

import torch
import zoo_sweep
from torch import nn
from zoo_pool import Pool, in_server
from zoo_sweep import (  # noqa: F401  (the outcomes: tests read them)
    CRASH, DT, EXACT, NA, REFUSED, WORLD_SIZES, WRONG, Record,
)

N_NODES = 320
F_IN = 8
EDGE_DIM = 4
NUM_RELATIONS = 3
W_COLS = 64  # width of the per-node loss weights; outputs use their first columns
FRONTEND = "dgl"  # imported by the command and by every worker: it loads sarcompile's DGL front-end
RESULTS = Path(__file__).resolve().parent / "results" / "dgl_zoo.json"


# --- the graph and the inputs --------------------------------------------------------------
def make_graph(kind: str = "zoo") -> tuple[torch.Tensor, torch.Tensor]:
    """``src, dst`` on 320 nodes: random edges among nodes 0..299, nodes 300..319 isolated,
    30 self-loops, 40 duplicated edges, and a hub (node 7) with 150 in- and 150 out-edges;
    in shuffled order (the same graph as the PyG zoo's). ``kind="self-loops"``: the same
    with exactly one self-loop per node, last (``dgl.add_self_loop(dgl.remove_self_loop(g))``),
    for layers documented to take such a graph."""
    gen = torch.Generator().manual_seed(2024)
    m = 300
    src = torch.randint(0, m, (900,), generator=gen)
    dst = torch.randint(0, m, (900,), generator=gen)
    loops = torch.randperm(m, generator=gen)[:30]
    dup = torch.randint(0, 900, (40,), generator=gen)
    hub_in = torch.randperm(m, generator=gen)[:150]
    hub_out = torch.randperm(m, generator=gen)[:150]
    hub = torch.full((150,), 7)
    src = torch.cat([src, loops, src[dup], hub_in, hub])
    dst = torch.cat([dst, loops, dst[dup], hub, hub_out])
    order = torch.randperm(src.numel(), generator=gen)
    src, dst = src[order], dst[order]
    if kind == "self-loops":
        keep, loops = src != dst, torch.arange(N_NODES)
        src, dst = torch.cat([src[keep], loops]), torch.cat([dst[keep], loops])
    return src, dst


@dataclass
class Inputs:
    src: torch.Tensor
    dst: torch.Tensor
    x: torch.Tensor  # [N, F_IN]
    w: torch.Tensor  # [N, W_COLS] loss weights
    edge: dict[str, torch.Tensor]  # per-edge tensors by kind, in the original edge order


_INPUTS: dict[str, Inputs] = {}


def inputs(kind: str = "zoo") -> Inputs:
    if kind not in _INPUTS:
        _INPUTS[kind] = make_inputs(kind)
    return _INPUTS[kind]


def make_inputs(kind: str = "zoo") -> Inputs:
    src, dst = make_graph(kind)
    gen = torch.Generator().manual_seed(7)
    e = src.numel()
    edge = {
        # positive, some zero (a node whose in-weights are all zero has degree 0)
        "weight": torch.rand(e, generator=gen, dtype=DT) * torch.randint(0, 3, (e,), generator=gen),
        "attr": torch.randn(e, EDGE_DIM, generator=gen, dtype=DT),
        "pseudo": torch.rand(e, 2, generator=gen, dtype=DT),  # GMMConv's pseudo-coordinates
        "type": torch.randint(0, NUM_RELATIONS, (e,), generator=gen),
        "attr_f": torch.randn(e, F_IN, generator=gen, dtype=DT),  # GINEConv: as wide as the nodes
        "dist": torch.rand(e, 1, generator=gen, dtype=DT) * 2,  # AtomicConv / CFConv distances
        # positive: EdgeWeightNorm(norm='both'), and the layers that call it, refuse weights <= 0
        "pweight": torch.rand(e, generator=gen, dtype=DT) + 0.1,
    }
    return Inputs(src, dst, torch.randn(N_NODES, F_IN, generator=gen, dtype=DT),
                  torch.randn(N_NODES, W_COLS, generator=gen, dtype=DT), edge)


def dgl_graph(kind: str = "zoo"):
    import dgl

    inp = inputs(kind)
    return dgl.graph((inp.src, inp.dst), num_nodes=N_NODES)


# --- the models a DGL user writes ----------------------------------------------------------
class Plain(nn.Module):
    """``forward(g, feat)`` around one layer."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, g, feat):
        return self.layer(g, feat)


class WithEdge(nn.Module):
    """``forward(g, feat, e)`` around one layer: ``e`` by position, or by keyword."""

    def __init__(self, layer: nn.Module, keyword: str | None = None):
        super().__init__()
        self.layer, self.keyword = layer, keyword

    def forward(self, g, feat, e):
        if self.keyword:
            return self.layer(g, feat, **{self.keyword: e})
        return self.layer(g, feat, e)


class FirstOfTuple(nn.Module):
    """Layers returning ``(node_out, edge_out)``: the model uses the node output."""

    def __init__(self, layer: nn.Module, with_edge: bool = True):
        super().__init__()
        self.layer, self.with_edge = layer, with_edge

    def forward(self, g, feat, e=None):
        return (self.layer(g, feat, e) if self.with_edge else self.layer(g, feat))[0]


class WithX0(nn.Module):
    """GCN2Conv: ``layer(g, feat, feat_0)`` with the input as feat_0."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, g, feat):
        return self.layer(g, feat, feat)


class NormedWeights(nn.Module):
    """EdgeWeightNorm as its docs use it: normalise the edge weights, then GraphConv(norm='none')."""

    def __init__(self):
        super().__init__()
        import dgl.nn.pytorch.conv as c

        self.norm = c.EdgeWeightNorm(norm="both")
        self.conv = c.GraphConv(F_IN, F_IN, norm="none", allow_zero_in_degree=True)

    def forward(self, g, feat, edge_weight):
        return self.conv(g, feat, edge_weight=self.norm(g, edge_weight))


class Atomic(nn.Module):
    """AtomicConv: the first feature column as the atom type, edge distances."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, g, feat, dist):
        return self.layer(g, feat[:, :1], dist)


class HGT(nn.Module):
    """HGTConv on a homogeneous graph: one node type, the edge types given."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, g, feat, etype):
        ntype = torch.zeros_like(feat[:, 0], dtype=torch.long)
        return self.layer(g, feat, ntype, etype)


def mlp(d_in: int, d_out: int, hidden: int = 8) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


@dataclass
class Case:
    name: str
    group: str  # "conv" or "variant"
    build: Callable[[], nn.Module] | None  # the user's model; None: not applicable (na says why)
    edge: str | None = None  # per-edge argument: a key of Inputs.edge
    eval: bool = False
    na: str | None = None
    graph: str = "zoo"


def _cases() -> list[Case]:
    import dgl.nn.pytorch.conv as c

    f = F_IN
    z = dict(allow_zero_in_degree=True)
    dense = "takes a dense adjacency matrix, not a graph (forward(adj, feat))"
    conv = [
        Case("GraphConv", "conv", lambda: Plain(c.GraphConv(f, f, **z))),
        Case("EdgeWeightNorm", "conv", lambda: NormedWeights(), edge="pweight"),
        Case("GATConv", "conv", lambda: Plain(c.GATConv(f, f, num_heads=2, **z))),
        Case("GATv2Conv", "conv", lambda: Plain(c.GATv2Conv(f, f, num_heads=2, **z))),
        Case("EGATConv", "conv", lambda: FirstOfTuple(c.EGATConv(f, EDGE_DIM, f, EDGE_DIM, num_heads=2)),
             edge="attr", graph="self-loops"),
        Case("EdgeGATConv", "conv", lambda: WithEdge(c.EdgeGATConv(f, EDGE_DIM, f, num_heads=2, **z)),
             edge="attr"),
        Case("TAGConv", "conv", lambda: Plain(c.TAGConv(f, f, k=2))),
        Case("RelGraphConv", "conv", lambda: WithEdge(c.RelGraphConv(f, f, NUM_RELATIONS, regularizer="basis",
                                                                     num_bases=2)), edge="type"),
        Case("SAGEConv", "conv", lambda: Plain(c.SAGEConv(f, f, "mean"))),
        Case("SGConv", "conv", lambda: Plain(c.SGConv(f, f, k=2, **z))),
        Case("APPNPConv", "conv", lambda: Plain(c.APPNPConv(k=3, alpha=0.1))),
        Case("GINConv", "conv", lambda: Plain(c.GINConv(mlp(f, f), "sum"))),
        Case("GINEConv", "conv", lambda: WithEdge(c.GINEConv(mlp(f, f))), edge="attr_f"),
        Case("GatedGraphConv", "conv", lambda: Plain(c.GatedGraphConv(f, f, n_steps=2, n_etypes=1))),
        Case("GatedGCNConv", "conv", lambda: FirstOfTuple(c.GatedGCNConv(f, EDGE_DIM, f)), edge="attr"),
        Case("GMMConv", "conv", lambda: WithEdge(c.GMMConv(f, f, dim=2, n_kernels=2, **z)), edge="pseudo"),
        Case("ChebConv", "conv", lambda: Plain(c.ChebConv(f, f, k=3))),
        Case("AGNNConv", "conv", lambda: Plain(c.AGNNConv(**z))),
        Case("NNConv", "conv", lambda: WithEdge(c.NNConv(f, f, nn.Linear(EDGE_DIM, f * f), "mean")), edge="attr"),
        Case("DenseGraphConv", "conv", None, na=dense),
        Case("DenseSAGEConv", "conv", None, na=dense),
        Case("DenseChebConv", "conv", None, na=dense),
        Case("EdgeConv", "conv", lambda: Plain(c.EdgeConv(f, f, **z))),
        Case("AtomicConv", "conv", lambda: Atomic(c.AtomicConv(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0]),
                                                               torch.tensor([1.0, 1.0]))), edge="dist"),
        Case("CFConv", "conv", lambda: WithEdge(c.CFConv(f, 1, 8, f)), edge="dist"),
        Case("DotGatConv", "conv", lambda: Plain(c.DotGatConv(f, f, num_heads=2, **z))),
        Case("TWIRLSConv", "conv", lambda: Plain(c.TWIRLSConv(f, f, 8, prop_step=2))),
        Case("TWIRLSUnfoldingAndAttention", "conv",
             lambda: Plain(c.TWIRLSUnfoldingAndAttention(f, alp=0, lam=1, prop_step=2)), graph="self-loops"),
        Case("GCN2Conv", "conv", lambda: WithX0(c.GCN2Conv(f, layer=1, alpha=0.1, lambda_=1, **z))),
        Case("HGTConv", "conv", lambda: HGT(c.HGTConv(f, 4, 2, num_ntypes=1, num_etypes=NUM_RELATIONS)),
             edge="type"),
        Case("GroupRevRes", "conv", lambda: Plain(c.GroupRevRes(c.GraphConv(f // 2, f // 2, **z), groups=2))),
        Case("EGNNConv", "conv", None, na="needs node coordinates (coord_feat) and returns updated coordinates"),
        Case("PNAConv", "conv", lambda: Plain(c.PNAConv(f, f, ["mean", "max", "sum"], ["identity", "amplification"],
                                                        delta=2.5))),
        Case("DGNConv", "conv", None, na="needs precomputed Laplacian eigenvectors per node (eig_vec) for its "
                                         "directional aggregators"),
        Case("CuGraphGATConv", "conv", lambda: Plain(c.CuGraphGATConv(f, f, num_heads=2))),
        Case("CuGraphRelGraphConv", "conv", lambda: WithEdge(c.CuGraphRelGraphConv(f, f, NUM_RELATIONS)),
             edge="type"),
        Case("CuGraphSAGEConv", "conv", lambda: Plain(c.CuGraphSAGEConv(f, f))),
    ]
    variant = [
        Case("GraphConv(edge_weight)", "variant", lambda: WithEdge(c.GraphConv(f, f, **z), keyword="edge_weight"),
             edge="weight"),
        Case("GraphConv(norm=right)", "variant", lambda: Plain(c.GraphConv(f, f, norm="right", **z))),
        Case("GraphConv(self-loops added)", "variant", lambda: SelfLoops(c.GraphConv(f, f))),
        Case("SAGEConv(gcn)", "variant", lambda: Plain(c.SAGEConv(f, f, "gcn"))),
        Case("SAGEConv(pool)", "variant", lambda: Plain(c.SAGEConv(f, f, "pool"))),
        Case("SAGEConv(lstm)", "variant", lambda: Plain(c.SAGEConv(f, f, "lstm"))),
        Case("SAGEConv(mean, edge_weight)", "variant",
             lambda: WithEdge(c.SAGEConv(f, f, "mean"), keyword="edge_weight"), edge="weight"),
        Case("GATConv(edge_weight)", "variant",
             lambda: WithEdge(c.GATConv(f, f, num_heads=2, **z), keyword="edge_weight"), edge="weight"),
        Case("GATConv(residual)", "variant", lambda: Plain(c.GATConv(f, f, num_heads=2, residual=True, **z))),
        Case("GINConv(mean, learn_eps)", "variant", lambda: Plain(c.GINConv(mlp(f, f), "mean", learn_eps=True))),
        Case("GINConv(max)", "variant", lambda: Plain(c.GINConv(mlp(f, f), "max"))),
        Case("TAGConv(edge_weight)", "variant", lambda: WithEdge(c.TAGConv(f, f, k=2), keyword="edge_weight"),
             edge="pweight"),
        Case("SGConv(edge_weight)", "variant", lambda: WithEdge(c.SGConv(f, f, k=2, **z), keyword="edge_weight"),
             edge="pweight"),
        Case("APPNPConv(edge_weight)", "variant", lambda: WithEdge(c.APPNPConv(k=3, alpha=0.1),
                                                                   keyword="edge_weight"), edge="pweight"),
        Case("EdgeConv(batch_norm)", "variant", lambda: Plain(c.EdgeConv(f, f, batch_norm=True, **z))),
        Case("NNConv(sum)", "variant", lambda: WithEdge(c.NNConv(f, f, nn.Linear(EDGE_DIM, f * f), "sum")),
             edge="attr"),
        Case("RelGraphConv(bdd)", "variant", lambda: WithEdge(c.RelGraphConv(f, f, NUM_RELATIONS, regularizer="bdd",
                                                                          num_bases=2)), edge="type"),
        # dropout in training: compared with the compiled model on one machine (its masks, keyed by id)
        Case("SAGEConv(feat_drop)", "variant", lambda: Plain(c.SAGEConv(f, f, "mean", feat_drop=0.3))),
        Case("GATConv(feat_drop, attn_drop)", "variant",
             lambda: Plain(c.GATConv(f, f, num_heads=2, feat_drop=0.3, attn_drop=0.3, **z))),
        Case("GATv2Conv(feat_drop, attn_drop)", "variant",
             lambda: Plain(c.GATv2Conv(f, f, num_heads=2, feat_drop=0.3, attn_drop=0.3, **z))),
        Case("APPNPConv(edge_drop)", "variant", lambda: Plain(c.APPNPConv(k=3, alpha=0.1, edge_drop=0.3))),
        Case("GINConv -> nn.Dropout", "variant", lambda: Dropped(c.GINConv(mlp(f, f), "sum"))),
    ]
    return conv + variant


class Dropped(nn.Module):
    """A layer whose output goes through ``nn.Dropout``, as DGL's examples put it between layers."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer, self.drop = layer, nn.Dropout(0.4)

    def forward(self, g, feat):
        return self.drop(self.layer(g, feat))


class SelfLoops(nn.Module):
    """The other way a DGL user gets past the 0-in-degree check: add self-loops in forward."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, g, feat):
        import dgl

        return self.layer(dgl.add_self_loop(g), feat)


@functools.cache
def cases() -> dict[str, Case]:
    return {c.name: c for c in _cases()}


def skipped() -> dict[str, str]:
    """Classes of ``dgl.nn.pytorch.conv.__all__`` not swept, and why."""
    import dgl.nn.pytorch.conv as c

    swept = {n.split("(")[0] for n in cases()}
    return {n: "not in the sweep yet (new in this DGL version)" for n in c.__all__ if n not in swept}


@contextlib.contextmanager
def float64_default():
    """torch's default dtype float64, as a user computing in float64 sets it: layers make
    tensors with it (APPNPConv's edge weights ``torch.ones(g.num_edges(), 1)``)."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(DT)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


def build(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    with float64_default():
        model = cases()[name].build().to(DT)
    model.train(not cases()[name].eval)
    return model


# --- running one model ---------------------------------------------------------------------
def run_model(model: nn.Module, x: torch.Tensor, graph: Any, edge: torch.Tensor | None, w: torch.Tensor) -> dict:
    """Output and the gradients of ``sum(out * w)`` w.r.t. x, the edge tensor, every parameter
    (eager and compiled alike with torch's default dtype float64)."""
    with float64_default():
        return zoo_sweep.run_node_model(model, lambda x, e: model(graph, x) if e is None else model(graph, x, e),
                                        x, edge, w)


compare = zoo_sweep.compare_nodes


def _worker_case(part, payload: dict) -> dict:
    return zoo_sweep.node_case(part, payload, build, run_model)


# --- the sweep -----------------------------------------------------------------------------
def reference(name: str) -> tuple[Record, dict | None, dict | None]:
    """Eager DGL on the DGLGraph and the compiled model on one machine (``sc.Graph.from_dgl``);
    see ``zoo_sweep.reference``."""
    import sarcompile as sc

    case = cases()[name]
    inp = inputs(case.graph)
    edge = None if case.edge is None else inp.edge[case.edge]

    def eager(model: nn.Module) -> dict:
        want = run_model(model, inp.x, dgl_graph(case.graph), edge, inp.w)
        if want["out"].shape[0] != N_NODES:
            raise ValueError(f"output has {want['out'].shape[0]} rows, not one per node")
        return want

    def compiled(model: nn.Module) -> dict:
        return run_model(zoo_sweep.distribute(model), inp.x, sc.Graph.from_dgl(dgl_graph(case.graph)), edge, inp.w)

    return zoo_sweep.reference(case, build, eager, compiled, "DGL", compare)


def distributed(rec: Record, want: dict, state: dict, pool: Pool, part_dir: str) -> None:
    case = cases()[rec.name]
    payload = {"name": rec.name, "state": state, "dir": part_dir,
               "edge": None if case.edge is None else inputs(case.graph).edge[case.edge]}
    zoo_sweep.node_distributed(rec, want, pool, payload, N_NODES, F_IN)


def _partition(tmp: str, world_size: int, names: list[str]) -> dict[str, str]:
    """The graphs these cases run on, cut into ``world_size`` random parts under ``tmp``; each
    case's directory."""
    import sarcompile as sc

    dirs = {}
    for kind in sorted({cases()[n].graph for n in names}):
        inp = inputs(kind)
        dirs[kind] = os.path.join(tmp, f"{kind}-w{world_size}")
        sc.partition(sc.Graph.from_dgl(dgl_graph(kind)), world_size, dirs[kind],
                     node_data={"x": inp.x, "w": inp.w}, method="random")
    return {n: dirs[cases()[n].graph] for n in names}


def sweep(names: list[str], world_sizes=WORLD_SIZES, log=print) -> list[Record]:
    return zoo_sweep.sweep(names, world_sizes, log, reference=reference, partition=_partition,
                           distributed=distributed, width=40,
                           case=_worker_case, frontend=FRONTEND)


# --- output --------------------------------------------------------------------------------
GROUPS = {"conv": "`dgl.nn.pytorch.conv` classes", "variant": "option variants"}


def table(records: list[Record], meta: dict) -> str:
    compared = f"float64, {N_NODES} nodes, {meta['edges']} edges; compared: one machine (`sc.Graph.from_dgl`) and"
    return zoo_sweep.table(records, meta, zoo_sweep.header(meta, "DGL zoo", FRONTEND, compared), column="layer",
                           noun="layers and variants", untagged={"conv"})


def summary(records: list[Record], meta: dict) -> str:
    header = zoo_sweep.header(meta, "DGL zoo", FRONTEND, "float64; one machine and", seconds=False)
    return zoo_sweep.summary(records, header, GROUPS, column="layer")


def main(argv: list[str] | None = None) -> int:
    return zoo_sweep.main(argv, doc=__doc__, script=__file__, results=RESULTS, frontend=FRONTEND, cases=cases,
                          sweep=sweep, table=table, summary=summary, skipped=skipped,
                          describe=lambda: {"edges": make_graph()[0].numel()})


if in_server(__name__):  # the workers fork with every case built once
    zoo_sweep.build_each(cases(), build)

if __name__ == "__main__":
    sys.exit(main())
