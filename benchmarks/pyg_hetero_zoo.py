"""The heterogeneous PyG zoo: does every heterogeneous PyG layer and model compile exactly,
or is it refused clearly?

The heterogeneous twin of ``benchmarks/pyg_zoo.py``. Every PyG layer and model for graphs
with node and edge types: ``HeteroConv`` over each conv that takes a relation between two
types (and its ``aggr`` variants, and used as the model itself with keyword dicts of edge
features), ``to_hetero`` of homogeneous models (hand-written and PyG's ready-made ones),
``to_hetero_with_bases``, ``HGTConv``, ``HANConv``, ``HeteroDictLinear``, lazy
``Linear(-1)``, ``HeteroJumpingKnowledge`` -- each run as a PyG user runs it,
``model(x_dict, edge_index_dict)`` on a ``HeteroData`` -- and the layers of the homogeneous
view (``data.to_homogeneous()``: one graph, a type per node and per edge): ``RGCNConv``,
``FastRGCNConv``, ``RGATConv``, ``HEATConv``, ``HeteroLinear``, ``HeteroBatchNorm``,
``HeteroLayerNorm``. Each is compared with ``sc.distribute(model)`` on one machine
(``sc.HeteroGraph.from_pyg`` / ``sc.Graph.from_pyg``) and on 1, 2 and 3 gloo workers
(``sc.partition`` + ``sc.load_partition``). Graph: paper / author / field with writes,
rev_writes, cites (self-loops, duplicate edges) and has_topic, isolated nodes of every type,
on 2 or more workers a worker without field nodes; float64; features and edge features
require grad.

Each case ends as exactly one of

* ``exact``: outputs of every type, every parameter gradient, the gradients of every type's
  features and of the edge features equal eager PyG within 1e-9 (relative to
  max(1, |eager|)) everywhere;
* ``refused``: a ``sarcompile.SarcompileError`` subclass was raised (class, first line);
* ``n/a``: eager PyG itself fails here, or the class is no layer or model over a graph's
  node features (random-walk embeddings);
* ``WRONG``: compiled and ran, but differs (max abs difference per run);
* ``CRASH``: any other exception from the compiled model (type and message).

Usage::

    python benchmarks/pyg_hetero_zoo.py --table         # full sweep -> results/pyg_hetero_zoo.json, .md
    python benchmarks/pyg_hetero_zoo.py --only HGTConv "HeteroConv(SAGEConv)" --table   # a subset (not saved)
    python benchmarks/pyg_hetero_zoo.py --load --table  # print the table of the saved results
    python benchmarks/pyg_hetero_zoo.py --load --summary   # ... in the README's shorter form

The workers are ``benchmarks/zoo_pool.py``'s pool: a few ``torch.multiprocessing`` processes
per world size, in one gloo group on a FileStore, running many cases each. Every wait is
bounded. What judges a case (the outcomes, the detail), the table and the command line are
``benchmarks/zoo_sweep.py``'s, shared with the other zoos.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo_sweep  # noqa: E402  (the zoos' judging, sweep and command line, shared)
from zoo_pool import Pool, describe_error, in_server  # noqa: E402
from zoo_sweep import (  # noqa: E402, F401  (the outcomes: tests read them)
    CRASH, DT, EXACT, NA, REFUSED, WORLD_SIZES, WRONG, Record, diff,
)

NODES = {"paper": 60, "author": 40, "field": 8}
WIDTHS = {"paper": 8, "author": 6, "field": 4}
TYPED_WIDTH = 8  # the homogeneous view's features: one width for every type
HIDDEN = 8
EDGE_DIM = 3
W_COLS = 64  # width of the per-node loss weights; outputs use their first columns
FRONTEND = "torch_geometric"  # imported by the command and by every worker: it loads sarcompile's PyG front-end
RESULTS = Path(__file__).resolve().parent / "results" / "pyg_hetero_zoo.json"
WRITES, REV, CITES, TOPIC = (("author", "writes", "paper"), ("paper", "rev_writes", "author"),
                             ("paper", "cites", "paper"), ("paper", "has_topic", "field"))


# --- the graph and the inputs --------------------------------------------------------------
@dataclass
class Inputs:
    """The typed graph as PyG holds it, and what every case is called with."""

    data: Any  # HeteroData: x per type, edge_index per relation
    w: dict[str, torch.Tensor]  # per-type loss weights [n_t, W_COLS]
    edge: dict[str, dict[tuple, torch.Tensor]]  # keyword dicts: edge_attr_dict, edge_weight_dict
    typed: Any  # Data: data.to_homogeneous() with one feature width, edge_attr, w


def make_inputs() -> Inputs:
    """Random edges among the first 90% of each type's nodes (the rest isolated); cites with
    12 self-loops and 20 duplicated edges."""
    from torch_geometric.data import HeteroData

    gen = torch.Generator().manual_seed(2026)
    data = HeteroData()
    for t, n in NODES.items():
        data[t].x = torch.randn(n, WIDTHS[t], generator=gen, dtype=DT)

    def rand(s: str, d: str, count: int) -> torch.Tensor:
        reach = {t: max(1, int(0.9 * n)) for t, n in NODES.items()}
        return torch.stack([torch.randint(0, reach[s], (count,), generator=gen),
                            torch.randint(0, reach[d], (count,), generator=gen)])

    data[WRITES].edge_index = rand("author", "paper", 120)
    data[REV].edge_index = data[WRITES].edge_index.flip(0)
    cites = rand("paper", "paper", 130)
    loops = torch.randperm(54, generator=gen)[:12]
    dup = torch.randint(0, 130, (20,), generator=gen)
    data[CITES].edge_index = torch.cat([cites, torch.stack([loops, loops]), cites[:, dup]], dim=1)
    data[TOPIC].edge_index = rand("paper", "field", 60)
    w = {t: torch.randn(n, W_COLS, generator=gen, dtype=DT) for t, n in NODES.items()}
    edge = {"edge_attr_dict": {WRITES: torch.randn(120, EDGE_DIM, generator=gen, dtype=DT)},
            "edge_weight_dict": {CITES: torch.rand(data[CITES].edge_index.size(1), generator=gen, dtype=DT)}}
    same = data.clone()
    for t, n in NODES.items():
        same[t].x = torch.randn(n, TYPED_WIDTH, generator=gen, dtype=DT)
    typed = same.to_homogeneous()
    typed.edge_attr = torch.randn(typed.num_edges, EDGE_DIM, generator=gen, dtype=DT)
    typed.w = torch.randn(typed.num_nodes, W_COLS, generator=gen, dtype=DT)
    return Inputs(data, w, edge, typed)


_INPUTS: list[Inputs] = []


def inputs() -> Inputs:
    if not _INPUTS:
        _INPUTS.append(make_inputs())
    return _INPUTS[0]


def assignment(world_size: int) -> dict[str, torch.Tensor]:
    """Random parts per type (not contiguous); on 2 or more workers the last has no field
    node, so a type with no rows on a worker is always among the cases."""
    gen = torch.Generator().manual_seed(world_size)
    out = {t: torch.randint(0, world_size, (n,), generator=gen) for t, n in NODES.items()}
    if world_size > 1:
        out["field"] = torch.randint(0, world_size - 1, (NODES["field"],), generator=gen)
    return out


def typed_assignment(world_size: int) -> torch.Tensor:
    """The homogeneous view's nodes (types one after another) in the same parts."""
    parts = assignment(world_size)
    return torch.cat([parts[t] for t in NODES])


# --- the models a PyG user writes ----------------------------------------------------------
def mlp(d_in: int, d_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, d_out))


def _metadata() -> tuple:
    return inputs().data.metadata()


class Aligned(nn.Module):
    """Each type's features to one width (a Linear per type), then the model (keyword dicts of
    edge features passed on): for convs whose source and destination rows must have the same
    width (GIN, EdgeConv, SimpleConv)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.lin = nn.ModuleDict({t: nn.Linear(WIDTHS[t], HIDDEN) for t in NODES})
        self.model = model

    def forward(self, x_dict, edge_index_dict, **edge_dicts):
        return self.model({t: self.lin[t](x) for t, x in x_dict.items()}, edge_index_dict, **edge_dicts)


def hetero_conv(conv: Callable[[tuple, int], nn.Module], aggr: str | None = "sum",
                within: Callable[[int], nn.Module] | None = None) -> nn.Module:
    """``HeteroConv`` with ``conv((src width, dst width), rel)`` for every relation (``within``
    for the relation within one type, when given)."""
    from torch_geometric import nn as g

    convs = {}
    for rel in _metadata()[1]:
        s, _, d = rel
        convs[rel] = within(WIDTHS[s]) if within is not None and s == d else conv((WIDTHS[s], WIDTHS[d]), rel)
    return g.HeteroConv(convs, aggr=aggr)


class SAGE(nn.Module):
    """The homogeneous model ``to_hetero`` transforms (PyG's example)."""

    def __init__(self):
        super().__init__()
        from torch_geometric import nn as g

        self.conv1 = g.SAGEConv((-1, -1), HIDDEN)
        self.conv2 = g.SAGEConv((-1, -1), 5)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class DropSAGE(SAGE):
    """:class:`SAGE` with dropout on its input and between its layers, as PyG's examples write it."""

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.3, training=self.training)
        return self.conv2(F.dropout(self.conv1(x, edge_index).relu(), p=0.5, training=self.training), edge_index)


class GAT(nn.Module):
    """PyG's to_hetero GAT example: attention plus a lazy Linear skip."""

    def __init__(self):
        super().__init__()
        from torch_geometric import nn as g

        self.conv1 = g.GATConv((-1, -1), 4, heads=2, add_self_loops=False)
        self.lin1 = g.Linear(-1, HIDDEN)
        self.conv2 = g.GATConv((-1, -1), 5, add_self_loops=False)
        self.lin2 = g.Linear(-1, 5)

    def forward(self, x, edge_index):
        x = (self.conv1(x, edge_index) + self.lin1(x)).relu()
        return self.conv2(x, edge_index) + self.lin2(x)


class GCN(nn.Module):
    def __init__(self):
        super().__init__()
        from torch_geometric import nn as g

        self.conv = g.GCNConv(-1, HIDDEN)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


class LazyLinears(nn.Module):
    """A lazy ``Linear(-1, ...)`` per type (PyG's way to unify widths), then HeteroConv."""

    def __init__(self):
        super().__init__()
        from torch_geometric import nn as g

        self.lin = nn.ModuleDict({t: g.Linear(-1, HIDDEN) for t in NODES})
        self.conv = g.HeteroConv({rel: g.SAGEConv(HIDDEN, 5) for rel in _metadata()[1]})

    def forward(self, x_dict, edge_index_dict):
        return self.conv({t: self.lin[t](x).relu() for t, x in x_dict.items()}, edge_index_dict)


class DictLinear(nn.Module):
    def __init__(self):
        super().__init__()
        from torch_geometric import nn as g

        self.lin = g.HeteroDictLinear(-1, HIDDEN, types=list(NODES))
        self.conv = g.HeteroConv({rel: g.GraphConv(HIDDEN, 5) for rel in _metadata()[1]}, aggr="max")

    def forward(self, x_dict, edge_index_dict):
        return self.conv({t: x.tanh() for t, x in self.lin(x_dict).items()}, edge_index_dict)


class HGT(nn.Module):
    """PyG's HGT example: a lazy Linear per type, two HGTConv layers, a Linear on top."""

    def __init__(self):
        super().__init__()
        from torch_geometric import nn as g

        self.lin = nn.ModuleDict({t: g.Linear(-1, HIDDEN) for t in NODES})
        self.convs = nn.ModuleList([g.HGTConv(HIDDEN, HIDDEN, _metadata(), heads=2) for _ in range(2)])
        self.out = g.Linear(HIDDEN, 5)

    def forward(self, x_dict, edge_index_dict):
        x_dict = {t: self.lin[t](x).relu() for t, x in x_dict.items()}
        for conv in self.convs:
            x_dict = conv(x_dict, edge_index_dict)
        return {t: self.out(x) for t, x in x_dict.items()}


class HAN(nn.Module):
    """PyG's HAN example: HANConv, a Linear on the paper rows."""

    def __init__(self):
        super().__init__()
        from torch_geometric import nn as g

        self.han = g.HANConv(-1, HIDDEN, _metadata(), heads=2)
        self.lin = nn.Linear(HIDDEN, 5)

    def forward(self, x_dict, edge_index_dict):
        return {"paper": self.lin(self.han(x_dict, edge_index_dict)["paper"])}


class JK(nn.Module):
    """Two HeteroConv(SAGEConv) layers, their outputs per type combined by
    HeteroJumpingKnowledge."""

    def __init__(self, mode: str):
        super().__init__()
        from torch_geometric import nn as g

        rels = _metadata()[1]
        self.conv1 = g.HeteroConv({rel: g.SAGEConv((-1, -1), HIDDEN) for rel in rels})
        self.conv2 = g.HeteroConv({rel: g.SAGEConv(HIDDEN, HIDDEN) for rel in rels})
        self.jk = g.HeteroJumpingKnowledge(list(NODES), mode, HIDDEN, num_layers=2)

    def forward(self, x_dict, edge_index_dict):
        h1 = {t: x.relu() for t, x in self.conv1(x_dict, edge_index_dict).items()}
        h2 = self.conv2(h1, edge_index_dict)
        return self.jk({t: [h1[t], h2[t]] for t in h2})


class Typed(nn.Module):
    """A layer of the homogeneous view: ``forward(x, edge_index, node_type, edge_type,
    edge_attr)``, calling it as ``call`` says (``call(layer, x, ei, nt, et, ea)``)."""

    def __init__(self, layer: nn.Module, call: Callable):
        super().__init__()
        self.layer, self.call = layer, call

    def forward(self, x, edge_index, node_type, edge_type, edge_attr):
        return self.call(self.layer, x, edge_index, node_type, edge_type, edge_attr)


class TypedRGCN(nn.Module):
    """RGCN of featureless types: a learnable embedding per node type (a row per type, looked
    up by each node's type) added to the features, RGCNConv, FastRGCNConv."""

    def __init__(self):
        super().__init__()
        from torch_geometric import nn as g

        self.type_emb = nn.Embedding(len(NODES), TYPED_WIDTH)
        self.conv1 = g.RGCNConv(TYPED_WIDTH, HIDDEN, 4)
        self.conv2 = g.FastRGCNConv(HIDDEN, 5, 4, num_bases=2)

    def forward(self, x, edge_index, node_type, edge_type, edge_attr):
        h = self.conv1(x + self.type_emb(node_type), edge_index, edge_type).relu()
        return self.conv2(h, edge_index, edge_type)


@dataclass
class Case:
    name: str
    group: str  # "heteroconv", "to_hetero", "layer" or "typed"
    build: Callable[[], nn.Module] | None  # the user's model; None: not applicable (na says why)
    edges: tuple[str, ...] = ()  # the keyword dicts of edge features it is called with as well
    eval: bool = False
    na: str | None = None

    @property
    def typed(self) -> bool:
        return self.group == "typed"


def _cases() -> list[Case]:
    import torch_geometric.nn as g
    from torch_geometric.nn import models as M

    H, md = HIDDEN, _metadata
    heads = dict(heads=2, add_self_loops=False)
    convs = [
        Case("HeteroConv(SAGEConv)", "heteroconv", lambda: hetero_conv(lambda io, r: g.SAGEConv(io, H))),
        Case("HeteroConv(SAGEConv(aggr=max, normalize, project))", "heteroconv",
             lambda: hetero_conv(lambda io, r: g.SAGEConv(io, H, aggr="max", normalize=True, project=True))),
        Case("HeteroConv(GraphConv, edge_weight_dict)", "heteroconv",
             lambda: hetero_conv(lambda io, r: g.GraphConv(io, H, aggr="mean" if r == CITES else "add")),
             edges=("edge_weight_dict",)),
        Case("HeteroConv(GATConv)", "heteroconv", lambda: hetero_conv(lambda io, r: g.GATConv(io, 4, **heads))),
        Case("HeteroConv(GATConv(edge_dim), edge_attr_dict)", "heteroconv",
             lambda: hetero_conv(lambda io, r: g.GATConv(io, 4, edge_dim=EDGE_DIM if r == WRITES else None, **heads)),
             edges=("edge_attr_dict",)),
        Case("HeteroConv(GATv2Conv)", "heteroconv", lambda: hetero_conv(lambda io, r: g.GATv2Conv(io, 4, **heads))),
        Case("HeteroConv(GINConv)", "heteroconv", lambda: Aligned(hetero_conv(lambda io, r: g.GINConv(mlp(H, H))))),
        Case("HeteroConv(GINEConv, edge_attr_dict)", "heteroconv",
             lambda: Aligned(hetero_conv(lambda io, r: g.GINEConv(mlp(H, H), edge_dim=EDGE_DIM) if r == WRITES
                                         else g.GINConv(mlp(H, H)))), edges=("edge_attr_dict",)),
        Case("HeteroConv(GCNConv)", "heteroconv", lambda: hetero_conv(lambda io, r: g.GCNConv(-1, H))),
        Case("HeteroConv(GCNConv within paper, SAGEConv across)", "heteroconv",
             lambda: hetero_conv(lambda io, r: g.SAGEConv(io, H), within=lambda f: g.GCNConv(f, H))),
        Case("HeteroConv(EdgeConv)", "heteroconv",
             lambda: Aligned(hetero_conv(lambda io, r: g.EdgeConv(mlp(2 * H, H))))),
        Case("HeteroConv(SimpleConv)", "heteroconv", lambda: Aligned(hetero_conv(lambda io, r: g.SimpleConv()))),
        Case("HeteroConv(TransformerConv)", "heteroconv",
             lambda: hetero_conv(lambda io, r: g.TransformerConv(io, 4, heads=2))),
        Case("HeteroConv(ResGatedGraphConv)", "heteroconv",
             lambda: hetero_conv(lambda io, r: g.ResGatedGraphConv(io, H))),
        Case("HeteroConv(GENConv)", "heteroconv", lambda: hetero_conv(lambda io, r: g.GENConv(io, H))),
        Case("HeteroConv(GeneralConv)", "heteroconv", lambda: hetero_conv(lambda io, r: g.GeneralConv(io, H))),
        Case("HeteroConv(LEConv)", "heteroconv", lambda: hetero_conv(lambda io, r: g.LEConv(io, H))),
        Case("HeteroConv(MFConv)", "heteroconv", lambda: hetero_conv(lambda io, r: g.MFConv(io, H))),
        Case("HeteroConv(FiLMConv)", "heteroconv", lambda: hetero_conv(lambda io, r: g.FiLMConv(io, H))),
        Case("HeteroConv(WLConvContinuous)", "heteroconv",
             lambda: Aligned(hetero_conv(lambda io, r: g.WLConvContinuous()))),
    ]
    convs += [Case(f"HeteroConv(SAGEConv, aggr={a})", "heteroconv",
                   lambda a=a: hetero_conv(lambda io, r: g.SAGEConv(io, H), aggr=a))
              for a in ("mean", "max", "min", "mul", "cat", None)]
    convs.append(Case("HeteroConv(GATConv(edge_dim) + GraphConv, both keyword dicts)", "heteroconv",
                      lambda: hetero_conv(lambda io, r: g.GATConv(io, 4, edge_dim=EDGE_DIM, **heads) if r == WRITES
                                          else g.GraphConv(io, H)), edges=("edge_attr_dict", "edge_weight_dict")))
    to_hetero = [
        Case("to_hetero(GraphSAGE)", "to_hetero", lambda: g.to_hetero(SAGE(), md(), aggr="sum")),
        Case("to_hetero(GraphSAGE, aggr=max)", "to_hetero", lambda: g.to_hetero(SAGE(), md(), aggr="max")),
        Case("to_hetero(GAT)", "to_hetero", lambda: g.to_hetero(GAT(), md(), aggr="mean")),
        Case("to_hetero(GCN)", "to_hetero", lambda: g.to_hetero(GCN(), md())),
        Case("to_hetero(models.GraphSAGE)", "to_hetero",
             lambda: g.to_hetero(M.GraphSAGE((-1, -1), H, num_layers=2, out_channels=5), md())),
        Case("to_hetero(models.GraphSAGE(jk=cat))", "to_hetero",
             lambda: g.to_hetero(M.GraphSAGE((-1, -1), H, num_layers=2, out_channels=5, jk="cat"), md())),
        Case("to_hetero(models.GAT)", "to_hetero",
             lambda: g.to_hetero(M.GAT((-1, -1), H, num_layers=2, out_channels=5, add_self_loops=False), md())),
        Case("to_hetero(models.GCN)", "to_hetero", lambda: g.to_hetero(M.GCN(-1, H, num_layers=2), md())),
        Case("to_hetero_with_bases(GraphSAGE)", "to_hetero",
             lambda: g.to_hetero_with_bases(SAGE(), md(), num_bases=2, in_channels={"x": H})),
    ]
    layers = [
        Case("HGTConv", "layer", lambda: g.HGTConv(dict(WIDTHS), H, md(), heads=2)),
        Case("HGTConv(heads=1, in_channels=-1)", "layer", lambda: g.HGTConv(-1, 6, md())),
        Case("HGT (Linear(-1) per type, 2 x HGTConv)", "layer", HGT),
        Case("HANConv", "layer", lambda: g.HANConv(dict(WIDTHS), H, md(), heads=2)),
        Case("HANConv(in_channels=-1, negative_slope, eval with dropout)", "layer",
             lambda: g.HANConv(-1, 6, md(), heads=3, negative_slope=0.1, dropout=0.3), eval=True),
        Case("HANConv(dropout)", "layer", lambda: g.HANConv(dict(WIDTHS), H, md(), heads=2, dropout=0.3)),
        Case("to_hetero(GraphSAGE with dropout)", "to_hetero", lambda: g.to_hetero(DropSAGE(), md(), aggr="sum")),
        Case("HAN (HANConv, Linear)", "layer", HAN),
        Case("HeteroDictLinear", "layer", DictLinear),
        Case("Linear(-1) per type", "layer", LazyLinears),
        Case("HeteroJumpingKnowledge(mode=cat)", "layer", lambda: JK("cat")),
        Case("HeteroJumpingKnowledge(mode=max)", "layer", lambda: JK("max")),
        Case("HeteroJumpingKnowledge(mode=lstm)", "layer", lambda: JK("lstm")),
        Case("MetaPath2Vec", "layer", None, na="random-walk node embeddings along metapaths: no features, trained on "
                                                 "walks"),
    ]
    T, R, F = len(NODES), len(_metadata()[1]), TYPED_WIDTH

    def typed(layer: Callable[[], nn.Module], call: Callable) -> Callable[[], nn.Module]:
        return lambda: Typed(layer(), call)

    rel = lambda m, x, ei, nt, et, ea: m(x, ei, et)  # noqa: E731
    heat = lambda m, x, ei, nt, et, ea: m(x, ei, nt, et, ea)  # noqa: E731
    by_type = lambda m, x, ei, nt, et, ea: m(x, nt)  # noqa: E731
    homogeneous = [
        Case("RGCNConv", "typed", typed(lambda: g.RGCNConv(F, H, R), rel)),
        Case("RGCNConv(num_bases)", "typed", typed(lambda: g.RGCNConv(F, H, R, num_bases=2), rel)),
        Case("RGCNConv(num_blocks)", "typed", typed(lambda: g.RGCNConv(F, H, R, num_blocks=2), rel)),
        Case("FastRGCNConv", "typed", typed(lambda: g.FastRGCNConv(F, H, R, aggr="add"), rel)),
        Case("RGATConv", "typed", typed(lambda: g.RGATConv(F, 4, R, heads=2), rel)),
        Case("RGCN (type embedding, RGCNConv, FastRGCNConv)", "typed", TypedRGCN),
        Case("HEATConv", "typed", typed(lambda: g.HEATConv(F, 4, T, R, 3, EDGE_DIM, 3, heads=2), heat)),
        Case("HEATConv(concat=False, root_weight=False)", "typed",
             typed(lambda: g.HEATConv(F, 4, T, R, 2, EDGE_DIM, 2, heads=2, concat=False, root_weight=False), heat)),
        Case("HeteroLinear", "typed", typed(lambda: g.HeteroLinear(F, H, T), by_type)),
        Case("HeteroLinear(in_channels=-1, bias=False)", "typed",
             typed(lambda: g.HeteroLinear(-1, H, T, bias=False), by_type)),
        Case("HeteroBatchNorm", "typed", typed(lambda: g.HeteroBatchNorm(F, T), by_type)),
        Case("HeteroLayerNorm", "typed", typed(lambda: g.HeteroLayerNorm(F, T), by_type)),
    ]
    return convs + to_hetero + layers + homogeneous


@functools.cache
def cases() -> dict[str, Case]:
    return {c.name: c for c in _cases()}


def skipped() -> dict[str, str]:
    """Heterogeneous classes of ``torch_geometric.nn`` not swept as cases of their own, and why."""
    return {"to_hetero_transformer / to_hetero_with_bases_transformer": "the modules of to_hetero and "
            "to_hetero_with_bases (swept through them)"}


def build(name: str, seed: int = 0) -> nn.Module:
    """Case ``name``'s model in float64, in train mode (eval where the case says), lazy
    parameters initialised by one eager call without gradients, as PyG documents."""
    case = cases()[name]
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(DT)
    try:
        model = case.build()
    finally:
        torch.set_default_dtype(prev)
    model.train(not case.eval)
    with torch.no_grad():
        call(model, case, *eager_args(case))
    return model.to(DT)


# --- running one model ---------------------------------------------------------------------
def eager_args(case: Case) -> tuple:
    """What eager PyG is called with: the features and the graph as tensors."""
    inp = inputs()
    if case.typed:
        d = inp.typed
        return d.x, d.edge_index, d.node_type, d.edge_type, d.edge_attr
    return inp.data.x_dict, inp.data.edge_index_dict, {k: inp.edge[k] for k in case.edges}


def call(model: nn.Module, case: Case, *args) -> Any:
    if case.typed:
        return model(*args)
    x, graph, edge = args
    return model(x, graph, **edge)


def run_model(model: nn.Module, case: Case, args: tuple, w: dict[str, torch.Tensor]) -> dict:
    """Outputs and the gradients of ``sum(out * w)`` w.r.t. every type's features, the edge
    features and every parameter, each a dict of tensors by key (a node type, ``(keyword,
    relation)``, ``"x"`` / ``"edge_attr"`` on the homogeneous view)."""
    leaf = zoo_sweep.leaf
    if case.typed:
        x, graph, node_type, edge_type, edge_attr = args
        xs, edges = {"x": leaf(x)}, {"edge_attr": leaf(edge_attr)}
        out = {"x": model(xs["x"], graph, node_type, edge_type, edges["edge_attr"])}
    else:
        x, graph, edge = args
        xs = {t: leaf(v) for t, v in x.items()}
        edges = {(k, rel): leaf(e) for k, d in edge.items() for rel, e in d.items()}
        edge = {k: {rel: edges[(k, rel)] for rel in d} for k, d in edge.items()}
        out = model(xs, graph, **edge)
    if not isinstance(out, dict) or not all(isinstance(v, torch.Tensor) for v in out.values()):
        raise TypeError(f"the model returned {type(out).__name__}, not a tensor or a dict of tensors")
    loss = sum((v * zoo_sweep.loss_weight(v, w[t])).sum() for t, v in out.items() if v.requires_grad)
    if isinstance(loss, torch.Tensor):
        loss.backward()
    grad = lambda t: torch.zeros_like(t) if t.grad is None else t.grad  # noqa: E731  (none reached it: zeros)
    return {
        "out": {t: v.detach() for t, v in out.items()},
        "x_grad": {t: grad(v) for t, v in xs.items()},
        "edge_grad": {k: grad(e) for k, e in edges.items() if e.is_floating_point()},
        "grads": zoo_sweep.param_grads(model),
    }


def _loss_weights(case: Case) -> dict[str, torch.Tensor]:
    inp = inputs()
    return {"x": inp.typed.w} if case.typed else inp.w


def compare(got: dict, want: dict) -> tuple[float, float, str]:
    """Max abs and relative difference over outputs and gradients, and where the worst is."""
    worst = (0.0, 0.0, "")
    for what in ("out", "x_grad", "edge_grad", "grads"):
        if set(got[what]) != set(want[what]):
            differ = sorted(map(str, set(got[what]) ^ set(want[what])))
            return float("inf"), float("inf"), f"{what} keys differ: {differ}"
        for key, b in want[what].items():
            m, r = diff(got[what][key], b)
            if r > worst[1] or (r == worst[1] == float("inf") and not worst[2]):
                worst = (m, r, f"{what} of {key}")
    return worst


# --- workers -------------------------------------------------------------------------------
def _worker_case(part, payload: dict) -> dict:
    """This worker's rows of one case: the compiled model on its part, gradients synced."""
    import sarcompile as sc

    case = cases()[payload["name"]]
    model = build(payload["name"])
    model.load_state_dict(payload["state"])
    g = part.graph
    if case.typed:
        nd = part.node_data
        args = (nd["x"], g, nd["node_type"], payload["edge_type"][g.edge_ids], payload["edge_attr"][g.edge_ids])
        w, ids, edge_ids = {"x": nd["w"]}, {"x": part.global_ids}, {"edge_attr": g.edge_ids}
    else:
        x = {t: d["x"] for t, d in part.node_data.items()}
        edge = {k: {rel: e[g[rel].edge_ids] for rel, e in d.items()} for k, d in payload["edge"].items()}
        args = (x, g, edge)
        w = {t: d["w"] for t, d in part.node_data.items()}
        ids = part.global_ids
        edge_ids = {(k, rel): g[rel].edge_ids for k, d in edge.items() for rel in d}
    try:
        r = run_model(zoo_sweep.distribute(model), case, args, w)
        sc.sync_gradients(model)
        r["grads"] = zoo_sweep.param_grads(model)
    except Exception as e:
        return {"error": describe_error(e)}
    r["ids"], r["edge_ids"] = ids, edge_ids
    return r


def _assemble(results: list[dict], want: dict) -> dict:
    """The workers' rows put back in the whole graph's order (NaN where none came or they
    came in another width); a key the model gave on a worker and not eagerly, as it came."""
    got: dict[str, dict] = {"out": {}, "x_grad": {}, "edge_grad": {}}
    for what, ids in (("out", "ids"), ("x_grad", "ids"), ("edge_grad", "edge_ids")):
        for key, full in want[what].items():
            rows = torch.full_like(full, float("nan"))
            for r in results:
                part = r[what].get(key)
                rows[r[ids][key]] = part if part is not None and part.shape[1:] == full.shape[1:] else float("nan")
            got[what][key] = rows
        for r in results:
            for key in set(r[what]) - set(want[what]):
                got[what][key] = r[what][key]
    return got


# --- the sweep -----------------------------------------------------------------------------
def reference(name: str) -> tuple[Record, dict | None, dict | None]:
    """Eager PyG and the compiled model on one machine; see ``zoo_sweep.reference``."""
    import sarcompile as sc

    case = cases()[name]
    args = eager_args(case)

    def eager(model: nn.Module) -> dict:
        return run_model(model, case, args, _loss_weights(case))

    def compiled(model: nn.Module) -> dict:
        graph = sc.Graph.from_pyg(inputs().typed) if case.typed else sc.HeteroGraph.from_pyg(inputs().data)
        return run_model(zoo_sweep.distribute(model), case, (args[0], graph, *args[2:]), _loss_weights(case))

    return zoo_sweep.reference(case, build, eager, compiled, "PyG", compare)


def distributed(rec: Record, want: dict, state: dict, pool: Pool, part_dir: str) -> None:
    inp = inputs()
    payload = {"name": rec.name, "state": state, "dir": part_dir,
               "edge": {k: inp.edge[k] for k in cases()[rec.name].edges},
               "edge_type": inp.typed.edge_type, "edge_attr": inp.typed.edge_attr}
    zoo_sweep.distributed(rec, want, pool, payload, lambda results: _assemble(results, want), compare)


def _partition(tmp: str, world_size: int, names: list[str]) -> dict[str, str]:
    """The typed graph and its homogeneous view cut into ``world_size`` parts under ``tmp``;
    each case's directory."""
    import sarcompile as sc

    inp = inputs()
    dirs = {"hetero": os.path.join(tmp, f"hetero-w{world_size}"), "typed": os.path.join(tmp, f"typed-w{world_size}")}
    sc.partition(sc.HeteroGraph.from_pyg(inp.data), world_size, dirs["hetero"],
                 node_data={t: {"x": inp.data[t].x, "w": inp.w[t]} for t in NODES}, method=assignment(world_size))
    sc.partition(sc.Graph.from_pyg(inp.typed), world_size, dirs["typed"],
                 node_data={"x": inp.typed.x, "node_type": inp.typed.node_type, "w": inp.typed.w},
                 method=typed_assignment(world_size))
    return {n: dirs["typed" if cases()[n].typed else "hetero"] for n in names}


def sweep(names: list[str], world_sizes=WORLD_SIZES, log=print) -> list[Record]:
    return zoo_sweep.sweep(names, world_sizes, log, reference=reference, partition=_partition,
                           distributed=distributed, width=56,
                           case=_worker_case, frontend=FRONTEND)


# --- output --------------------------------------------------------------------------------
GROUPS = {"heteroconv": "`HeteroConv` over each conv", "to_hetero": "`to_hetero` / `to_hetero_with_bases` models",
          "layer": "heterogeneous layers and models", "typed": "layers of the homogeneous view (`to_homogeneous()`)"}


def _header(meta: dict) -> str:
    nodes = ", ".join(f"{t} {n}" for t, n in meta["nodes"].items())
    edges = ", ".join(f"{k} {v}" for k, v in meta["edges"].items())
    return zoo_sweep.header(meta, "PyG heterogeneous zoo", FRONTEND,
                            f"float64; nodes {nodes}; edges {edges}; compared: one machine and")


def table(records: list[Record], meta: dict) -> str:
    return zoo_sweep.table(records, meta, _header(meta), column="case", noun="cases", untagged=GROUPS)


def summary(records: list[Record], meta: dict) -> str:
    return zoo_sweep.summary(records, _header(meta), GROUPS, column="case", class_prefix="torch_geometric.nn.",
                             total="cases")


def _describe() -> dict:
    data = inputs().data
    return {"nodes": dict(NODES), "edges": {rel[1]: int(data[rel].edge_index.size(1)) for rel in data.edge_types}}


def main(argv: list[str] | None = None) -> int:
    return zoo_sweep.main(argv, doc=__doc__, script=__file__, results=RESULTS, frontend=FRONTEND, cases=cases,
                          sweep=sweep, table=table, summary=summary, describe=_describe, skipped=skipped)


if in_server(__name__):  # the workers fork with every case built once
    zoo_sweep.build_each(cases(), build)

if __name__ == "__main__":
    sys.exit(main())
