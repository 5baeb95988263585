"""A PyG model taking a ``Data`` (``forward(self, data)``) and its worker side (imported by
the workers too, so it lives at a module path they can import)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import torch_geometric.nn as gnn
from torch import nn
from torch_geometric.data import Data

import sarcompile as sc
from sarcompile.graph.shard import PartData, ShardGraph


class DataGCN(nn.Module):
    """PyG's examples' ``forward(self, data)``: the features, the graph, the edge weights and
    a per-node tensor read from the ``Data``."""

    def __init__(self, f_in: int = 6, hidden: int = 8, f_out: int = 3):
        super().__init__()
        self.conv1 = gnn.GCNConv(f_in, hidden)
        self.conv2 = gnn.GCNConv(hidden, f_out)

    def forward(self, data):
        x, edge_index = data.x, data.edge_index
        h = F.relu(self.conv1(x, edge_index, data.edge_weight)) * data.scale
        return F.log_softmax(self.conv2(h, edge_index), dim=1)


def make_data_model(seed: int) -> DataGCN:
    torch.manual_seed(seed)
    return DataGCN().double()


def run_data_worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """The compiled model called with a ``Data`` of this worker's shard: output rows,
    input-gradient rows, all-reduced parameter gradients."""
    part: PartData = payload["part"]
    shard = ShardGraph.from_part(part, rank, world_size, payload["num_nodes"], payload["num_edges"])
    model = make_data_model(payload["seed"])
    model.load_state_dict(payload["state"])
    x = part.node_data["x"].clone().requires_grad_(True)
    data = Data(x=x, edge_index=shard, edge_weight=payload["edge_weight"][shard.edge_ids],
                scale=part.node_data["scale"])
    out = sc.distribute(model)(data)
    (out * part.node_data["w"]).sum().backward()
    sc.sync_gradients(model)
    return {"out": out.detach(), "x_grad": x.grad, "grads": {k: p.grad.clone() for k, p in model.named_parameters()}}
