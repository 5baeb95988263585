"""The models the trainer builds: :class:`GNN` (SAGE, GCN, GIN or GAT layers over a one-type
graph), and :func:`build_model`, which also builds the typed models of
:mod:`sarcompile.hetero_models`.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import nn as scnn
from ..hetero_models import TYPED_MODELS, build_typed
from .config import MODEL_KEYS, MODELS, TrainConfig, _as_mapping


class GNN(nn.Module):
    """``layers`` graph convolutions; between two of them: [batch norm] -> activation ->
    [+ input, if ``residual`` and the widths match] -> [node dropout]. The last layer
    outputs ``num_classes`` logits (plus its input if ``residual`` and widths match).

    * ``sage``: ``SAGEConv(mean)``; ``gcn``: ``GCNConv``; ``gin``: ``GINConv`` around
      ``Linear -> ReLU -> Linear``; activation ReLU.
    * With ``batch_norm`` the hidden layers have no bias (batch norm cancels it).
    * ``gat``: hidden layers ``GATConv(d, hidden // heads, heads)`` with the heads
      concatenated (``hidden`` wide), the last one ``heads`` heads averaged; attention
      dropout ``dropout``; activation ELU.
    """

    def __init__(
        self,
        model: str,
        in_dim: int,
        num_classes: int,
        layers: int = 2,
        hidden: int = 128,
        heads: int = 4,
        dropout: float = 0.0,
        batch_norm: bool = False,
        residual: bool = False,
    ):
        super().__init__()
        if model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
        dims = [in_dim] + [hidden] * (layers - 1) + [num_classes]
        # A bias right before batch norm is cancelled by it: its true gradient is 0, and
        # Adam would blow the rounding noise in its gradient up into steps of size lr that
        # differ with the number of workers (and move the running mean used in eval).
        self.convs = nn.ModuleList(
            _conv(model, dims[i], dims[i + 1], i == layers - 1, hidden, heads, dropout, not batch_norm)
            for i in range(layers)
        )
        self.norms = nn.ModuleList(scnn.BatchNorm(hidden) for _ in range(layers - 1)) if batch_norm else None
        self.drops = nn.ModuleList(scnn.NodeDropout(dropout) for _ in range(layers - 1)) if dropout > 0 else None
        self.residual = [bool(residual) and dims[i] == dims[i + 1] for i in range(layers)]
        self.act = F.elu if model == "gat" else F.relu

    def forward(self, graph, x: torch.Tensor) -> torch.Tensor:
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            h = conv(graph, x)
            if i < last:
                if self.norms is not None:
                    h = self.norms[i](h)
                h = self.act(h)
            if self.residual[i]:
                h = h + x
            if i < last and self.drops is not None:
                h = self.drops[i](graph, h)
            x = h
        return x


def _conv(
    model: str, d_in: int, d_out: int, last: bool, hidden: int, heads: int, dropout: float, bias_before_norm: bool
) -> nn.Module:
    bias = last or bias_before_norm
    if model == "sage":
        return scnn.SAGEConv(d_in, d_out, "mean", bias=bias)
    if model == "gcn":
        return scnn.GCNConv(d_in, d_out, bias=bias)
    if model == "gin":
        width = hidden if last else d_out
        return scnn.GINConv(nn.Sequential(nn.Linear(d_in, width), nn.ReLU(), nn.Linear(width, d_out, bias=bias)))
    if last:
        return scnn.GATConv(d_in, d_out, heads=heads, concat=False, dropout=dropout)
    return scnn.GATConv(d_in, d_out // heads, heads=heads, concat=True, dropout=dropout, bias=bias)


def build_model(config: Mapping[str, Any] | TrainConfig | argparse.Namespace | None = None,
                **kwargs: Any) -> nn.Module:
    """The eager single-machine model a run trains, from its config.

    ``config`` is a checkpoint's ``"config"`` dict (or any mapping / :class:`TrainConfig` /
    namespace with the fields below); keyword arguments add to or override it. Needs
    ``in_dim`` and ``num_classes``; ``model``, ``layers``, ``hidden``, ``heads``,
    ``dropout``, ``batch_norm`` and ``residual`` default as on the command line. A typed
    model (``rgcn``, ``hgt``: :mod:`sarcompile.hetero_models`) needs ``num_classes``,
    ``target``, ``node_counts``, ``edge_types`` and ``in_dims`` instead of ``in_dim``, and
    takes ``embed_dim`` (default: the target's feature width). Call ``torch.manual_seed``
    first for reproducible initial weights (the trainer seeds with ``--seed``). A
    checkpoint's ``"model"`` state dict loads into the result with ``load_state_dict``,
    whatever number of workers trained it (node tables included, in global row order).
    """
    fields = _as_mapping(config) if config is not None else {}
    fields = {**fields, **kwargs}
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    typed = fields.get("model", defaults["model"]) in TYPED_MODELS
    needed = ("num_classes", "target", "node_counts", "edge_types", "in_dims") if typed else ("in_dim", "num_classes")
    missing = [k for k in needed if fields.get(k) is None]
    if missing:
        raise ValueError(f"build_model needs {' and '.join(missing)} (a checkpoint's config has them)")
    args = {k: fields.get(k, defaults.get(k)) for k in MODEL_KEYS}
    if not typed:
        return GNN(**args)
    in_dims = fields["in_dims"]
    embed_dim = fields.get("embed_dim") or in_dims.get(fields["target"])
    if embed_dim is None:
        raise ValueError(f"the target type {fields['target']!r} has no features to take the embedding width from: "
                         "give embed_dim (--embed-dim)")
    return build_typed(args["model"], fields["node_counts"], fields["edge_types"], in_dims, fields["target"],
                       args["num_classes"], args["hidden"], args["layers"], args["heads"], args["dropout"], embed_dim)
