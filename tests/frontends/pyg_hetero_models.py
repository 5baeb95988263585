"""PyG heterogeneous models for the tests, the data they run on, and their worker side
(imported by the pool's workers too).

The oracle is PyG itself: each model run eagerly on a ``HeteroData``'s ``x_dict`` /
``edge_index_dict``. The compiled model gets the same features and the typed graph made
from the data (``sc.HeteroGraph.from_pyg``), on one machine or on a worker's shard.

The models of :data:`TYPED_MODELS` run on the data's homogeneous view instead
(``data.to_homogeneous()``: one graph, ``node_type`` per node and ``edge_type`` per edge),
compiled over ``sc.Graph.from_pyg`` of it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch_geometric.nn as gnn
from torch_geometric.data import Data, HeteroData

import sarcompile as sc

WIDTHS = {"paper": 4, "author": 3, "field": 2}


def hetero_data(seed: int, nodes: dict[str, int] | None = None, edges: int = 24) -> HeteroData:
    """paper / author / field with writes, its reverse, cites and has_topic; random edges
    (isolated nodes, multi-edges and self-loops in cites as they fall)."""
    gen = torch.Generator().manual_seed(seed)
    nodes = nodes or {"paper": 9, "author": 7, "field": 3}
    data = HeteroData()
    for t, n in nodes.items():
        data[t].x = torch.randn(n, WIDTHS[t], generator=gen, dtype=torch.float64)

    def rand(s, d):
        return torch.stack([torch.randint(0, nodes[s], (edges,), generator=gen),
                            torch.randint(0, nodes[d], (edges,), generator=gen)])

    data["author", "writes", "paper"].edge_index = rand("author", "paper")
    data["paper", "rev_writes", "author"].edge_index = data["author", "writes", "paper"].edge_index.flip(0)
    data["paper", "cites", "paper"].edge_index = rand("paper", "paper")
    data["paper", "has_topic", "field"].edge_index = rand("paper", "field")
    return data


class HeteroSageGat(torch.nn.Module):
    """HeteroConv of SAGEConv and GATConv (bipartite and within a type), then of GraphConv."""

    def __init__(self):
        super().__init__()
        self.conv1 = gnn.HeteroConv({
            ("author", "writes", "paper"): gnn.SAGEConv((3, 4), 8),
            ("paper", "rev_writes", "author"): gnn.GATConv((4, 3), 4, heads=2, add_self_loops=False),
            ("paper", "cites", "paper"): gnn.GATConv(4, 8, heads=1),
            ("paper", "has_topic", "field"): gnn.SAGEConv((4, 2), 8, aggr="max"),
        }, aggr="sum")
        self.conv2 = gnn.HeteroConv({
            ("author", "writes", "paper"): gnn.SAGEConv(8, 5),
            ("paper", "cites", "paper"): gnn.GraphConv(8, 5),
            ("paper", "rev_writes", "author"): gnn.GraphConv(8, 5, aggr="mean"),
        }, aggr="mean")

    def forward(self, x_dict, edge_index_dict):
        h = {k: v.relu() for k, v in self.conv1(x_dict, edge_index_dict).items()}
        return self.conv2(h, edge_index_dict)


class HeteroDrop(HeteroSageGat):
    """Dropout per node type as a typed model writes it: ``F.dropout`` on every type's input
    and ``nn.Dropout`` between the layers (the compiler keys each type's masks by its ids)."""

    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.3)

    def forward(self, x_dict, edge_index_dict):
        x_dict = {t: F.dropout(x, p=0.5, training=self.training) for t, x in x_dict.items()}
        h = {t: self.drop(v.relu()) for t, v in self.conv1(x_dict, edge_index_dict).items()}
        return self.conv2(h, edge_index_dict)


class SAGE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = gnn.SAGEConv((-1, -1), 8)
        self.conv2 = gnn.SAGEConv((-1, -1), 5)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class GAT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = gnn.GATConv((-1, -1), 4, heads=2, add_self_loops=False)
        self.lin1 = gnn.Linear(-1, 8)
        self.conv2 = gnn.GATConv((-1, -1), 5, heads=1, add_self_loops=False)

    def forward(self, x, edge_index):
        x = (self.conv1(x, edge_index) + self.lin1(x)).relu()
        return self.conv2(x, edge_index)


class HeteroDirect(gnn.HeteroConv):
    """HeteroConv itself as the model, called with keyword dicts of edge features and
    weights (``edge_attr_dict``, ``edge_weight_dict``) as PyG passes them on: GATConv with
    edge features across two types, GraphConv with edge weights within one, GATv2Conv back."""

    def __init__(self):
        super().__init__({
            ("author", "writes", "paper"): gnn.GATConv((3, 4), 3, heads=2, edge_dim=EDGE_DIM, add_self_loops=False),
            ("paper", "cites", "paper"): gnn.GraphConv(4, 6),
            ("paper", "rev_writes", "author"): gnn.GATv2Conv((4, 3), 3, heads=2, add_self_loops=False),
            ("paper", "has_topic", "field"): gnn.GraphConv((4, 2), 6, aggr="max"),
        }, aggr="sum")


class HGT(torch.nn.Module):
    """PyG's HGT example: a lazy Linear per type, two HGTConv layers, a Linear on top."""

    def __init__(self, metadata):
        super().__init__()
        self.lin_dict = torch.nn.ModuleDict({t: gnn.Linear(-1, 8) for t in metadata[0]})
        self.convs = torch.nn.ModuleList([gnn.HGTConv(8, 8, metadata, heads=2) for _ in range(2)])
        self.lin = gnn.Linear(8, 3)

    def forward(self, x_dict, edge_index_dict):
        x_dict = {t: self.lin_dict[t](x).relu() for t, x in x_dict.items()}
        for conv in self.convs:
            x_dict = conv(x_dict, edge_index_dict)
        return {t: self.lin(x) for t, x in x_dict.items()}


class HAN(torch.nn.Module):
    """PyG's HAN example: HANConv (semantic attention over each type's relations), a Linear
    on the paper rows."""

    def __init__(self, metadata):
        super().__init__()
        self.han = gnn.HANConv(-1, 8, metadata, heads=2)
        self.lin = torch.nn.Linear(8, 3)

    def forward(self, x_dict, edge_index_dict):
        out = self.han(x_dict, edge_index_dict)
        return {"paper": self.lin(out["paper"]), "author": out["author"]}


class DictLinear(torch.nn.Module):
    """HeteroDictLinear (lazy) aligning the types' widths, then HeteroConv over GINConv
    (across types and within one) and SAGEConv."""

    def __init__(self, metadata):
        super().__init__()
        self.lin = gnn.HeteroDictLinear(-1, 6, types=metadata[0])
        self.conv = gnn.HeteroConv({rel: gnn.SAGEConv(6, 5) if rel[1] == "rev_writes" else
                                    gnn.GINConv(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh()),
                                                train_eps=True) for rel in metadata[1]}, aggr="max")

    def forward(self, x_dict, edge_index_dict):
        x_dict = {t: x.tanh() for t, x in self.lin(x_dict).items()}
        return self.conv(x_dict, edge_index_dict)


EDGE_DIM = 2


def edge_inputs(name: str, data: HeteroData, seed: int) -> dict:
    """The keyword dicts of per-edge tensors model ``name`` is called with (in the data's
    edge order): ``{keyword: {relation: tensor}}``."""
    if name != "HeteroConv(direct)":
        return {}
    gen = torch.Generator().manual_seed(seed + 2)
    writes, cites = ("author", "writes", "paper"), ("paper", "cites", "paper")
    count = {rel: data[rel].edge_index.size(1) for rel in (writes, cites)}
    return {"edge_attr_dict": {writes: torch.randn(count[writes], EDGE_DIM, generator=gen, dtype=torch.float64)},
            "edge_weight_dict": {cites: torch.rand(count[cites], generator=gen, dtype=torch.float64)}}


def build(name: str, data: HeteroData) -> torch.nn.Module:
    """One of the covered models, in float64, lazy parameters initialised by a dry run (as
    PyG's documentation has it)."""
    torch.manual_seed(0)
    metadata = data.metadata()
    if name == "HeteroConv(SAGE+GAT)":
        model = HeteroSageGat()
    elif name == "HeteroConv(dropout)":
        model = HeteroDrop()
    elif name == "HeteroConv(direct)":
        model = HeteroDirect()
    elif name == "to_hetero(GraphSAGE)":
        model = gnn.to_hetero(SAGE(), metadata, aggr="sum")
    elif name == "to_hetero(GAT)":
        model = gnn.to_hetero(GAT(), metadata, aggr="mean")
    elif name == "to_hetero_with_bases(GraphSAGE)":
        model = gnn.to_hetero_with_bases(SAGE(), metadata, num_bases=2, in_channels={"x": 4})
    elif name == "HGT":
        model = HGT(metadata)
    elif name == "HGTConv":
        model = gnn.HGTConv({t: WIDTHS[t] for t in metadata[0]}, 4, metadata, heads=2)
    elif name == "HANConv":
        model = gnn.HANConv({t: WIDTHS[t] for t in metadata[0]}, 6, metadata, heads=3)
    elif name == "HAN":
        model = HAN(metadata)
    elif name == "HeteroDictLinear":
        model = DictLinear(metadata)
    else:
        raise KeyError(name)
    model = model.double()
    with torch.no_grad():
        model(data.x_dict, data.edge_index_dict, **edge_inputs(name, data, 0))
    return model


MODELS = ("HeteroConv(SAGE+GAT)", "HeteroConv(direct)", "to_hetero(GraphSAGE)", "to_hetero(GAT)", "HGT", "HGTConv",
          "HANConv", "HAN", "HeteroDictLinear")


def loss_weights(out: dict, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed + 1)
    return {t: torch.randn(v.shape, generator=gen, dtype=v.dtype) for t, v in out.items() if v is not None}


def step(model, x: dict, graph, weights: dict, ids: dict | None, edge: dict | None = None) -> dict:
    """Forward, a loss weighted per row, backward: the rows of ``ids`` (all when None).
    ``edge``: keyword dicts of per-edge tensors (see :func:`edge_inputs`), in the graph's
    edge order (on a worker, its shard's)."""
    pick = (lambda t, v: v) if ids is None else (lambda t, v: v[ids[t]])
    x = {t: pick(t, v).clone().requires_grad_() for t, v in x.items()}
    edge = {k: {rel: e.clone().requires_grad_(e.is_floating_point()) for rel, e in d.items()}
            for k, d in (edge or {}).items()}
    out = model(x, graph, **edge)
    loss = sum((out[t] * pick(t, weights[t])).sum() for t in weights)
    model.zero_grad()
    loss.backward()
    return {
        "out": {t: v.detach() for t, v in out.items() if v is not None},
        "x_grad": {t: (torch.zeros_like(v) if v.grad is None else v.grad) for t, v in x.items()},
        "edge_grad": {(k, rel): (torch.zeros_like(e) if e.grad is None else e.grad)
                      for k, d in edge.items() for rel, e in d.items()},
        "param_grads": {k: sc.global_sum(torch.zeros_like(p) if p.grad is None else p.grad)
                        for k, p in model.named_parameters()},
    }


def run_worker(rank: int, world_size: int, payload: dict) -> dict:
    """One worker: its part of the typed partition, one step of the compiled model."""
    part = sc.load_partition(payload["dir"], rank=rank, world_size=world_size)
    model = sc.distribute(payload["model"], seed=payload.get("seed"))
    g = part.graph
    edge = {k: {rel: e[g[rel].edge_ids] for rel, e in d.items()} for k, d in payload.get("edge", {}).items()}
    result = step(model, payload["x"], g, payload["weights"], part.global_ids, edge)
    result["ids"] = part.global_ids
    result["edge_ids"] = {rel: g[rel].edge_ids for rel in g.edge_types}
    return result


# -- on the homogeneous view -----------------------------------------------------------------------
NUM_NODE_TYPES, NUM_RELATIONS, TYPED_WIDTH = 3, 4, 4


def typed_data(seed: int, nodes: dict[str, int] | None = None, edges: int = 24) -> Data:
    """:func:`hetero_data` with features of one width, as one graph: ``data.to_homogeneous()``
    with an ``edge_attr`` of ``EDGE_DIM`` per edge."""
    data = hetero_data(seed, nodes, edges)
    gen = torch.Generator().manual_seed(seed + 3)
    for t in data.node_types:
        data[t].x = torch.randn(data[t].num_nodes, TYPED_WIDTH, generator=gen, dtype=torch.float64)
    out = data.to_homogeneous()
    out.edge_attr = torch.randn(out.num_edges, EDGE_DIM, generator=gen, dtype=torch.float64)
    return out


class TypedRGCN(torch.nn.Module):
    """RGCN on the homogeneous view: a learnable embedding per node type added to the
    features, a HeteroLinear (a weight per node type), RGCNConv and FastRGCNConv over the
    edge types."""

    def __init__(self):
        super().__init__()
        self.type_emb = torch.nn.Embedding(NUM_NODE_TYPES, TYPED_WIDTH)
        self.lin = gnn.HeteroLinear(TYPED_WIDTH, 6, NUM_NODE_TYPES)
        self.conv1 = gnn.RGCNConv(6, 6, NUM_RELATIONS)
        self.conv2 = gnn.FastRGCNConv(6, 5, NUM_RELATIONS, num_bases=2)

    def forward(self, x, edge_index, node_type, edge_type, edge_attr):
        h = self.lin(x + self.type_emb(node_type), node_type).relu()
        return self.conv2(self.conv1(h, edge_index, edge_type).relu(), edge_index, edge_type)


class TypedHEAT(torch.nn.Module):
    """Two HEATConv layers (node and edge types, edge features; heads concatenated, then
    averaged)."""

    def __init__(self):
        super().__init__()
        self.conv1 = gnn.HEATConv(TYPED_WIDTH, 3, NUM_NODE_TYPES, NUM_RELATIONS, edge_type_emb_dim=3,
                                  edge_dim=EDGE_DIM, edge_attr_emb_dim=2, heads=2)
        self.conv2 = gnn.HEATConv(6, 4, NUM_NODE_TYPES, NUM_RELATIONS, edge_type_emb_dim=2, edge_dim=EDGE_DIM,
                                  edge_attr_emb_dim=3, heads=2, concat=False)

    def forward(self, x, edge_index, node_type, edge_type, edge_attr):
        h = self.conv1(x, edge_index, node_type, edge_type, edge_attr).relu()
        return self.conv2(h, edge_index, node_type, edge_type, edge_attr)


TYPED_MODELS = {"RGCNConv+FastRGCNConv(to_homogeneous)": TypedRGCN, "HEATConv(to_homogeneous)": TypedHEAT}


def build_typed(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return TYPED_MODELS[name]().double()


def typed_step(model, x, graph, node_type, edge_type, edge_attr, weights) -> dict:
    """Forward, a loss weighted per row, backward (edge tensors in the graph's edge order)."""
    x = x.clone().requires_grad_()
    edge_attr = edge_attr.clone().requires_grad_()
    out = model(x, graph, node_type, edge_type, edge_attr)
    model.zero_grad()
    (out * weights).sum().backward()
    zero = lambda t: torch.zeros_like(t) if t.grad is None else t.grad  # noqa: E731  (no edges: no gradient)
    return {"out": out.detach(), "x_grad": zero(x), "edge_grad": zero(edge_attr),
            "param_grads": {k: sc.global_sum(torch.zeros_like(p) if p.grad is None else p.grad)
                            for k, p in model.named_parameters()}}


def run_typed_worker(rank: int, world_size: int, payload: dict) -> dict:
    """One worker: its part of the homogeneous view, one step of the compiled model."""
    part = sc.load_partition(payload["dir"], rank=rank, world_size=world_size)
    g, nd = part.graph, part.node_data
    result = typed_step(sc.distribute(payload["model"]), nd["x"], g, nd["node_type"],
                        payload["edge_type"][g.edge_ids], payload["edge_attr"][g.edge_ids], nd["w"])
    result["ids"], result["edge_ids"] = part.global_ids, g.edge_ids
    return result
