"""A DGL model of your own for ``python -m sarcompile.train --model
examples/own_model_dgl.py:build`` (in the DGL environment, scripts/dgl_env.sh): plain DGL,
nothing here knows about sarcompile. See docs/training.md, "Your own model"."""

from __future__ import annotations

import torch.nn.functional as F
from dgl.nn import GATConv, SAGEConv
from torch import nn


class SageGat(nn.Module):
    def __init__(self, in_features: int, hidden: int, num_classes: int, heads: int, dropout: float):
        super().__init__()
        self.sage = SAGEConv(in_features, hidden, "mean", feat_drop=dropout)
        self.gat = GATConv(hidden, num_classes, heads)

    def forward(self, g, feat):
        h = F.relu(self.sage(g, feat))
        return self.gat(g, h).mean(1)  # the heads averaged


def build(in_features: int, num_classes: int, hidden: int = 32, heads: int = 2, dropout: float = 0.5) -> nn.Module:
    return SageGat(in_features, hidden, num_classes, heads, dropout)
