"""PyG layers inside a user's module as PyG's examples write them (imported by the pool's
workers too): RevGNN's ``GroupAddRev`` blocks (examples/rev_gnn.py) and HAN's ``HANConv``
with attention dropout on metapath relations of one node type (examples/hetero/han_imdb.py)."""

from __future__ import annotations

from typing import Any

import torch
import torch_geometric.nn as gnn
from torch import nn
from torch_geometric.data import HeteroData

import cases
import pyg_hetero_models


class RevBlock(nn.Module):
    """RevGNN's block: LayerNorm, ReLU, SAGEConv (examples/rev_gnn.py's GNNBlock)."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = nn.LayerNorm(channels, elementwise_affine=True)
        self.conv = gnn.SAGEConv(channels, channels)

    def reset_parameters(self):
        self.norm.reset_parameters()
        self.conv.reset_parameters()

    def forward(self, x, edge_index, dropout_mask=None):
        x = self.norm(x).relu()
        if self.training and dropout_mask is not None:
            x = x * dropout_mask
        return self.conv(x, edge_index)


class RevGNN(nn.Module):
    """Two ``GroupAddRev`` layers of two groups between linear maps (taking ``(g, x)`` as
    :mod:`cases` calls its models)."""

    def __init__(self, f_in: int = 6, hidden: int = 8, f_out: int = 3):
        super().__init__()
        self.lin1 = nn.Linear(f_in, hidden)
        self.convs = nn.ModuleList(gnn.GroupAddRev(RevBlock(hidden // 2), num_groups=2) for _ in range(2))
        self.norm = nn.LayerNorm(hidden)
        self.lin2 = nn.Linear(hidden, f_out)

    def forward(self, g, x):
        x = self.lin1(x)
        for conv in self.convs:
            x = conv(x, g)
        return self.lin2(self.norm(x).relu())


cases.MODELS["rev_gnn"] = RevGNN


def run_worker(rank: int, world_size: int, payload: dict[str, Any]) -> cases.Result:
    """:func:`cases.run_worker`, with RevGNN known (a worker imports this module)."""
    return cases.run_worker(rank, world_size, payload)


def metapath_data(seed: int, n: int = 11) -> HeteroData:
    """One node type, ``movie``, and two metapath relations over it (as AddMetaPaths with
    drop_orig_edge_types leaves IMDB), with self-loops and isolated nodes as they fall."""
    gen = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data["movie"].x = torch.randn(n, 5, generator=gen, dtype=torch.float64)
    for k in range(2):
        data["movie", f"metapath_{k}", "movie"].edge_index = torch.randint(0, n, (2, 3 * n), generator=gen)
    return data


class HAN(nn.Module):
    """The HAN example's model: HANConv (attention dropout 0.6), then a Linear on the rows."""

    def __init__(self, metadata, hidden: int = 8, out: int = 3):
        super().__init__()
        self.han_conv = gnn.HANConv(-1, hidden, heads=2, dropout=0.6, metadata=metadata)
        self.lin = nn.Linear(hidden, out)

    def forward(self, x_dict, edge_index_dict):
        return {"movie": self.lin(self.han_conv(x_dict, edge_index_dict)["movie"])}


def run_hetero_worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict:
    """:func:`pyg_hetero_models.run_worker` with torch seeded first: HANConv's attention
    dropout stream is seeded from torch's RNG when the model is compiled."""
    torch.manual_seed(payload["torch_seed"])
    return pyg_hetero_models.run_worker(rank, world_size, payload)
