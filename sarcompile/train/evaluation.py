"""Accuracy on the train, validation and test masks, counted on every worker and summed;
:func:`load_trained` to get a trained model back on one machine; and the checks of a
partition's node data against the model asked for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..data.checkpoint import load_checkpoint
from ..errors import CheckpointError, PartitionError
from ..hetero import HeteroGraph
from ..hetero_models import TYPED_MODELS
from ..data.validate import check_node_data
from .config import MASKS, NODE_KEYS, ONE_TYPE_MODELS, TrainConfig
from .model import build_model


def _counts(model: nn.Module, graph, x: torch.Tensor, y: torch.Tensor, masks: dict[str, torch.Tensor]) -> torch.Tensor:
    """(correct, total) per mask on this worker's nodes, in eval mode: 6 float64 values."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            pred = model(graph, x).argmax(-1)
    finally:
        model.train(was_training)
    values = []
    for key in MASKS:
        m = masks[key]
        values += [(pred[m] == y[m]).sum(), m.sum()]
    return torch.stack(values).to(torch.float64)


def _accuracies(counts: torch.Tensor) -> dict[str, float | None]:
    """Accuracy per mask from summed (correct, total) pairs; None where a mask is empty."""
    out = {}
    for i, key in enumerate(MASKS):
        correct, total = float(counts[2 * i]), float(counts[2 * i + 1])
        out[key.replace("_mask", "_acc")] = correct / total if total else None
    return out


def evaluate(model: nn.Module, graph, node_data: Mapping[str, Any]) -> dict[str, float | None]:
    """Accuracy on the train / val / test nodes of one machine's graph (no communication).

    For serving a checkpoint: ``evaluate(model, *sc.load_whole_graph(parts))`` gives the
    accuracies the trainer logged for the checkpoint's epoch (labels < 0 do not count).
    On a :class:`~sarcompile.HeteroGraph` (``node_data`` a dict per type), of the model's
    ``target`` type's nodes.
    """
    target = None
    if isinstance(graph, HeteroGraph):
        target = getattr(model, "target", None)
        if target is None:
            raise ValueError(f"evaluate on a typed graph needs a typed model (rgcn, hgt) with a target type, "
                             f"got {type(model).__name__}")
        for ntype, data in node_data.items():
            check_node_data(data, allow_nonfinite=True, where=f"node_data[{ntype!r}]")
    else:
        check_node_data(node_data, allow_nonfinite=True, where="node_data")  # the dtypes; NaN just scores wrong
    x, y, masks = _node_tensors(node_data, where="node_data", target=target)
    return _accuracies(_counts(model, graph, x, y, masks))


def load_trained(path: str | os.PathLike) -> tuple[nn.Module, dict[str, Any]]:
    """The eager model of a checkpoint (weights loaded, eval mode) and the run's config."""
    state = load_checkpoint(path)
    for key in ("config", "model"):
        if key not in state:
            raise CheckpointError(f"checkpoint '{path}' has no {key!r}: not written by sarcompile.train")
    model = build_model(state["config"])
    model.load_state_dict(state["model"])
    return model.eval(), state["config"]


def _node_tensors(data: Mapping[str, Any], where: str, target: str | None = None):
    """x, y and the masks (restricted to labelled nodes); the dtypes were checked where the
    data was loaded (sarcompile.data.validate). Of a typed graph's node data (a dict per type):
    x the features of every type that has them, y and the masks the ``target`` type's."""
    rows = data if target is None else data.get(target, {})
    missing = [k for k in (NODE_KEYS if target is None else NODE_KEYS[1:]) if k not in rows]
    if missing:
        raise PartitionError(_missing_keys_message(missing, where, target))
    if rows["y"].dim() != 1:
        raise PartitionError(
            f"{where}: node data 'y' has shape {tuple(rows['y'].shape)}; the trainer needs one class id per node "
            "(shape [nodes]; re-partition with y.reshape(-1) for a [nodes, 1] tensor)"
        )
    y = rows["y"].long()
    masks = {k: rows[k].bool() & (y >= 0) for k in MASKS}  # labels < 0: unlabelled
    x = rows["x"] if target is None else {t: d["x"] for t, d in data.items() if "x" in d}
    return x, y, masks


def _missing_keys_message(missing: list[str], where: str, target: str | None = None) -> str:
    keys = ", ".join(repr(k) for k in missing)
    if target is not None:
        return (
            f"{where} has no node data {keys} of the target type {target!r}; the trainer needs "
            f"{', '.join(NODE_KEYS[1:])} of the type it predicts (integer labels with -1 for unlabelled, boolean "
            f"masks), and x where a type has features. Partition with sc.partition(g, n, out, node_data="
            f"{{{target!r}: {{'x': ..., 'y': ..., 'train_mask': ..., 'val_mask': ..., 'test_mask': ...}}}})"
        )
    return (
        f"{where} has no node data {keys}; the trainer needs "
        f"{', '.join(NODE_KEYS)} (features, integer labels with -1 for unlabelled, boolean masks). "
        "Partition with sc.partition(g, n, out, node_data={'x': ..., 'y': ..., 'train_mask': ..., "
        "'val_mask': ..., 'test_mask': ...}) or put those keys in the --edges file of "
        "`sarcompile partition`."
    )


def _check_model_kind(cfg: TrainConfig, manifest) -> str | None:
    """The target type of a typed partition (None for a one-type one), after checking that
    ``--model`` trains this kind of graph and the partition has what the trainer needs."""
    where = f"partition '{cfg.parts}'"
    if not manifest.typed:
        if cfg.model in TYPED_MODELS:
            raise PartitionError(f"--model {cfg.model} trains heterogeneous graphs, but {where} has one node type: "
                                 f"use --model {', '.join(ONE_TYPE_MODELS)}")
        missing = [k for k in NODE_KEYS if k not in manifest.node_data]
        if missing:
            raise PartitionError(_missing_keys_message(missing, where))
        return None
    types = list(manifest.node_types)
    if cfg.model not in TYPED_MODELS:
        raise PartitionError(f"{where} is of a heterogeneous graph (node types {types}); --model {cfg.model} trains "
                             f"one-type graphs: use --model {' or --model '.join(TYPED_MODELS)}")
    labelled = [t for t in types if "y" in manifest.node_types[t]["node_data"]]
    if cfg.target is not None and cfg.target not in types:
        raise PartitionError(f"--target {cfg.target}: {where} has no such node type; its types are {types}")
    if cfg.target is None and len(labelled) != 1:
        if not labelled:
            raise PartitionError(
                f"{where} has no target type: none of its node types {types} has labels 'y'. The trainer predicts "
                "the class of one node type, which holds y and the train/val/test masks; partition with "
                "node_data={'paper': {'x': ..., 'y': ..., 'train_mask': ..., 'val_mask': ..., 'test_mask': ...}}"
            )
        raise PartitionError(f"{where}: node types {labelled} all have labels 'y'; say which to predict with --target")
    target = cfg.target or labelled[0]
    described = manifest.node_types[target]["node_data"]
    missing = [k for k in NODE_KEYS[1:] if k not in described]
    if missing:
        raise PartitionError(_missing_keys_message(missing, where, target))
    if "x" not in described and cfg.embed_dim is None:
        raise PartitionError(f"{where}: the target type {target!r} has no features 'x' to take the embedding width "
                             "from; give --embed-dim")
    return target
