"""PyG heterogeneous models for the tests, the data they run on, and their worker side
(imported by the pool's workers too).

The oracle is PyG itself: each model run eagerly on a ``HeteroData``'s ``x_dict`` /
``edge_index_dict``. The compiled model gets the same features and the typed graph made
from the data (``sc.HeteroGraph.from_pyg``), on one machine or on a worker's shard.
"""

from __future__ import annotations

import torch
import torch_geometric.nn as gnn
from torch_geometric.data import HeteroData

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


def build(name: str, data: HeteroData) -> torch.nn.Module:
    """One of the covered models, in float64, lazy parameters initialised by a dry run (as
    PyG's documentation has it)."""
    torch.manual_seed(0)
    if name == "HeteroConv(SAGE+GAT)":
        model = HeteroSageGat()
    elif name == "to_hetero(GraphSAGE)":
        model = gnn.to_hetero(SAGE(), data.metadata(), aggr="sum")
    elif name == "to_hetero(GAT)":
        model = gnn.to_hetero(GAT(), data.metadata(), aggr="mean")
    elif name == "to_hetero_with_bases(GraphSAGE)":
        model = gnn.to_hetero_with_bases(SAGE(), data.metadata(), num_bases=2, in_channels={"x": 4})
    else:
        raise KeyError(name)
    model = model.double()
    with torch.no_grad():
        model(data.x_dict, data.edge_index_dict)
    return model


MODELS = ("HeteroConv(SAGE+GAT)", "to_hetero(GraphSAGE)", "to_hetero(GAT)")


def loss_weights(out: dict, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed + 1)
    return {t: torch.randn(v.shape, generator=gen, dtype=v.dtype) for t, v in out.items()}


def step(model, x: dict, graph, weights: dict, ids: dict | None) -> dict:
    """Forward, a loss weighted per row, backward: the rows of ``ids`` (all when None)."""
    pick = (lambda t, v: v) if ids is None else (lambda t, v: v[ids[t]])
    x = {t: pick(t, v).clone().requires_grad_() for t, v in x.items()}
    out = model(x, graph)
    loss = sum((out[t] * pick(t, weights[t])).sum() for t in out)
    model.zero_grad()
    loss.backward()
    return {
        "out": {t: v.detach() for t, v in out.items()},
        "x_grad": {t: (torch.zeros_like(v) if v.grad is None else v.grad) for t, v in x.items()},
        "param_grads": {k: sc.global_sum(torch.zeros_like(p) if p.grad is None else p.grad)
                        for k, p in model.named_parameters()},
    }


def run_worker(rank: int, world_size: int, payload: dict) -> dict:
    """One worker: its part of the typed partition, one step of the compiled model."""
    part = sc.load_partition(payload["dir"], rank=rank, world_size=world_size)
    model = sc.distribute(payload["model"])
    result = step(model, payload["x"], part.graph, payload["weights"], part.global_ids)
    result["ids"] = part.global_ids
    return result
