"""Accuracy on the train, validation and test masks, counted on every worker and summed;
:func:`load_trained` to get a trained model back on one machine; and the checks of a
partition's node data against the model asked for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sarcompile.data.checkpoint import CHECKPOINTS, REPLICATED, latest_checkpoint, read_state
from sarcompile.errors import CheckpointError, PartitionError
from sarcompile.graph.hetero import HeteroGraph
from sarcompile.train.typed_models import TYPED_MODELS
from sarcompile.data.validate import check_node_data
from sarcompile.train import tasks
from sarcompile.train.config import MASKS, NODE_KEYS, ONE_TYPE_MODELS, TrainConfig
from sarcompile.train.model import build_model, call_model


def _metrics(model: nn.Module, graph, x, y: torch.Tensor, masks: dict[str, torch.Tensor],
             task: str = "classification", target: str | None = None) -> dict[str, float | None]:
    """The task's metric on each mask over every worker's nodes, in eval mode (no gradients)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = call_model(model, graph, x, target)
    finally:
        model.train(was_training)
    return tasks.metrics(out, y, masks, task)


def evaluate(model: nn.Module, graph, node_data: Mapping[str, Any], task: str = "classification",
             target: str | None = None) -> dict[str, float | None]:
    """The metric of ``task`` (accuracy for classification) on the train / val / test nodes
    of one machine's graph (no communication).

    For serving a checkpoint: ``evaluate(model, *sc.load_whole_graph(parts))`` gives the
    accuracies the trainer logged for the checkpoint's epoch (labels < 0 do not count); for
    a model of your own pass the run's ``task`` and ``target`` (both in its config). On a
    :class:`~sarcompile.HeteroGraph` (``node_data`` a dict per type), of the ``target``
    type's nodes (by default the model's ``target`` attribute, as the typed built-in models
    have).
    """
    if isinstance(graph, HeteroGraph):
        target = target or getattr(model, "target", None)
        if target is None:
            raise ValueError(f"evaluate on a typed graph needs the target type: pass target=, or a typed model "
                             f"(rgcn, hgt) that has one; got {type(model).__name__}")
        for ntype, data in node_data.items():
            check_node_data(data, allow_nonfinite=True, where=f"node_data[{ntype!r}]")
    else:
        check_node_data(node_data, allow_nonfinite=True, where="node_data")  # the dtypes; NaN just scores wrong
    x, y, masks = _node_tensors(node_data, where="node_data", target=target, task=task)
    return _metrics(model, graph, x, y, masks, task, target)


def load_trained(path: str | os.PathLike) -> tuple[nn.Module, dict[str, Any]]:
    """The eager model of a run (weights loaded, eval mode) and the run's config: ``path``
    is the run directory (``--out``, its latest checkpoint is read), a checkpoint directory
    (every worker's rows of the node tables put together), or an older version's
    checkpoint file."""
    path = Path(path)
    if path.is_dir() and not ((path / REPLICATED).exists() or path.parent.name == CHECKPOINTS):  # a run directory
        found = latest_checkpoint(path)
        if found is None:
            raise CheckpointError(f"run directory '{path}' holds no checkpoint: give the --out of a training run "
                                  "that wrote one, or a checkpoint directory")
        path = found
    state = read_state(path)
    for key in ("config", "model"):
        if key not in state:
            raise CheckpointError(f"checkpoint '{path}' has no {key!r}: not written by sarcompile.train")
    model = build_model(state["config"])
    model.load_state_dict(state["model"])
    return model.eval(), state["config"]


def _node_tensors(data: Mapping[str, Any], where: str, target: str | None = None, task: str = "classification"):
    """x, y and the masks (restricted to labelled nodes, see :func:`.tasks.labels`); the
    dtypes were checked where the data was loaded (sarcompile.data.validate). Of a typed
    graph's node data (a dict per type): x the features of every type that has them, y and
    the masks the ``target`` type's."""
    rows = data if target is None else data.get(target, {})
    missing = [k for k in (NODE_KEYS if target is None else NODE_KEYS[1:]) if k not in rows]
    if missing:
        raise PartitionError(_missing_keys_message(missing, where, target))
    y, labelled = tasks.labels(rows["y"], task, where)
    masks = {k: rows[k].bool() & labelled for k in MASKS}
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
    if cfg.model not in TYPED_MODELS and not cfg.own_model:
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
    if "x" not in described and cfg.embed_dim is None and not cfg.own_model:
        raise PartitionError(f"{where}: the target type {target!r} has no features 'x' to take the embedding width "
                             "from; give --embed-dim")
    return target
