"""The PyG zoo: does every PyG layer compile exactly, or is it refused clearly?

For every class in ``torch_geometric.nn.conv.__all__``, some common option variants, and
PyG's ready-made models (``torch_geometric.nn.models``), build the model a PyG user writes
(``forward(x, edge_index[, edge_attr])``), run it eagerly on one machine, and compare it with
``sc.distribute(model)`` on one machine (``sc.Graph``) and on 1, 2 and 3 gloo workers
(``sc.partition`` + ``sc.load_partition``). Graph: 320 nodes with isolated nodes, self-loops,
duplicate edges and a hub; float64; features and edge features require grad.

Each layer ends as exactly one of

* ``exact``: output, every parameter gradient, the input gradient and the edge-feature
  gradient equal eager PyG within 1e-9 (relative to max(1, |eager|)) everywhere;
* ``refused``: a ``sarcompile.SarcompileError`` subclass was raised (class, first line);
* ``n/a``: eager PyG itself fails here, or the layer needs inputs a node-level
  ``forward(x, edge_index)`` does not have (pos, hetero, signed, graph-level...);
* ``WRONG``: compiled and ran, but differs (max abs difference per run);
* ``CRASH``: any other exception from the compiled model (type and message).

Usage::

    python benchmarks/pyg_zoo.py                       # full sweep -> benchmarks/results/pyg_zoo.json, .md
    python benchmarks/pyg_zoo.py --table               # ... and print the Markdown table
    python benchmarks/pyg_zoo.py --only GCNConv SAGEConv --table   # a subset (not saved unless --out)
    python benchmarks/pyg_zoo.py --load --table        # print the table of the saved results
    python benchmarks/pyg_zoo.py --load --summary      # ... in the README's shorter form

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
FRONTEND = "torch_geometric"  # imported by the command and by every worker: it loads sarcompile's PyG front-end
RESULTS = Path(__file__).resolve().parent / "results" / "pyg_zoo.json"


# --- the graph and the inputs --------------------------------------------------------------
def make_graph() -> tuple[torch.Tensor, torch.Tensor]:
    """``src, dst`` on 320 nodes: random edges among nodes 0..299, nodes 300..319 isolated,
    30 self-loops, 40 duplicated edges, and a hub (node 7) with 150 in- and 150 out-edges;
    in shuffled order."""
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
    return src[order], dst[order]


@dataclass
class Inputs:
    src: torch.Tensor
    dst: torch.Tensor
    x: torch.Tensor  # [N, F_IN]
    w: torch.Tensor  # [N, W_COLS] loss weights
    edge: dict[str, torch.Tensor]  # per-edge tensors by kind, in the original edge order


def make_mesh_graph() -> tuple[torch.Tensor, torch.Tensor]:
    """MeshCNNConv's input: ``x`` holds one row per mesh edge and ``edge_index`` lists, for
    each mesh edge i in order, its four neighbours a, b, c, d as ``(i, a), (i, b), ...``."""
    gen = torch.Generator().manual_seed(4)
    src = torch.arange(N_NODES).repeat_interleave(4)
    dst = (src + torch.randint(1, N_NODES, (src.numel(),), generator=gen)) % N_NODES
    return src, dst


GRAPHS = {"zoo": make_graph, "mesh4": make_mesh_graph}
_INPUTS: dict[str, Inputs] = {}


def inputs(kind: str = "zoo") -> Inputs:
    if kind not in _INPUTS:
        _INPUTS[kind] = make_inputs(kind)
    return _INPUTS[kind]


def make_inputs(kind: str = "zoo") -> Inputs:
    src, dst = GRAPHS[kind]()
    gen = torch.Generator().manual_seed(7)
    e = src.numel()
    edge = {
        # positive, some zero (a node whose in-weights are all zero has degree 0)
        "weight": torch.rand(e, generator=gen, dtype=DT) * torch.randint(0, 3, (e,), generator=gen),
        "attr": torch.randn(e, EDGE_DIM, generator=gen, dtype=DT),
        "pseudo": torch.rand(e, 2, generator=gen, dtype=DT),  # SplineConv's coordinates in [0, 1]
        "type": torch.randint(0, NUM_RELATIONS, (e,), generator=gen),
    }
    return Inputs(src, dst, torch.randn(N_NODES, F_IN, generator=gen, dtype=DT),
                  torch.randn(N_NODES, W_COLS, generator=gen, dtype=DT), edge)


def assignment(world_size: int) -> torch.Tensor:
    """Random parts (not contiguous), so the hub's neighbours live on every worker."""
    return torch.randint(0, world_size, (N_NODES,), generator=torch.Generator().manual_seed(world_size))


# --- the models a PyG user writes ----------------------------------------------------------
class Plain(nn.Module):
    """``forward(x, edge_index)`` around one layer."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x, edge_index):
        return self.layer(x, edge_index)


class WithEdge(nn.Module):
    """``forward(x, edge_index, edge_attr)`` around one layer (by position, or by keyword)."""

    def __init__(self, layer: nn.Module, keyword: str | None = None):
        super().__init__()
        self.layer, self.keyword = layer, keyword

    def forward(self, x, edge_index, edge_attr):
        if self.keyword:
            return self.layer(x, edge_index, **{self.keyword: edge_attr})
        return self.layer(x, edge_index, edge_attr)


class WithX0(nn.Module):
    """GCN2Conv / FAConv: ``layer(x, x_0, edge_index)`` with the input as x_0."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x, edge_index):
        return self.layer(x, x, edge_index)


class FirstOfTuple(nn.Module):
    """PANConv returns ``(out, M)``: the model uses ``out``."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x, edge_index):
        return self.layer(x, edge_index)[0]


class DNA(nn.Module):
    """DNAConv attends over a node's earlier layer outputs: ``x [N, layers, C]``."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer
        self.lin = nn.Linear(F_IN, F_IN)

    def forward(self, x, edge_index):
        return self.layer(torch.stack([x, torch.tanh(self.lin(x))], dim=1), edge_index)


class NoGraph(nn.Module):
    """Layers that build their own graph from the features (k-NN): ``layer(x)``."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x, edge_index):
        return self.layer(x)


class WithBatch(nn.Module):
    """Models whose forward takes ``batch``: one graph, all zeros."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x, edge_index):
        return self.layer(x, edge_index, torch.zeros(x.size(0), dtype=torch.long, device=x.device))


class Labels(nn.Module):
    """LabelPropagation of soft labels ``x``."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x, edge_index):
        return self.layer(x, edge_index)


def mlp(d_in: int, d_out: int, hidden: int = 8) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


PNA_DEG = torch.tensor([20, 60, 90, 70, 40, 20, 10, 5, 3, 2])  # an in-degree histogram
PNA_AGGRS = ["mean", "min", "max", "std"]
PNA_SCALERS = ["identity", "amplification", "attenuation"]


@dataclass
class Case:
    name: str
    group: str  # "conv", "variant" or "model"
    build: Callable[[], nn.Module] | None  # the user's model; None: not applicable (na says why)
    edge: str | None = None  # per-edge argument: "weight", "attr", "pseudo" or "type"
    eval: bool = False
    na: str | None = None
    graph: str = "zoo"  # "mesh4": MeshCNNConv's edge adjacency (four neighbours per row, in order)


def _cases() -> list[Case]:
    import torch_geometric.nn as g
    from torch_geometric.nn import models as M

    f = F_IN
    pos = "needs node positions (pos)"
    hetero = "heterogeneous graph (node/edge types as dicts): swept in benchmarks/pyg_hetero_zoo.py"
    conv = [
        Case("SimpleConv", "conv", lambda: Plain(g.SimpleConv())),
        Case("GCNConv", "conv", lambda: Plain(g.GCNConv(f, f))),
        Case("ChebConv", "conv", lambda: Plain(g.ChebConv(f, f, K=3))),
        Case("SAGEConv", "conv", lambda: Plain(g.SAGEConv(f, f))),
        Case("CuGraphSAGEConv", "conv", lambda: Plain(g.CuGraphSAGEConv(f, f))),
        Case("GraphConv", "conv", lambda: Plain(g.GraphConv(f, f))),
        Case("GravNetConv", "conv", lambda: NoGraph(g.GravNetConv(f, f, space_dimensions=3,
                                                                 propagate_dimensions=4, k=4))),
        Case("GatedGraphConv", "conv", lambda: Plain(g.GatedGraphConv(f, num_layers=2))),
        Case("ResGatedGraphConv", "conv", lambda: Plain(g.ResGatedGraphConv(f, f))),
        Case("GATConv", "conv", lambda: Plain(g.GATConv(f, f, heads=2))),
        Case("CuGraphGATConv", "conv", lambda: Plain(g.CuGraphGATConv(f, f, heads=2))),
        Case("FusedGATConv", "conv", lambda: Plain(g.FusedGATConv(f, f, heads=2, add_self_loops=False))),
        Case("GATv2Conv", "conv", lambda: Plain(g.GATv2Conv(f, f, heads=2))),
        Case("TransformerConv", "conv", lambda: Plain(g.TransformerConv(f, f, heads=2))),
        Case("AGNNConv", "conv", lambda: Plain(g.AGNNConv())),
        Case("TAGConv", "conv", lambda: Plain(g.TAGConv(f, f, K=2))),
        Case("GINConv", "conv", lambda: Plain(g.GINConv(mlp(f, f)))),
        Case("GINEConv", "conv", lambda: WithEdge(g.GINEConv(mlp(f, f), edge_dim=EDGE_DIM)), edge="attr"),
        Case("ARMAConv", "conv", lambda: Plain(g.ARMAConv(f, f, num_stacks=2, num_layers=2))),
        Case("SGConv", "conv", lambda: Plain(g.SGConv(f, f, K=2))),
        Case("SSGConv", "conv", lambda: Plain(g.SSGConv(f, f, alpha=0.1, K=2))),
        Case("APPNP", "conv", lambda: Plain(g.APPNP(K=3, alpha=0.1))),
        Case("MFConv", "conv", lambda: Plain(g.MFConv(f, f, max_degree=5))),
        Case("RGCNConv", "conv", lambda: WithEdge(g.RGCNConv(f, f, num_relations=NUM_RELATIONS)), edge="type"),
        Case("FastRGCNConv", "conv", lambda: WithEdge(g.FastRGCNConv(f, f, num_relations=NUM_RELATIONS)),
             edge="type"),
        Case("CuGraphRGCNConv", "conv", lambda: WithEdge(g.CuGraphRGCNConv(f, f, num_relations=NUM_RELATIONS)),
             edge="type"),
        Case("RGATConv", "conv", lambda: WithEdge(g.RGATConv(f, f, num_relations=NUM_RELATIONS)), edge="type"),
        Case("SignedConv", "conv", None, na="needs two edge sets (positive and negative edges)"),
        Case("DNAConv", "conv", lambda: DNA(g.DNAConv(f, heads=2))),
        Case("PointNetConv", "conv", None, na=pos),
        Case("GMMConv", "conv", lambda: WithEdge(g.GMMConv(f, f, dim=EDGE_DIM, kernel_size=2)), edge="attr"),
        Case("SplineConv", "conv", lambda: WithEdge(g.SplineConv(f, f, dim=2, kernel_size=3)), edge="pseudo"),
        Case("NNConv", "conv", lambda: WithEdge(g.NNConv(f, f, mlp(EDGE_DIM, f * f, 16), aggr="mean")),
             edge="attr"),
        Case("CGConv", "conv", lambda: WithEdge(g.CGConv(f, dim=EDGE_DIM)), edge="attr"),
        Case("EdgeConv", "conv", lambda: Plain(g.EdgeConv(mlp(2 * f, f)))),
        Case("DynamicEdgeConv", "conv", lambda: NoGraph(g.DynamicEdgeConv(mlp(2 * f, f), k=4))),
        Case("XConv", "conv", None, na=pos),
        Case("PPFConv", "conv", None, na=pos + " and normals"),
        Case("FeaStConv", "conv", lambda: Plain(g.FeaStConv(f, f, heads=2))),
        Case("PointTransformerConv", "conv", None, na=pos),
        Case("HypergraphConv", "conv", lambda: Plain(g.HypergraphConv(f, f))),
        Case("LEConv", "conv", lambda: Plain(g.LEConv(f, f))),
        Case("PNAConv", "conv", lambda: Plain(g.PNAConv(f, f, PNA_AGGRS, PNA_SCALERS, PNA_DEG))),
        Case("ClusterGCNConv", "conv", lambda: Plain(g.ClusterGCNConv(f, f))),
        Case("GENConv", "conv", lambda: Plain(g.GENConv(f, f))),
        Case("GCN2Conv", "conv", lambda: WithX0(g.GCN2Conv(f, alpha=0.1, theta=0.5, layer=1))),
        Case("PANConv", "conv", lambda: FirstOfTuple(g.PANConv(f, f, filter_size=2))),
        Case("WLConv", "conv", lambda: Plain(g.WLConv())),
        Case("WLConvContinuous", "conv", lambda: Plain(g.WLConvContinuous())),
        Case("FiLMConv", "conv", lambda: Plain(g.FiLMConv(f, f))),
        # In training SuperGATConv samples negative edges at random on every call: eval mode.
        Case("SuperGATConv", "conv", lambda: Plain(g.SuperGATConv(f, f, heads=2)), eval=True),
        Case("FAConv", "conv", lambda: WithX0(g.FAConv(f, eps=0.1))),
        Case("EGConv", "conv", lambda: Plain(g.EGConv(f, f, aggregators=["sum", "mean", "max"], num_heads=2,
                                                      num_bases=2))),
        Case("PDNConv", "conv", lambda: WithEdge(g.PDNConv(f, f, edge_dim=EDGE_DIM, hidden_channels=8)),
             edge="attr"),
        Case("GeneralConv", "conv", lambda: Plain(g.GeneralConv(f, f))),
        Case("HGTConv", "conv", None, na=hetero),
        Case("HEATConv", "conv", None, na="heterogeneous: needs node_type and edge_type per node/edge: swept in benchmarks/pyg_hetero_zoo.py"),
        Case("HeteroConv", "conv", None, na=hetero),
        Case("HANConv", "conv", None, na=hetero),
        Case("LGConv", "conv", lambda: Plain(g.LGConv())),
        Case("PointGNNConv", "conv", None, na=pos),
        Case("GPSConv", "conv", lambda: Plain(g.GPSConv(f, g.GINConv(mlp(f, f)), heads=2))),
        Case("AntiSymmetricConv", "conv", lambda: Plain(g.AntiSymmetricConv(f))),
        Case("DirGNNConv", "conv", lambda: Plain(g.DirGNNConv(g.GCNConv(f, f)))),
        Case("MixHopConv", "conv", lambda: Plain(g.MixHopConv(f, f, powers=[0, 1, 2]))),
        Case("MeshCNNConv", "conv", lambda: Plain(g.MeshCNNConv(f, f)), graph="mesh4"),
    ]
    variant = [
        Case("GCNConv(edge_weight)", "variant", lambda: WithEdge(g.GCNConv(f, f)), edge="weight"),
        Case("GCNConv(improved, edge_weight)", "variant", lambda: WithEdge(g.GCNConv(f, f, improved=True)),
             edge="weight"),
        Case("GCNConv(add_self_loops=False)", "variant", lambda: Plain(g.GCNConv(f, f, add_self_loops=False))),
        Case("GCNConv(normalize=False)", "variant", lambda: Plain(g.GCNConv(f, f, normalize=False))),
        Case("GCNConv(cached=True)", "variant", lambda: Plain(g.GCNConv(f, f, cached=True))),
        Case("SAGEConv(aggr=max)", "variant", lambda: Plain(g.SAGEConv(f, f, aggr="max"))),
        Case("SAGEConv(aggr=sum, normalize, project)", "variant",
             lambda: Plain(g.SAGEConv(f, f, aggr="sum", normalize=True, project=True))),
        Case("SAGEConv(root_weight=False)", "variant", lambda: Plain(g.SAGEConv(f, f, root_weight=False))),
        Case("SAGEConv(aggr=[mean, max])", "variant", lambda: Plain(g.SAGEConv(f, f, aggr=["mean", "max"]))),
        Case("GraphConv(aggr=mean, edge_weight)", "variant", lambda: WithEdge(g.GraphConv(f, f, aggr="mean")),
             edge="weight"),
        Case("GraphConv(aggr=max)", "variant", lambda: Plain(g.GraphConv(f, f, aggr="max"))),
        Case("GATConv(concat=False, no self-loops)", "variant",
             lambda: Plain(g.GATConv(f, f, heads=2, concat=False, add_self_loops=False))),
        Case("GATConv(edge_dim)", "variant", lambda: WithEdge(g.GATConv(f, f, heads=2, edge_dim=EDGE_DIM)),
             edge="attr"),
        Case("GATv2Conv(share_weights, residual)", "variant",
             lambda: Plain(g.GATv2Conv(f, f, heads=2, share_weights=True, residual=True))),
        Case("GATv2Conv(edge_dim)", "variant", lambda: WithEdge(g.GATv2Conv(f, f, heads=2, edge_dim=EDGE_DIM)),
             edge="attr"),
        Case("TransformerConv(edge_dim)", "variant",
             lambda: WithEdge(g.TransformerConv(f, f, heads=2, edge_dim=EDGE_DIM)), edge="attr"),
        Case("TransformerConv(concat=False, beta)", "variant",
             lambda: Plain(g.TransformerConv(f, f, heads=2, concat=False, beta=True))),
        Case("GINConv(train_eps)", "variant", lambda: Plain(g.GINConv(mlp(f, f), eps=0.2, train_eps=True))),
        Case("EdgeConv(aggr=mean)", "variant", lambda: Plain(g.EdgeConv(mlp(2 * f, f), aggr="mean"))),
        Case("ChebConv(edge_weight)", "variant", lambda: WithEdge(g.ChebConv(f, f, K=3)), edge="weight"),
        Case("SGConv(edge_weight)", "variant", lambda: WithEdge(g.SGConv(f, f, K=2)), edge="weight"),
        Case("APPNP(edge_weight)", "variant", lambda: WithEdge(g.APPNP(K=3, alpha=0.1)), edge="weight"),
        Case("TAGConv(edge_weight)", "variant", lambda: WithEdge(g.TAGConv(f, f, K=2)), edge="weight"),
        Case("LEConv(edge_weight)", "variant", lambda: WithEdge(g.LEConv(f, f)), edge="weight"),
        Case("SimpleConv(sum, combine_root=sum)", "variant",
             lambda: Plain(g.SimpleConv(aggr="sum", combine_root="sum"))),
        Case("GENConv(edge_dim)", "variant", lambda: WithEdge(g.GENConv(f, f, edge_dim=EDGE_DIM)), edge="attr"),
        Case("GeneralConv(edge, attention)", "variant",
             lambda: WithEdge(g.GeneralConv(f, f, in_edge_channels=EDGE_DIM, attention=True)), edge="attr"),
        Case("FiLMConv(edge_type)", "variant", lambda: WithEdge(g.FiLMConv(f, f, num_relations=NUM_RELATIONS)),
             edge="type"),
        Case("GPSConv(norm=None)", "variant", lambda: Plain(g.GPSConv(f, g.GINConv(mlp(f, f)), heads=2,
                                                                      norm=None))),
        Case("DirGNNConv(SAGEConv)", "variant", lambda: Plain(g.DirGNNConv(g.SAGEConv(f, f)))),
        # dropout in training: compared with the compiled model on one machine (its masks, keyed by id)
        Case("GATConv(dropout)", "variant", lambda: Plain(g.GATConv(f, f, heads=2, dropout=0.3))),
        Case("GATv2Conv(dropout)", "variant", lambda: Plain(g.GATv2Conv(f, f, heads=2, dropout=0.3))),
        Case("TransformerConv(dropout)", "variant", lambda: Plain(g.TransformerConv(f, f, heads=2, dropout=0.3))),
        Case("RGATConv(dropout)", "variant", lambda: WithEdge(g.RGATConv(f, f, num_relations=NUM_RELATIONS,
                                                                        dropout=0.3)), edge="type"),
    ]
    b = dict(num_layers=2, out_channels=f)
    model = [
        Case("GraphSAGE", "model", lambda: M.GraphSAGE(f, f, **b)),
        Case("GraphSAGE(norm=batch_norm, jk=cat)", "model",
             lambda: M.GraphSAGE(f, f, norm="batch_norm", jk="cat", **b)),
        Case("GCN", "model", lambda: M.GCN(f, f, **b)),
        Case("GCN(edge_weight)", "model", lambda: M.GCN(f, f, **b), edge="weight"),
        Case("GCN(jk=max)", "model", lambda: M.GCN(f, f, jk="max", **b)),
        Case("GCN(jk=lstm)", "model", lambda: M.GCN(f, f, jk="lstm", **b)),
        Case("GAT", "model", lambda: M.GAT(f, f, heads=2, **b)),
        Case("GAT(v2)", "model", lambda: M.GAT(f, f, heads=2, v2=True, **b)),
        Case("GAT(edge_dim)", "model", lambda: WithEdge(M.GAT(f, f, heads=2, edge_dim=EDGE_DIM, **b),
                                                        keyword="edge_attr"), edge="attr"),
        Case("GIN", "model", lambda: M.GIN(f, f, **b)),
        Case("EdgeCNN", "model", lambda: M.EdgeCNN(f, f, **b)),
        Case("PNA", "model", lambda: M.PNA(f, f, aggregators=PNA_AGGRS, scalers=PNA_SCALERS, deg=PNA_DEG, **b)),
        Case("MLP", "model", lambda: NoGraph(M.MLP([f, f, f]))),
        Case("GraphUNet", "model", lambda: M.GraphUNet(f, f, f, depth=2)),
        Case("DeepGCNLayer(GENConv, res+)", "model",
             lambda: Plain(M.DeepGCNLayer(g.GENConv(f, f), nn.LayerNorm(f), nn.ReLU(), block="res+"))),
        Case("GroupAddRev(SAGEConv)", "model", lambda: Plain(M.GroupAddRev(g.SAGEConv(f // 2, f // 2),
                                                                           num_groups=2))),
        Case("PMLP", "model", lambda: M.PMLP(f, f, f, num_layers=2)),
        Case("RECT_L", "model", lambda: M.RECT_L(f, f)),
        Case("LINKX", "model", lambda: M.LINKX(N_NODES, f, f, f, num_layers=2)),
        Case("SGFormer", "model", lambda: WithBatch(M.SGFormer(f, f, f, trans_dropout=0.0, gnn_num_layers=2,
                                                               gnn_dropout=0.0))),
        Case("Polynormer", "model", lambda: WithBatch(M.Polynormer(f, f, f, local_layers=1, global_layers=1,
                                                                   in_dropout=0.0, dropout=0.0,
                                                                   global_dropout=0.0))),
        Case("LabelPropagation", "model", lambda: Labels(M.LabelPropagation(num_layers=3, alpha=0.9))),
        # dropout in training: compared with the compiled model on one machine (its masks, keyed by id)
        Case("GraphSAGE(dropout)", "model", lambda: M.GraphSAGE(f, f, dropout=0.5, **b)),
        Case("GCN(dropout, jk=cat)", "model", lambda: M.GCN(f, f, dropout=0.5, jk="cat", **b)),
        Case("GAT(dropout)", "model", lambda: M.GAT(f, f, heads=2, dropout=0.5, **b)),
        Case("GIN(dropout)", "model", lambda: M.GIN(f, f, dropout=0.5, **b)),
        Case("PNA(dropout)", "model", lambda: M.PNA(f, f, aggregators=PNA_AGGRS, scalers=PNA_SCALERS, deg=PNA_DEG,
                                                   dropout=0.3, **b)),
        Case("EdgeCNN(dropout)", "model", lambda: M.EdgeCNN(f, f, dropout=0.3, **b)),
        Case("MLP(dropout)", "model", lambda: NoGraph(M.MLP([f, f, f], dropout=0.5))),
        Case("PMLP(dropout)", "model", lambda: M.PMLP(f, f, f, num_layers=2, dropout=0.5)),
        Case("LINKX(dropout)", "model", lambda: M.LINKX(N_NODES, f, f, f, num_layers=2, dropout=0.5)),
    ]
    na_models = {
        "JumpingKnowledge": "swept through the models' jk= option (GraphSAGE jk=cat, GCN jk=max / lstm)",
        "HeteroJumpingKnowledge": hetero,
        "MetaLayer": "a container of the user's own edge/node/global models",
        "Node2Vec": "random-walk node embeddings: no features, trained on walks",
        "MetaPath2Vec": hetero,
        "DeepGraphInfomax": "self-supervised wrapper around the user's encoder (the encoder is what compiles)",
        "InnerProductDecoder": "edge-level decoder of given node embeddings",
        "GAE": "wrapper around the user's encoder (link prediction)",
        "VGAE": "wrapper around the user's encoder (link prediction)",
        "ARGA": "wrapper around the user's encoder (link prediction)",
        "ARGVA": "wrapper around the user's encoder (link prediction)",
        "SignedGCN": "needs positive and negative edge sets",
        "RENet": "temporal knowledge graph",
        "SchNet": pos, "DimeNet": pos, "DimeNetPlusPlus": pos, "ViSNet": pos, "GNNFF": pos,
        "GPSE": "positional-encoding pre-training on a Batch of graphs",
        "GPSENodeEncoder": "encodes precomputed GPSE encodings, no graph argument",
        "to_captum_model": "a function, not a model", "to_captum_input": "a function, not a model",
        "captum_output_to_dicts": "a function, not a model",
        "TGNMemory": "temporal memory of an event stream",
        "CorrectAndSmooth": "post-processing of predictions with true labels and masks",
        "AttentiveFP": "graph-level readout (one row per graph)",
        "NeuralFingerprint": "graph-level readout (one row per graph)",
        "LightGCN": "node-id embeddings for link prediction, forward(edge_index) without features",
        "MaskLabel": "label embedding with a mask, no graph argument",
        "LPFormer": "link prediction", "ARLinkPredictor": "link prediction",
    }
    swept = {c.name.split("(")[0] for c in model}
    for name in M.__all__:
        if name not in swept:
            model.append(Case(name, "model", None, na=na_models.get(name, "not swept (no node-level forward)")))
    return conv + variant + model


@functools.cache
def cases() -> dict[str, Case]:
    return {c.name: c for c in _cases()}


def skipped() -> dict[str, str]:
    """Classes of ``torch_geometric.nn.conv.__all__`` not swept, and why."""
    return {"MessagePassing": "the base class: it has no forward of its own; a user's subclass is what compiles "
                              "(tests/frontends/test_pyg.py covers those)"}


def build(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(DT)
    try:
        model = cases()[name].build().to(DT)
    finally:
        torch.set_default_dtype(prev)
    model.train(not cases()[name].eval)
    return model


# --- running one model ---------------------------------------------------------------------
def run_model(model: nn.Module, x: torch.Tensor, graph: Any, edge: torch.Tensor | None, w: torch.Tensor) -> dict:
    """Output and the gradients of ``sum(out * w)`` w.r.t. x, the edge tensor, every parameter."""
    return zoo_sweep.run_node_model(model, lambda x, e: model(x, graph) if e is None else model(x, graph, e), x, edge, w)


compare = zoo_sweep.compare_nodes


def _worker_case(part, payload: dict) -> dict:
    return zoo_sweep.node_case(part, payload, build, run_model)


# --- the sweep -----------------------------------------------------------------------------
def reference(name: str) -> tuple[Record, dict | None, dict | None]:
    """Eager PyG and the compiled model on one machine (``sc.Graph``); see
    ``zoo_sweep.reference``."""
    import sarcompile as sc

    case = cases()[name]
    inp = inputs(case.graph)
    edge = None if case.edge is None else inp.edge[case.edge]

    def eager(model: nn.Module) -> dict:
        want = run_model(model, inp.x, torch.stack([inp.src, inp.dst]), edge, inp.w)
        if want["out"].shape[0] != N_NODES:
            raise ValueError(f"output has {want['out'].shape[0]} rows, not one per node")
        return want

    def compiled(model: nn.Module) -> dict:
        return run_model(zoo_sweep.distribute(model), inp.x, sc.Graph.from_edges(inp.src, inp.dst, N_NODES), edge, inp.w)

    return zoo_sweep.reference(case, build, eager, compiled, "PyG", compare)


def distributed(rec: Record, want: dict, state: dict, pool: Pool, part_dir: str) -> None:
    case = cases()[rec.name]
    payload = {"name": rec.name, "state": state, "dir": part_dir,
               "edge": None if case.edge is None else inputs(case.graph).edge[case.edge]}
    zoo_sweep.node_distributed(rec, want, pool, payload, N_NODES, F_IN)


def _partition(tmp: str, world_size: int, names: list[str]) -> dict[str, str]:
    """The graphs these cases run on, cut into ``world_size`` parts under ``tmp``; each case's
    directory."""
    import sarcompile as sc

    dirs = {}
    for kind in sorted({cases()[n].graph for n in names}):
        inp = inputs(kind)
        dirs[kind] = os.path.join(tmp, f"{kind}-w{world_size}")
        sc.partition(sc.Graph.from_edges(inp.src, inp.dst, N_NODES), world_size, dirs[kind],
                     node_data={"x": inp.x, "w": inp.w}, method=assignment(world_size))
    return {n: dirs[cases()[n].graph] for n in names}


def sweep(names: list[str], world_sizes=WORLD_SIZES, log=print) -> list[Record]:
    return zoo_sweep.sweep(names, world_sizes, log, reference=reference, partition=_partition,
                           distributed=distributed, width=40,
                           case=_worker_case, frontend=FRONTEND)


# --- output --------------------------------------------------------------------------------
GROUPS = {"conv": "`torch_geometric.nn.conv` classes", "variant": "option variants", "model": "ready-made models"}


def table(records: list[Record], meta: dict) -> str:
    compared = f"float64, {N_NODES} nodes, {meta['edges']} edges; compared: one machine (`sc.Graph`) and"
    return zoo_sweep.table(records, meta, zoo_sweep.header(meta, "PyG zoo", FRONTEND, compared), column="layer",
                           noun="layers and models", untagged={"conv"})


def summary(records: list[Record], meta: dict) -> str:
    header = zoo_sweep.header(meta, "PyG zoo", FRONTEND, "float64; one machine and", seconds=False)
    return zoo_sweep.summary(records, header, GROUPS, column="layer", class_prefix="torch_geometric.nn.")


def main(argv: list[str] | None = None) -> int:
    return zoo_sweep.main(argv, doc=__doc__, script=__file__, results=RESULTS, frontend=FRONTEND, cases=cases,
                          sweep=sweep, table=table, summary=summary, skipped=skipped,
                          describe=lambda: {"edges": make_graph()[0].numel()})


if in_server(__name__):  # the workers fork with every case built once
    zoo_sweep.build_each(cases(), build)

if __name__ == "__main__":
    sys.exit(main())
