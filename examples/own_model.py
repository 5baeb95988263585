"""Models of your own for ``python -m sarcompile.train --model examples/own_model.py:FACTORY``.

Each factory is called with ``in_features`` and ``num_classes`` (on a typed partition also
``metadata`` and ``num_nodes``) and the items of ``--model-args``, and returns an ordinary
PyG model: nothing here knows about sarcompile. See docs/own-model.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GATConv, SAGEConv, to_hetero
from torch_geometric.nn.models import GraphSAGE


class SageThenGat(nn.Module):
    """A SAGE layer, dropout, then a GAT layer, called as PyG models are: ``(x, edge_index)``."""

    def __init__(self, in_features: int, hidden: int, num_classes: int, heads: int, dropout: float):
        super().__init__()
        self.encoder = SAGEConv(in_features, hidden)
        self.attend = GATConv(hidden, num_classes, heads=heads, concat=False)
        self.dropout = dropout

    def forward(self, x, edge_index):
        h = F.relu(self.encoder(x, edge_index))
        h = F.dropout(h, p=self.dropout, training=self.training)
        return self.attend(h, edge_index)


def build(in_features: int, num_classes: int, hidden: int = 32, heads: int = 2, dropout: float = 0.5) -> nn.Module:
    return SageThenGat(in_features, hidden, num_classes, heads, dropout)


def graphsage(in_features: int, num_classes: int, hidden: int = 32, layers: int = 2, dropout: float = 0.5):
    """PyG's ready-made GraphSAGE, unchanged."""
    return GraphSAGE(in_features, hidden, layers, out_channels=num_classes, dropout=dropout)


class _Layers(nn.Module):
    def __init__(self, hidden: int, num_classes: int):
        super().__init__()
        self.conv1 = SAGEConv((-1, -1), hidden)
        self.conv2 = SAGEConv((-1, -1), num_classes)

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


class Typed(nn.Module):
    """``to_hetero`` over every relation; each node type without features learns a table of
    its own (``self.tables``), whose rows are its nodes' features."""

    def __init__(self, in_features: dict, num_classes: int, metadata, num_nodes: dict, hidden: int, target: str):
        super().__init__()
        self.project = nn.ModuleDict({t: nn.Linear(d, hidden) for t, d in in_features.items() if d is not None})
        self.tables = nn.ParameterDict({t: nn.Parameter(torch.randn(num_nodes[t], hidden) * 0.1)
                                        for t, d in in_features.items() if d is None})
        self.gnn = to_hetero(_Layers(hidden, num_classes), metadata, aggr="sum")
        self.target = target

    def forward(self, x_dict, edge_index_dict):
        h = {t: self.project[t](x) for t, x in x_dict.items()}
        h.update({t: table for t, table in self.tables.items()})
        return self.gnn(h, edge_index_dict)[self.target]


def typed(in_features: dict, num_classes: int, metadata, num_nodes: dict, hidden: int = 16, target: str = "paper"):
    return Typed(in_features, num_classes, metadata, num_nodes, hidden, target)
