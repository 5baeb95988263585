"""The models the trainer builds: :class:`GNN` (SAGE, GCN, GIN or GAT layers over a one-type
graph); :func:`build_model`, which also builds the typed models of
:mod:`sarcompile.train.typed_models` and a user's own (``--model MODULE:FACTORY``); and
:func:`call_model`, which calls any of them in its own convention.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sarcompile import nn as scnn
from sarcompile.errors import GraphError
from sarcompile.train.typed_models import TYPED_MODELS, build_typed
from sarcompile.train.config import MODEL_KEYS, MODELS, TrainConfig, _as_mapping
from sarcompile.train.factory import build_from_factory, is_factory_spec


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
                *, rows: Mapping[str, torch.Tensor] | None = None, **kwargs: Any) -> nn.Module:
    """The eager single-machine model a run trains, from its config.

    ``config`` is a checkpoint's ``"config"`` dict (or any mapping / :class:`TrainConfig` /
    namespace with the fields below); keyword arguments add to or override it. Needs
    ``in_dim`` and ``num_classes``; ``model``, ``layers``, ``hidden``, ``heads``,
    ``dropout``, ``batch_norm`` and ``residual`` default as on the command line. A typed
    model (``rgcn``, ``hgt``: :mod:`sarcompile.train.typed_models`) needs ``num_classes``,
    ``target``, ``node_counts``, ``edge_types`` and ``in_dims`` instead of ``in_dim``, and
    takes ``embed_dim`` (default: the target's feature width). Call ``torch.manual_seed``
    first for reproducible initial weights (the trainer seeds with ``--seed``). A
    checkpoint's ``"model"`` state dict loads into the result with ``load_state_dict``,
    whatever number of workers trained it (node tables included, in global row order).

    ``rows`` (a worker's global ids per node type, ``part.graph.global_ids``) makes a typed
    model's node tables (:class:`sarcompile.nn.NodeTable`) hold only those rows: a worker
    never makes a whole table, and its rows equal one machine's. A model of one's own
    (``MODULE:FACTORY``) is built by its factory, its tables whole (``rows`` is not given
    to it); each worker keeps its own rows of them once it is compiled.
    """
    fields = _as_mapping(config) if config is not None else {}
    fields = {**fields, **kwargs}
    if is_factory_spec(str(fields.get("model", ""))):
        return _build_own(fields)
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
                       args["num_classes"], args["hidden"], args["layers"], args["heads"], args["dropout"], embed_dim,
                       rows)


def factory_arguments(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments the trainer gives a model's factory (see :func:`build_model`)."""
    if fields.get("node_counts") is None:
        given = {"in_features": fields["in_dim"], "num_classes": fields["num_classes"]}
    else:
        counts = dict(fields["node_counts"])
        given = {
            "in_features": {t: fields["in_dims"].get(t) for t in counts},
            "num_classes": fields["num_classes"],
            "metadata": (list(counts), [tuple(e) for e in fields["edge_types"]]),
            "num_nodes": counts,
        }
    own = dict(fields.get("model_args") or {})
    clash = sorted(set(own) & set(given))
    if clash:
        raise ValueError(f"--model-args sets {', '.join(clash)}, which the trainer gives the factory from the "
                         "partition; leave them out of --model-args")
    return {**given, **own}


def _build_own(fields: Mapping[str, Any]) -> nn.Module:
    """A model of the user's own: ``fields["model"]`` is ``MODULE:FACTORY``, called with
    :func:`factory_arguments`."""
    spec = fields["model"]
    missing = [k for k in ("in_dim", "num_classes") if k not in fields]
    if missing:
        raise ValueError(f"build_model needs {' and '.join(missing)} (a checkpoint's config has them)")
    kwargs = factory_arguments(fields)
    try:
        model = build_from_factory(spec, kwargs, "--model-args")
    except GraphError as e:
        raise GraphError(f"cannot build the model {spec} ({e}). Its file or module must be importable where the "
                         "run starts (for a dotted module: on PYTHONPATH)") from None
    if not isinstance(model, nn.Module):
        raise GraphError(f"{spec}({json.dumps(kwargs, default=str)}) returned a {type(model).__name__}, not a "
                         "torch.nn.Module: the factory must return the model")
    if any(isinstance(p, nn.parameter.UninitializedParameter) for p in model.parameters()) and not graph_first(model):
        _dry_run(model, fields)
    return model


def _dry_run(model: nn.Module, fields: Mapping[str, Any]) -> None:
    """PyG's documented dry run, which gives lazy layers (``in_channels=-1``) their shapes:
    one eager call on two nodes of each type with features and one edge per relation, as
    ``model(x, edge_index)`` or ``model(x_dict, edge_index_dict)``. Every worker makes it
    alike (the same seed), and the compiler never sees a lazy parameter."""
    edge = torch.tensor([[0], [1]])
    if fields.get("node_counts") is None:
        x, edges = torch.zeros(2, fields["in_dim"]), edge
    else:
        x = {t: torch.zeros(2, d) for t, d in fields["in_dims"].items()}
        edges = {tuple(e): edge for e in fields["edge_types"]}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(x, edges)
    finally:
        model.train(was_training)


# Names of forward's first parameter that say the model takes the graph first (sarcompile's
# (g, x), DGL's (g, feat) and (blocks, x)); and of its second that say it takes the
# features first (PyG's (x, edge_index), (x_dict, edge_index_dict)).
_GRAPH_FIRST = frozenset({"g", "graph", "G", "hg", "block", "blocks", "mfgs", "graphs"})
_GRAPH_SECOND = frozenset({"edge_index", "edge_index_dict", "adj", "adj_t", "g", "graph", "edge_index_or_adj"})


def graph_first(model: nn.Module) -> bool:
    """Whether ``model`` is called ``model(graph, x)`` (else ``model(x, graph)``), read
    from the names of its forward's first two parameters."""
    forward = getattr(model, "original", model).forward
    names = [p.name for p in inspect.signature(forward).parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:2]
    if names and names[0] in _GRAPH_FIRST:
        return True
    if len(names) == 2 and names[1] in _GRAPH_SECOND:
        return False
    raise GraphError(
        f"{type(getattr(model, 'original', model)).__name__}.forward({', '.join(names)}): the trainer cannot tell "
        "where the graph goes. It calls a model as sarcompile's and DGL's models are called, forward(g, x) (first "
        f"parameter one of {', '.join(sorted(_GRAPH_FIRST))}), or as PyG's, forward(x, edge_index) (second parameter "
        f"one of {', '.join(sorted(_GRAPH_SECOND))}); name forward's parameters so"
    )


def call_model(model: nn.Module, graph: Any, x: Any, target: str | None = None) -> torch.Tensor:
    """``model``'s output for ``graph`` and its features ``x`` (a dict per type on a typed
    graph), called in its convention (:func:`graph_first`); of a typed graph, the
    ``target`` type's rows where the model returns a dict per type."""
    out = model(graph, x) if graph_first(model) else model(x, graph)
    if isinstance(out, Mapping):
        if target not in out:
            raise GraphError(f"{type(getattr(model, 'original', model)).__name__} returned a dict of "
                             f"{sorted(out)}, without the target type {target!r}: return its rows (or a dict with it)")
        out = out[target]
    if not isinstance(out, torch.Tensor):
        raise GraphError(f"{type(getattr(model, 'original', model)).__name__} returned a {type(out).__name__}; the "
                         "trainer needs a tensor of the target nodes' outputs (or a dict per node type of them)")
    return out
