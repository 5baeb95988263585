"""``python -m sarcompile.train``: full-batch GNN training on a partition directory.

    torchrun --standalone --nproc-per-node 4 -m sarcompile.train --parts parts/ \\
        --model sage --layers 3 --hidden 256 --epochs 100
    python -m sarcompile.train --parts parts1/          # a 1-part partition, one process

Every worker loads its partition, builds the same model (same seed), compiles it with
:func:`sarcompile.distribute` and trains it: the cross-entropy summed over its training
nodes divided by the *global* number of training nodes, gradients summed across workers,
Adam. Dropout masks are keyed by global node / edge id and batch norm statistics span
all workers, so the per-epoch loss and accuracies are the same on any number of workers
(to float rounding) as on one machine.

A typed partition (a heterogeneous graph, e.g. ``sarcompile partition --dataset ogbn-mag``)
trains ``--model rgcn`` or ``--model hgt`` (:mod:`sarcompile.hetero_models`). The *target*
type is the one node type holding ``y`` and the masks (ogbn-mag's papers; ``--target``
when several do): the loss and the accuracies are its nodes'. Types without features learn
an embedding each, ``--embed-dim`` wide (default: the target's feature width), a node
table whose rows each worker holds and updates for its own nodes only, never all-reduced;
dropout masks are keyed by (type, id within the type)::

    sarcompile partition --dataset ogbn-mag --root dataset --parts 4 --out mag4
    torchrun --standalone --nproc-per-node 4 -m sarcompile.train --parts mag4 --model rgcn --hidden 64

Each epoch trains one step, then evaluates (eval mode, no gradients) the accuracy on the
``train_mask``, ``val_mask`` and ``test_mask`` nodes, counted on every worker and summed.
Rank 0 shows a progress bar (stderr), prints one line per epoch (stdout) and appends one
JSON line per epoch to the log (``OUT/log.jsonl``)::

    {"epoch": 3, "loss": 1.27, "train_acc": 0.61, "val_acc": 0.58, "test_acc": 0.59,
     "epoch_s": 0.41, "train_s": 0.33, "world_size": 4,
     "comm": {"sent": {"forward": [81920, 79872, ...], "backward": [...], "allreduce": [...]},
              "received": {"forward": [...], "backward": [...], "allreduce": [...]}}}

``epoch_s`` is the whole epoch, ``train_s`` the training step alone (forward, backward,
gradient all-reduce, optimizer step). ``comm`` is the bytes each worker (list index =
rank) sent and received during that training step, per phase: ``forward`` (remote
feature rows), ``backward`` (remote feature-gradient rows), ``allreduce`` (parameter
gradients; an all-reduce is counted as receiving what it sends) and, with
``--batch-norm``, ``batch_norm`` (its statistics). Evaluation traffic is not counted: it
is not a cost of training. All zero on one worker.

Communication reduction (opt-in, approximate; exact SAR is the default), passed to
:func:`sarcompile.distribute` (see :mod:`sarcompile.runtime.link`): ``--staleness K``
(remote rows refreshed every K training iterations), ``--bounded-staleness S``
(pipelined, exact every S), ``--compress 1bit|2bit|int4|int8`` (rows crossing workers
quantized, with error feedback unless ``--no-error-feedback``), restricted to the layers
``--compress-layers`` lists (e.g. ``convs.0``; default all).

A checkpoint (``OUT/checkpoint.pt``, see :mod:`sarcompile.checkpoint`) is written every
``--checkpoint-every`` epochs and at the end, node tables and their Adam state gathered
whole in global row order; ``--resume`` continues from it, on any number of workers, to the
same numbers an uninterrupted run gives -- except with the communication reduction options:
their stale caches and error-feedback residuals are not checkpointed, so a resumed run
starts its links afresh (its first iteration refreshes every remote row) and differs
from an uninterrupted one. A checkpoint records the partition's ``graph_sha256`` (the
same for any number of parts), and ``--resume`` refuses a partition of another graph.
The workers wait for a checkpoint write up to ``SARCOMPILE_CHECKPOINT_TIMEOUT`` seconds
(default 4 x ``SARCOMPILE_TIMEOUT``), in a process group of their own.

Rank 0 locks ``OUT`` for the run's life (:mod:`sarcompile.rundir`): a second run on it is
refused on every rank before anything is written, and a fresh run refuses an ``OUT``
with a checkpoint or a log that already holds lines. Node data is checked when it is
loaded (:mod:`sarcompile.validate`), and a loss that is not finite stops the run with a
:class:`~sarcompile.errors.TrainingError` naming the epoch, before that epoch is logged
or checkpointed; ``--allow-nonfinite`` lets both through.

:func:`build_model` rebuilds the eager single-machine model from a checkpoint's config,
and :func:`load_trained` does both steps::

    model, config = load_trained("runs/x/checkpoint.pt")   # eval mode, one machine
    g, data = sc.load_whole_graph("parts")
    evaluate(model, g, data)   # {'train_acc': ..., 'val_acc': ..., 'test_acc': ...}
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from . import nn as scnn
from .checkpoint import CHECKPOINT_NAME, global_state, load_checkpoint, save_checkpoint, shard_state
from .compiler import distribute
from . import errors
from .errors import CheckpointError, CommError, PartitionError, RunDirError, SarcompileError, TrainingError
from .hetero import HeteroGraph, parse_relation_key
from .hetero_models import TYPED_MODELS, build_typed
from .partitioning import _atomic_write, load_partition, read_manifest
from .rundir import lock_dir, remove_stale_temps
from .runtime import failure
from .runtime.comm import TIME_LEDGER, global_max, global_sum, init, shutdown, stats, sync_gradients, timeout
from .runtime.memory import (MMAP_THRESHOLD, MemoryProbe, active_allocator, allocator_tuned, find_allocator, floor_bytes,
                             huge_pages_requested)
from .tables import table_type
from .validate import check_node_data
from .vocab import Compression, Mode

__all__ = ["GNN", "TrainConfig", "build_model", "evaluate", "load_trained", "main", "parse_args", "train"]

ONE_TYPE_MODELS = ("sage", "gcn", "gin", "gat")
MODELS = ONE_TYPE_MODELS + TYPED_MODELS
MODES = Mode.values()
NODE_KEYS = ("x", "y", "train_mask", "val_mask", "test_mask")
MASKS = ("train_mask", "val_mask", "test_mask")
# What build_model needs: saved in every checkpoint's "config".
MODEL_KEYS = ("model", "in_dim", "num_classes", "layers", "hidden", "heads", "dropout", "batch_norm", "residual")
# ... and what a typed model (rgcn, hgt) needs besides: the target type, the embedding width
# and the graph's types, relations and feature widths (None for a one-type model).
TYPED_KEYS = ("target", "embed_dim", "node_counts", "edge_types", "in_dims")
DERIVED_KEYS = ("in_dim", "num_classes", "node_counts", "edge_types", "in_dims")  # from the data, not flags
# Options that change the numbers: a checkpoint resumes only with the same values.
# (--mode, --epochs, --parts, --out, --log, --checkpoint-every may change between runs.)
# The communication reduction options are among them; checkpoints older than these
# options lack them and count as written with the defaults (exact).
COMM_KEYS = ("staleness", "bounded_staleness", "compress", "error_feedback", "compress_layers")
RESUME_KEYS = MODEL_KEYS + TYPED_KEYS + ("lr", "weight_decay", "seed") + COMM_KEYS
COMPRESS = Compression.values()
# Phases of sarcompile.runtime.comm.stats gathered per epoch, in this order; the first
# three are always logged, the others only when some worker sent or received something.
PHASES = ("forward", "backward", "allreduce", "batch_norm")
ALWAYS_LOGGED = PHASES[:3]
FORMAT = 1
NEGATED = ("error_feedback", "progress")  # options set by a --no-... flag
CHECKPOINT_TIMEOUT_ENV = "SARCOMPILE_CHECKPOINT_TIMEOUT"
CHECKPOINT_TIMEOUT_FACTOR = 4  # default: this many SARCOMPILE_TIMEOUTs


@dataclass
class TrainConfig:
    """Every option of ``python -m sarcompile.train`` (field ``x_y`` is flag ``--x-y``)."""

    parts: str
    model: str = "sage"
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    epochs: int = 100
    lr: float = 0.01
    weight_decay: float = 0.0
    dropout: float = 0.5
    batch_norm: bool = False
    residual: bool = False
    target: str | None = None
    embed_dim: int | None = None
    mode: str = "sar"
    seed: int = 0
    log: str | None = None
    out: str | None = None
    checkpoint_every: int = 10
    resume: bool = False
    stop_after: int | None = None
    progress: bool = True
    allow_nonfinite: bool = False
    staleness: int = 1
    bounded_staleness: int | None = None
    compress: str | None = None
    error_feedback: bool = True
    compress_layers: list[str] | None = None
    blocks_in_flight: int = 1

    def __post_init__(self) -> None:
        # A list, whatever sequence was given: the resume check compares it with the
        # checkpoint's list. (A str is left alone for validate to refuse.)
        if isinstance(self.compress_layers, tuple):
            self.compress_layers = list(self.compress_layers)

    def validate(self) -> None:
        """Raise a :class:`ValueError` naming the first option out of range."""
        if self.model not in MODELS:
            raise ValueError(f"--model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("layers", "hidden", "heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.blocks_in_flight < 0:
            raise ValueError(f"--blocks-in-flight must be >= 0 (0: no overlap), got {self.blocks_in_flight}")
        if self.epochs < 0 or self.checkpoint_every < 0:
            raise ValueError("--epochs and --checkpoint-every must be >= 0")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout must be in [0, 1), got {self.dropout}")
        if self.model == "gat" and self.layers > 1 and self.hidden % self.heads:
            raise ValueError(
                f"--hidden {self.hidden} is not a multiple of --heads {self.heads}: GAT's hidden layers "
                "concatenate the heads, each hidden/heads wide"
            )
        self._validate_typed()
        self._validate_comm()

    def _validate_typed(self) -> None:
        """The options that belong to one kind of model only."""
        if self.model in TYPED_MODELS:
            if self.batch_norm or self.residual:
                raise ValueError(f"--batch-norm and --residual are options of {', '.join(ONE_TYPE_MODELS)}; "
                                 f"--model {self.model} has neither")
            if self.model == "hgt" and self.hidden % self.heads:
                raise ValueError(f"--hidden {self.hidden} is not a multiple of --heads {self.heads}: HGT splits "
                                 "its width among the heads")
            if self.embed_dim is not None and self.embed_dim < 1:
                raise ValueError(f"--embed-dim must be >= 1, got {self.embed_dim}")
        elif self.target is not None or self.embed_dim is not None:
            raise ValueError(f"--target and --embed-dim are options of the typed models ({', '.join(TYPED_MODELS)}), "
                             f"not of --model {self.model}")

    def _validate_comm(self) -> None:
        """The communication reduction options, named by their flags (sc.distribute's own
        checks would name its keyword arguments)."""
        if self.staleness < 1:
            raise ValueError(f"--staleness must be >= 1 (1: exact, every iteration refreshes), got {self.staleness}")
        if self.bounded_staleness is not None and self.bounded_staleness < 1:
            raise ValueError(f"--bounded-staleness must be >= 1, got {self.bounded_staleness}")
        if self.bounded_staleness is not None and self.staleness != 1:
            raise ValueError("--staleness and --bounded-staleness are two ways to use stale rows; pick one")
        if self.compress is not None and self.compress not in COMPRESS:
            raise ValueError(f"--compress must be one of {', '.join(COMPRESS)}, got {self.compress!r}")
        if self.compress_layers is not None and (
            isinstance(self.compress_layers, str) or not all(isinstance(c, str) for c in self.compress_layers)
        ):
            raise ValueError(f"--compress-layers takes layer paths such as convs.0, got {self.compress_layers!r}")


# -- the model ---------------------------------------------------------------------------------
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


def _as_mapping(config: Any) -> dict[str, Any]:
    if isinstance(config, TrainConfig):
        return dataclasses.asdict(config)
    if isinstance(config, argparse.Namespace):
        return vars(config)
    if isinstance(config, Mapping):
        return dict(config)
    raise TypeError(f"expected a config dict, TrainConfig or argparse.Namespace, got {type(config).__name__}")


# -- evaluation --------------------------------------------------------------------------------
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
    data was loaded (sarcompile.validate). Of a typed graph's node data (a dict per type):
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


# -- collectives that tolerate a one-process run -------------------------------------------------
def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not _distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _agree(error: str | None, what: str, group: Any = None, limit_s: float | None = None) -> None:
    """Raise on every rank if any rank failed (so no rank waits for the others forever).

    With a ``group`` (see :func:`_checkpoint_group`) the ranks meet there and wait up to
    ``limit_s`` seconds: checkpoint I/O may take longer than a step's exchange.
    """
    flag = torch.tensor([1.0 if error else 0.0], dtype=torch.float64)
    if group is None:
        failed = float(global_sum(flag))
    else:
        work = dist.all_reduce(flag, group=group, async_op=True)
        try:
            work.wait(timedelta(seconds=limit_s))
        except RuntimeError as e:  # gloo reports timeouts and closed peers as RuntimeError
            raise CommError(
                f"{what}: a peer worker did not answer within {limit_s:.0f}s or went away ({e}). "
                f"Check the other workers' logs; raise {CHECKPOINT_TIMEOUT_ENV} if the disk is just slow."
            ) from None
        failed = float(flag[0])
    if error:
        raise CheckpointError(error)
    if failed:
        err = CheckpointError(f"{what} failed on another worker (see its error message)")
        err.peer_failed = True  # a consequence: the failing worker is the one to blame
        raise err


def checkpoint_timeout() -> float:
    """Seconds the workers wait for a checkpoint to be written or read:
    ``SARCOMPILE_CHECKPOINT_TIMEOUT``, by default 4 x ``SARCOMPILE_TIMEOUT`` (20 minutes
    with its default). A :class:`ValueError` naming the variable for anything but a
    positive number."""
    text = os.environ.get(CHECKPOINT_TIMEOUT_ENV, "").strip()
    if not text:
        return CHECKPOINT_TIMEOUT_FACTOR * timeout()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"{CHECKPOINT_TIMEOUT_ENV} must be a number of seconds > 0 (how long the workers wait for a checkpoint "
            f"to be written), got {text!r}"
        )
    return value


def _checkpoint_group(limit_s: float) -> Any:
    """A process group of all workers whose waits are bounded by ``limit_s`` instead of
    SARCOMPILE_TIMEOUT: the workers meet there while rank 0 writes a checkpoint, which on
    a slow disk may take longer than any exchange should (None on one worker)."""
    if not _distributed():
        return None
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=limit_s))


# -- checkpoints ---------------------------------------------------------------------------------
def _write_checkpoint(
    path: Path, rank: int, make_state, epoch: int, group: Any = None, limit_s: float | None = None
) -> None:
    """Rank 0 writes ``make_state(epoch)`` (called on every rank: it may gather rows from
    all of them); every rank learns whether it worked (meeting in ``group`` for up to
    ``limit_s`` seconds)."""
    error = None
    try:
        state = make_state(epoch)
        if rank == 0:
            save_checkpoint(path, state)
    # Whatever failed, the other ranks must hear of it rather than wait for rank 0.
    except Exception as e:  # noqa: BLE001
        error = f"writing checkpoint '{path}' failed ({type(e).__name__}: {e}); the previous checkpoint is intact"
    _agree(error, f"writing checkpoint '{path}'", group, limit_s)


def _read_checkpoint(path: Path, group: Any = None, limit_s: float | None = None) -> dict[str, Any]:
    state, error = None, None
    try:
        state = load_checkpoint(path)
        if state.get("format") != FORMAT or not {"model", "optimizer", "epoch", "config"} <= state.keys():
            raise CheckpointError(f"checkpoint '{path}' was not written by this version of sarcompile.train")
    except CheckpointError as e:
        error = str(e)
    _agree(error, f"reading checkpoint '{path}'", group, limit_s)
    return state


def _check_resumable(state: dict[str, Any], run: dict[str, Any], graph: dict[str, int], path: Path) -> None:
    """Refuse a checkpoint made with other numbers-changing options or of another graph."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.name in COMM_KEYS}
    saved = {**defaults, **state["config"]}  # a checkpoint older than COMM_KEYS: exact
    diff = [k for k in RESUME_KEYS if saved.get(k) != run[k]]
    if diff:
        flags = " ".join(_flag(k, saved.get(k)) for k in diff if k not in DERIVED_KEYS)
        detail = ", ".join(f"{k}: checkpoint {saved.get(k)!r}, this run {run[k]!r}" for k in diff)
        raise CheckpointError(
            f"checkpoint '{path}' was trained with other options ({detail}). Resume with the same options"
            + (f" ({flags})" if flags else "")
            + ", or start a new run in another --out"
        )
    saved_graph = state.get("graph") or {}
    sizes = ("num_nodes", "num_edges")
    if any(saved_graph.get(k) != graph[k] for k in sizes):
        theirs, ours = ({k: g.get(k) for k in sizes} for g in (saved_graph, graph))
        raise CheckpointError(
            f"checkpoint '{path}' was trained on another graph ({theirs}, this partition: {ours}); "
            "resume with a partition of the same graph"
        )
    # Checkpoints and manifests older than the identity have none: then the sizes must do.
    theirs, ours = saved_graph.get("sha256"), graph.get("sha256")
    if theirs and ours and theirs != ours:
        raise CheckpointError(
            f"checkpoint '{path}' was trained on another graph of the same size ({graph['num_nodes']} nodes, "
            f"{graph['num_edges']} edges): its graph sha256 is {theirs}, this partition's is {ours} (other edges, "
            "features, labels or masks). Resume with a partition of the graph it was trained on, or start a new "
            "run in another --out"
        )


def _flag(key: str, value: Any) -> str:
    """The command-line flag that sets option ``key`` to ``value``."""
    flag = "--" + key.replace("_", "-")
    if key in NEGATED:  # a default-on option whose flag turns it off
        return f"(no --no-{flag[2:]})" if value else f"--no-{flag[2:]}"
    if isinstance(value, bool):
        return flag if value else f"(no {flag})"
    if value is None:
        return f"(no {flag})"
    if isinstance(value, (list, tuple)):
        return " ".join([flag, *map(str, value)])
    return f"{flag} {value}"


# -- the JSONL log ---------------------------------------------------------------------------------
def _prepare_log(path: Path, keep_through: int) -> None:
    """Keep the log's lines of epochs <= ``keep_through`` (0: start empty), atomically."""
    kept = []
    if keep_through > 0 and path.is_file():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            if isinstance(rec, dict) and isinstance(rec.get("epoch"), int) and rec["epoch"] <= keep_through:
                kept.append(line + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, lambda f: f.write("".join(kept).encode()))


# -- the trainer ---------------------------------------------------------------------------------
def train(config: TrainConfig | Mapping[str, Any] | argparse.Namespace | Sequence[str]) -> list[dict[str, Any]]:
    """Train as ``python -m sarcompile.train`` does; returns this call's per-epoch records.

    ``config`` is a :class:`TrainConfig`, a dict or namespace of its fields, or a list of
    command-line arguments. Joins the process group torchrun describes (or uses the one
    already up; a single process without torchrun). Does not tear the group down: the
    caller does (``sc.shutdown()``), as :func:`main` does. Every rank returns the same
    records (the values are summed across workers); with ``resume`` only the epochs run
    by this call.

    Rank 0 locks the run directory for the whole call (:mod:`sarcompile.rundir`): a second
    run on the same ``out`` is refused on every rank with a :class:`RunDirError` before
    anything is written.
    """
    cfg = _as_config(config)
    cfg.validate()
    ckpt_limit = checkpoint_timeout()
    rank, world_size = init()
    manifest = read_manifest(cfg.parts)
    target = _check_model_kind(cfg, manifest)

    lock, group = None, None
    try:
        out, failure = None, None
        if rank == 0:
            try:
                lock, out = _claim_out_dir(cfg)
            except SarcompileError as e:
                failure = (type(e).__name__, str(e))
        out, failure = _broadcast((out, failure))
        if failure is not None:  # the same error on every rank, each exits cleanly
            raise getattr(errors, failure[0])(failure[1])
        group = _checkpoint_group(ckpt_limit)
        return _train(cfg, rank, world_size, manifest, target, Path(out), group, ckpt_limit)
    finally:
        if group is not None:
            dist.destroy_process_group(group)
        if lock is not None:
            lock.release()


def _claim_out_dir(cfg: TrainConfig):
    """Rank 0: create and lock the run directory, refuse what would overwrite another run's
    files, and delete the temporary files a killed run left; returns (lock, out)."""
    try:
        out = Path(_out_dir(cfg))
    except OSError as e:
        raise RunDirError(f"cannot create the run directory ({e}); choose another --out") from None
    lock = lock_dir(out, "training run")
    try:
        log_path = Path(cfg.log) if cfg.log else out / "log.jsonl"
        if not cfg.resume and (out / CHECKPOINT_NAME).exists():
            raise CheckpointError(
                f"'{out}' already holds a checkpoint: pass --resume to continue that run, or choose another --out"
            )
        if not cfg.resume and log_path.is_file() and log_path.stat().st_size > 0:
            raise RunDirError(
                f"the log '{log_path}' already holds another run's lines (and there is no checkpoint to resume): "
                "a fresh run does not overwrite it; choose another --out (or --log), or delete it"
            )
        stale = [CHECKPOINT_NAME] + ([log_path.name] if log_path.parent.resolve() == out.resolve() else [])
        remove_stale_temps(out, stale)
    except OSError as e:
        lock.release()
        raise RunDirError(f"cannot use the run directory '{out}' ({e})") from None
    except BaseException:
        lock.release()
        raise
    return lock, str(out)


def _train(cfg: TrainConfig, rank: int, world_size: int, manifest, target: str | None, out: Path, group: Any,
           ckpt_limit: float):
    log_path = Path(cfg.log) if cfg.log else out / "log.jsonl"
    ckpt_path = out / CHECKPOINT_NAME
    floor = floor_bytes()
    part = load_partition(cfg.parts, allow_nonfinite=cfg.allow_nonfinite)
    x, y, masks = _node_tensors(part.node_data, where=f"partition '{cfg.parts}'", target=target)
    num_classes = int(global_max(y.max().reshape(1) if y.numel() else y.new_full((1,), -1))) + 1
    num_train = int(global_sum(masks["train_mask"].sum()))
    if num_classes < 1 or num_train == 0:
        raise PartitionError(f"partition '{cfg.parts}' has no labelled training nodes (train_mask & y >= 0)"
                             + (f" of the target type {target!r}" if target else ""))
    run = {**dataclasses.asdict(cfg), "num_classes": num_classes, **_model_fields(cfg, manifest, target, x)}
    graph = {"num_nodes": manifest.num_nodes, "num_edges": manifest.num_edges}
    if manifest.graph_sha256:  # the partition's identity, whatever its number of parts
        graph["sha256"] = manifest.graph_sha256

    state = _read_checkpoint(ckpt_path, group, ckpt_limit) if cfg.resume else None
    if state is not None:
        _check_resumable(state, run, graph, ckpt_path)
    torch.manual_seed(cfg.seed)  # same initial weights and dropout seeds on every worker
    net = build_model(run)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start = 0
    if state is not None:
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        start = int(state["epoch"])
    if target is not None:  # each worker keeps its own rows of the node tables, and of their Adam state
        shard_state(net, opt, part.graph)
    _check_layer_paths(net, cfg.compress_layers)
    model = distribute(
        net, mode=cfg.mode, staleness=cfg.staleness, bounded_staleness=cfg.bounded_staleness,
        compress=cfg.compress, error_feedback=cfg.error_feedback, compress_layers=cfg.compress_layers,
        blocks_in_flight=cfg.blocks_in_flight,
    )

    def make_state(epoch: int) -> dict[str, Any] | None:
        """Every rank calls it (the node tables' rows are gathered); rank 0 gets the state."""
        if target is not None:
            weights, optimizer = global_state(net, opt, part.graph)
        else:
            weights, optimizer = net.state_dict(), opt.state_dict()
        if rank != 0:
            return None
        return {
            "format": FORMAT,
            "epoch": epoch,
            "model": weights,
            "optimizer": optimizer,
            "config": {k: run[k] for k in RESUME_KEYS},  # what build_model and --resume need
            "args": dataclasses.asdict(cfg),  # the whole command line of the run that wrote it
            "rng": {"torch": torch.get_rng_state()},
            "graph": graph,
            "world_size": world_size,
            "mode": cfg.mode,
        }

    show = rank == 0
    if show:
        _prepare_log(log_path, start)
        where = f"resuming from epoch {start}" if start else "starting"
        print(
            f"{world_size} worker{'s' if world_size > 1 else ''}, {num_train} training nodes"
            f"{f' of {target!r}' if target else ''}, "
            f"{cfg.model} x {cfg.layers} layers, mode={cfg.mode}{_comm_summary(cfg)}; {where}; writing {out}",
            flush=True,
        )
    records: list[dict[str, Any]] = []
    stopped = False
    saved = start if state is not None else None  # the epoch of the checkpoint on disk
    estimate = model.plan(cfg.parts, optimizer=opt).memory_estimate()[rank].peak_bytes
    probe = MemoryProbe()
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(open(log_path, "a")) if show else None
        bar = stack.enter_context(
            tqdm(total=cfg.epochs, initial=min(start, cfg.epochs), unit="epoch", file=sys.stderr,
                 disable=not (show and cfg.progress), dynamic_ncols=True)
        )
        stack.enter_context(probe)
        for epoch in range(start + 1, cfg.epochs + 1):
            t0 = time.perf_counter()
            stats.reset()
            loss, optimizer_s = _train_step(model, opt, part.graph, x, y, masks["train_mask"], num_train)
            train_s = time.perf_counter() - t0
            # read before evaluating: its traffic and waits are not training's
            traffic, times = _comm_row(rank, world_size), _time_row(rank, world_size, train_s, optimizer_s)
            counts = _counts(model, part.graph, x, y, masks)
            # One all-reduce per epoch: the loss, the accuracy counts, every rank's traffic and time ledger.
            summed = global_sum(torch.cat([loss.to(torch.float64).reshape(1), counts, traffic.reshape(-1),
                                           times.reshape(-1)]))
            n, m = 1 + counts.numel(), 1 + counts.numel() + traffic.numel()
            rec = {"epoch": epoch, "loss": float(summed[0]), **_accuracies(summed[1:n])}
            if not (cfg.allow_nonfinite or math.isfinite(rec["loss"])):  # the same sum on every rank
                raise TrainingError(_nonfinite_loss_message(epoch, rec["loss"], ckpt_path, saved))
            rec.update(epoch_s=round(time.perf_counter() - t0, 4), train_s=round(train_s, 4), world_size=world_size)
            rec["comm"] = _comm_record(summed[n:m].reshape(traffic.shape))
            # to the microsecond: a rank's exchange waits on a small graph can sum to under 0.1 ms
            rec["time"] = {k: [round(float(v), 6) for v in summed[m:].reshape(times.shape)[:, i]]
                           for i, k in enumerate(TIME_LEDGER)}
            records.append(rec)
            if log is not None:
                log.write(json.dumps(rec) + "\n")
                log.flush()
                bar.write(_epoch_line(rec), file=sys.stdout)
                sys.stdout.flush()
                bar.set_postfix(loss=f"{rec['loss']:.4f}", val=_fmt(rec["val_acc"]), refresh=False)
                bar.update(1)
            stopped = cfg.stop_after is not None and epoch == cfg.stop_after
            every = cfg.checkpoint_every and epoch % cfg.checkpoint_every == 0
            if every or stopped or epoch == cfg.epochs:
                _write_checkpoint(ckpt_path, rank, make_state, epoch, group, ckpt_limit)
                saved = epoch
            if stopped:
                break

    if stopped:
        if show:
            print(f"stopped after epoch {records[-1]['epoch']} (--stop-after); continue with --resume", flush=True)
        return records
    _report(records, probe, rank, world_size, start, floor, estimate)
    return records


def _nonfinite_loss_message(epoch: int, loss: float, ckpt_path: Path, saved: int | None) -> str:
    kept = (
        f"the last good checkpoint, of epoch {saved}, is kept in '{ckpt_path}'"
        if saved is not None
        else "no checkpoint was written before it"
    )
    return (
        f"epoch {epoch}: the training loss is {loss}, not finite, so every later step would be too; stopped, and "
        f"{kept}. Lower --lr, or check the node data for extreme values; --allow-nonfinite trains on regardless"
    )


def _model_fields(cfg: TrainConfig, manifest, target: str | None, x) -> dict[str, Any]:
    """What :func:`build_model` needs besides the options and the class count: the feature
    width of a one-type graph; a typed graph's types, relations, feature widths, target
    and embedding width (the target's feature width unless --embed-dim says)."""
    if target is None:
        return {"in_dim": x.shape[1], **{k: None for k in TYPED_KEYS}}
    in_dims = {t: v.shape[1] for t, v in x.items()}
    return {
        "in_dim": in_dims.get(target),
        "target": target,
        "embed_dim": cfg.embed_dim or in_dims[target],
        "node_counts": {t: info["num_nodes"] for t, info in manifest.node_types.items()},
        "edge_types": [list(parse_relation_key(k)) for k in manifest.edge_types],
        "in_dims": in_dims,
    }


def _train_step(model, opt, graph, x, y, mask, num_train: int) -> tuple[torch.Tensor, float]:
    """One full-batch step; returns this worker's share of the global mean loss, and the
    seconds the optimizer's step took."""
    opt.zero_grad()
    out = model(graph, x)
    loss = F.cross_entropy(out[mask], y[mask], reduction="sum") / num_train
    loss.backward()
    for p in model.parameters():
        # On one machine every row of a node table has a gradient (0 where nothing reached
        # it): a worker holding no rows of its type must step it too, so that Adam's state
        # (its step count) is the same on every worker.
        if p.grad is None and table_type(p) is not None:
            p.grad = torch.zeros_like(p)
    sync_gradients(model)  # each worker holds its nodes' share of the gradient: sum them
    start = time.perf_counter()
    opt.step()
    return loss.detach(), time.perf_counter() - start


def _check_layer_paths(net: nn.Module, paths: list[str] | None) -> None:
    """Refuse a --compress-layers path that names no layer of the model: the compiler would
    silently leave everything exact."""
    if paths is None:
        return
    known = {name for name, _ in net.named_modules() if name}
    unknown = [p for p in paths if p not in known]
    if unknown:
        stack = net.convs if isinstance(net, GNN) else net.layers
        prefix = "convs" if isinstance(net, GNN) else "layers"
        layers = " ".join(f"{prefix}.{i}" for i in range(len(stack)))  # the ones that communicate
        raise ValueError(f"--compress-layers {' '.join(unknown)}: no such layer in this model (its layers: {layers})")


def _comm_summary(cfg: TrainConfig) -> str:
    """The communication reduction options for the start line ('' when exact)."""
    parts = []
    if cfg.staleness != 1:
        parts.append(f"staleness={cfg.staleness}")
    if cfg.bounded_staleness is not None:
        parts.append(f"bounded_staleness={cfg.bounded_staleness}")
    if cfg.compress is not None:
        parts.append(f"compress={cfg.compress}" + ("" if cfg.error_feedback else " (stochastic rounding)"))
    if parts and cfg.compress_layers is not None:
        parts.append(f"layers {' '.join(cfg.compress_layers)}")
    return "".join(", " + p for p in parts)


def _own_row(rank: int, world_size: int, values: list[float]) -> torch.Tensor:
    """``values`` in row ``rank`` of a zero ``[world_size, len(values)]`` float64 tensor, so
    that summing the tensors of all workers gathers everyone's row."""
    table = torch.zeros(world_size, len(values), dtype=torch.float64)
    table[rank] = torch.tensor(values, dtype=torch.float64)
    return table


def _comm_row(rank: int, world_size: int) -> torch.Tensor:
    """This worker's bytes since ``stats.reset()`` (sent per phase, then received) in its row."""
    return _own_row(rank, world_size, [stats.sent.get(p, 0) for p in PHASES] +
                    [stats.received.get(p, 0) for p in PHASES])


def _time_row(rank: int, world_size: int, step_s: float, optimizer_s: float) -> torch.Tensor:
    """This worker's time ledger of a step of ``step_s`` seconds (TIME_LEDGER) in its row."""
    ledger = stats.time_ledger(step_s, optimizer_s)
    return _own_row(rank, world_size, [ledger[k] for k in TIME_LEDGER])


def _comm_record(table: torch.Tensor) -> dict[str, dict[str, list[int]]]:
    """The log's ``comm`` field from the gathered ``[world_size, 2 * len(PHASES)]`` table:
    bytes per rank, by direction and phase; idle optional phases left out."""
    out: dict[str, dict[str, list[int]]] = {}
    for d, direction in enumerate(("sent", "received")):
        out[direction] = {}
        for i, phase in enumerate(PHASES):
            column = [int(v) for v in table[:, d * len(PHASES) + i]]
            if phase in ALWAYS_LOGGED or any(column):
                out[direction][phase] = column
    return out


def _fmt(acc: float | None) -> str:
    return "   -  " if acc is None else f"{acc:.4f}"


def _epoch_line(rec: dict[str, Any]) -> str:
    return (
        f"epoch {rec['epoch']:>4}  loss {rec['loss']:.6f}  train {_fmt(rec['train_acc'])}  "
        f"val {_fmt(rec['val_acc'])}  test {_fmt(rec['test_acc'])}  {rec['epoch_s']:.2f}s"
    )


def _report(records: list[dict[str, Any]], probe: MemoryProbe, rank: int, world_size: int, start: int, floor: int,
            estimate: int) -> None:
    """Final accuracies and every worker's peak memory above its floor (the resident size
    after the imports) next to the plan's estimate of it, printed by rank 0."""
    mem = torch.zeros(world_size, 3, dtype=torch.float64)
    mem[rank] = torch.tensor([probe.peak_bytes - floor, estimate, probe.added_bytes], dtype=torch.float64) / 2**20
    mem = global_sum(mem)
    if rank != 0:
        return
    if records:
        r = records[-1]
        print(
            f"final (epoch {r['epoch']}): train_acc {_fmt(r['train_acc'])}  val_acc {_fmt(r['val_acc'])}  "
            f"test_acc {_fmt(r['test_acc'])}",
            flush=True,
        )
    else:
        print(f"nothing to train: the checkpoint is at epoch {start}, --epochs asks for no more", flush=True)
        return
    for r in range(world_size):
        print(f"worker {r}: peak {mem[r, 0]:.0f} MiB above the imports (plan's estimate {mem[r, 1]:.0f} MiB), "
              f"+{mem[r, 2]:.0f} MiB during training", flush=True)
    print(f"allocator: {_allocator_line()}", flush=True)
    for r in range(world_size):
        print(f"worker {r}: per epoch {_time_line(records, r)}", flush=True)
    if world_size > 1:  # one worker communicates nothing
        for r in range(world_size):
            print(f"worker {r}: per epoch {_traffic_line(records, r)}", flush=True)


def _allocator_line() -> str:
    """Which malloc the workers ran with, and how to run with tcmalloc when they did not."""
    name = active_allocator()
    if name != "glibc":
        return name
    if allocator_tuned():
        pages = "; tensors of 2 MiB or more on huge pages, for fewer page faults" if huge_pages_requested() else ""
        return (f"glibc's malloc; sc.init() fixed its mmap threshold at {MMAP_THRESHOLD >> 10} KiB, so freed "
                f"tensors go back to the OS{pages} (SARCOMPILE_MALLOC=off: glibc's own, faster on some graphs, "
                "see docs/benchmarks.md)")
    hint = "LD_PRELOAD=$(sarcompile allocator) before torchrun" if find_allocator() else \
        "install tcmalloc and LD_PRELOAD=$(sarcompile allocator)"
    return f"glibc's malloc (it keeps freed memory in heap holes; {hint} for less memory, see docs/benchmarks.md)"


def _time_line(records: list[dict[str, Any]], rank: int) -> str:
    """The median training step of ``rank`` and its time ledger's median parts (the first
    epoch, which warms caches and allocates the optimizer's state, left out when there are others)."""
    steady = records[1:] or records

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    step = median([sum(rec["time"][k][rank] for k in TIME_LEDGER) for rec in steady])  # the rank's own step
    parts = {k: median([rec["time"][k][rank] for rec in steady]) for k in TIME_LEDGER}
    share = lambda k: f" ({100 * parts[k] / step:.0f}%)" if step > 0 else ""
    return (f"step {step:.2f} s: compute {parts['compute']:.2f} s, waiting on the exchange "
            f"{parts['exchange_wait']:.2f} s{share('exchange_wait')}, all-reduce {parts['allreduce']:.2f} s"
            f"{share('allreduce')}, optimizer {parts['optimizer']:.2f} s")


def _traffic_line(records: list[dict[str, Any]], rank: int) -> str:
    """Mean bytes per epoch that ``rank`` sent and received, by phase, from the records."""
    short = {"forward": "fwd", "backward": "bwd", "allreduce": "allreduce"}
    halves = []
    for direction in ("sent", "received"):
        sizes = [
            f"{short[p]} {_size(sum(rec['comm'][direction][p][rank] for rec in records) / len(records))}"
            for p in ALWAYS_LOGGED
        ]
        halves.append(f"{direction} " + ", ".join(sizes))
    return "; ".join(halves)


def _size(nbytes: float) -> str:
    """``nbytes`` in a fixed-width binary unit: '  1.2 MiB', '512.0 B  '."""
    for unit in ("B  ", "KiB", "MiB"):
        if nbytes < 1024:
            return f"{nbytes:5.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:5.1f} GiB"


def _out_dir(cfg: TrainConfig) -> str:
    out = Path(cfg.out) if cfg.out else Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    return str(out)


# -- command line ---------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    d = TrainConfig(parts="")
    ap = argparse.ArgumentParser(
        prog="python -m sarcompile.train", description=__doc__.split("\n\n")[0],
        epilog="Run under torchrun for N workers (the partition must have N parts); "
        "see python -m sarcompile.train's module docstring for the log and checkpoint formats.",
    )
    ap.add_argument("--parts", required=True, help="partition directory (sarcompile partition --out)")
    ap.add_argument("--model", choices=MODELS, default=d.model)
    ap.add_argument("--layers", type=int, default=d.layers, help=f"graph layers (default {d.layers})")
    ap.add_argument("--hidden", type=int, default=d.hidden, help=f"hidden width (default {d.hidden})")
    ap.add_argument("--heads", type=int, default=d.heads, help=f"GAT attention heads (default {d.heads})")
    ap.add_argument("--epochs", type=int, default=d.epochs, help=f"(default {d.epochs})")
    ap.add_argument("--lr", type=float, default=d.lr, help=f"Adam learning rate (default {d.lr})")
    ap.add_argument("--weight-decay", type=float, default=d.weight_decay, help=f"(default {d.weight_decay})")
    ap.add_argument("--dropout", type=float, default=d.dropout,
                    help=f"node dropout between layers, and GAT attention dropout (default {d.dropout})")
    ap.add_argument("--batch-norm", action="store_true", help="distributed batch norm after each hidden layer")
    ap.add_argument("--residual", action="store_true", help="add each layer's input to its output where widths match")
    typed = ap.add_argument_group(
        "heterogeneous graphs", "--model rgcn or hgt on a typed partition (see sarcompile.hetero_models)"
    )
    typed.add_argument("--target", metavar="TYPE",
                       help="the node type to predict (default: the one type with labels y and the masks)")
    typed.add_argument("--embed-dim", type=int, metavar="D",
                       help="width of the learnable embedding of each node type without features "
                       "(default: the target's feature width)")
    ap.add_argument("--mode", choices=MODES, default=d.mode, help=f"sc.distribute mode (default {d.mode})")
    ap.add_argument("--blocks-in-flight", type=int, default=d.blocks_in_flight, metavar="K",
                    help="remote blocks each exchange posts ahead of the one it computes on, and gradient pushes "
                    f"kept in flight: 0 for the least memory, more for more overlap (default {d.blocks_in_flight})")
    ap.add_argument("--seed", type=int, default=d.seed, help=f"initial weights and dropout masks (default {d.seed})")
    ap.add_argument("--out", help="run directory for the log and checkpoint (default runs/<timestamp>)")
    # --log-file first: under torchrun, whose parser sees every argument, a bare --log is an
    # ambiguous abbreviation of its own --log-dir / --logs-specs and stops the launch.
    ap.add_argument("--log-file", "--log", dest="log",
                    help="JSONL log file (default OUT/log.jsonl); --log also works without torchrun")
    ap.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, metavar="K",
                    help=f"write OUT/checkpoint.pt every K epochs and at the end; 0: only at the end "
                    f"(default {d.checkpoint_every})")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    ap.add_argument("--stop-after", type=int, metavar="E",
                    help="stop right after epoch E's checkpoint, as if killed (for testing --resume)")
    ap.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    ap.add_argument("--allow-nonfinite", action="store_true",
                    help="train on node data with NaN or infinite values, and through a non-finite loss "
                    "(both refused by default)")
    comm = ap.add_argument_group(
        "communication reduction", "opt-in and approximate (exact SAR is the default); see sarcompile.runtime.link"
    )
    comm.add_argument("--staleness", type=int, default=d.staleness, metavar="K",
                      help="refresh remote rows every K training iterations, reuse them in between "
                      f"(DIGEST; default {d.staleness}: exact)")
    comm.add_argument("--bounded-staleness", type=int, default=d.bounded_staleness, metavar="S",
                      help="pipelined: use the rows exchanged during the previous iteration, exact every S")
    comm.add_argument("--compress", choices=COMPRESS, default=d.compress,
                      help="quantize every row that crosses workers, per row (Sylvie)")
    comm.add_argument("--no-error-feedback", dest="error_feedback", action="store_false",
                      help="with --compress: stochastic rounding (the published method) instead of carrying "
                      "the quantization error to the next send")
    comm.add_argument("--compress-layers", nargs="+", metavar="PATH", default=d.compress_layers,
                      help="apply the options above only to these layers (e.g. convs.0; default: all)")
    return ap


def parse_args(argv: Sequence[str] | None = None) -> TrainConfig:
    """The :class:`TrainConfig` of a command line (``sys.argv[1:]`` by default)."""
    return TrainConfig(**vars(_parser().parse_args(argv)))


def _as_config(config: Any) -> TrainConfig:
    if isinstance(config, TrainConfig):
        return dataclasses.replace(config)
    if isinstance(config, (list, tuple)):
        return parse_args([str(a) for a in config])
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    given = _as_mapping(config)
    unknown = sorted(set(given) - fields)
    if unknown:
        raise ValueError(f"unknown training options {unknown}; known: {sorted(fields)}")
    return TrainConfig(**given)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (1 with a one-line message on a known error).

    On several workers a failure is agreed (see :mod:`sarcompile.runtime.failure`): the
    failing worker prints its error and exits 1 first; every other one prints
    ``rank R failed: ...`` and exits 3 right after it; a worker that finds a peer gone or
    silent names it and exits 4; Ctrl-C exits 130. None waits for the timeout.
    """
    cfg = parse_args(argv)
    ok = False
    try:
        cfg.validate()
        train(cfg)
        ok = True
    except BaseException as e:  # noqa: BLE001 - every way out is agreed with the other workers
        if isinstance(e, SystemExit):
            raise
        rank = dist.get_rank() if dist.is_initialized() else 0
        return failure.report(e, rank=rank, distributed=_distributed())
    finally:
        if ok or failure.active() is None:  # (after a failure with a watchdog, report exited)
            shutdown()
    return 0


if __name__ == "__main__":  # importing this module must not run the trainer
    raise SystemExit(main())
