"""What a training run is given: :class:`TrainConfig` (one field per flag of ``python -m
sarcompile.train``), the flags themselves, and the constants that name the models, modes, node
data keys and the options a resume must keep.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sarcompile.train.typed_models import TYPED_MODELS
from sarcompile.ir.vocab import Compression, Mode
from sarcompile.train.factory import factory_kwargs, is_factory_spec, recorded_spec

ONE_TYPE_MODELS = ("sage", "gcn", "gin", "gat")


MODELS = ONE_TYPE_MODELS + TYPED_MODELS


MODES = Mode.values()


# What the trainer predicts: one class per node (cross-entropy, accuracy), several binary
# labels per node (binary cross-entropy, ROC-AUC as ogbn-proteins), or values (mean squared
# error, RMSE). Each task's metric names its log fields: train_acc, train_rocauc, train_rmse.
TASKS = {"classification": "acc", "multilabel": "rocauc", "regression": "rmse"}


# The built-in models' options: a model of one's own (--model MODULE:FACTORY) takes its
# options in --model-args instead.
BUILT_IN_OPTIONS = ("layers", "hidden", "heads", "dropout", "batch_norm", "residual", "embed_dim")


NODE_KEYS = ("x", "y", "train_mask", "val_mask", "test_mask")


MASKS = ("train_mask", "val_mask", "test_mask")


# What build_model needs: saved in every checkpoint's "config".
MODEL_KEYS = ("model", "in_dim", "num_classes", "layers", "hidden", "heads", "dropout", "batch_norm", "residual")


# ... and what a model of one's own needs besides (its factory is "model"), with the task it
# was trained for (which the output is read as).
OWN_MODEL_KEYS = ("model_args", "task")


# ... and what a typed model (rgcn, hgt) needs besides: the target type, the embedding width
# and the graph's types, relations and feature widths (None for a one-type model).
TYPED_KEYS = ("target", "embed_dim", "node_counts", "edge_types", "in_dims")


DERIVED_KEYS = ("in_dim", "num_classes", "node_counts", "edge_types", "in_dims")  # from the data, not flags


# Options that change the numbers: a checkpoint resumes only with the same values.
# (--mode, --epochs, --parts, --out, --log, --checkpoint-every may change between runs.)
# The communication reduction options and OWN_MODEL_KEYS are among them; checkpoints older
# than these options lack them and count as written with the defaults (exact, a built-in model).
COMM_KEYS = ("staleness", "bounded_staleness", "compress", "error_feedback", "compress_layers")


RESUME_KEYS = MODEL_KEYS + OWN_MODEL_KEYS + TYPED_KEYS + ("lr", "weight_decay", "seed") + COMM_KEYS


COMPRESS = Compression.values()


# Phases of sarcompile.dist.traffic.stats gathered per epoch, in this order; the first
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
    model_args: dict[str, Any] | None = None
    task: str = "classification"
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
    keep_checkpoints: int = 2
    resume: bool | str = False  # "auto": resume if OUT holds a checkpoint; True (a bare --resume): must resume
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
        if isinstance(self.model_args, str):  # the flag's JSON
            self.model_args = factory_kwargs(self.model_args, "--model-args")
        if isinstance(self.model, str) and is_factory_spec(self.model):
            self.model = recorded_spec(self.model)

    @property
    def own_model(self) -> bool:
        """Whether the model is the user's own (``--model MODULE:FACTORY``)."""
        return is_factory_spec(self.model)

    def validate(self) -> None:
        """Raise a :class:`ValueError` naming the first option out of range."""
        if self.model not in MODELS and not self.own_model:
            raise ValueError(f"--model must be one of {', '.join(MODELS)} or MODULE:FACTORY (a model of your own: "
                             f"my_model.py:build), got {self.model!r}")
        if self.task not in TASKS:
            raise ValueError(f"--task must be one of {', '.join(TASKS)}, got {self.task!r}")
        self._validate_own_model()
        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("layers", "hidden", "heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.blocks_in_flight < 0:
            raise ValueError(f"--blocks-in-flight must be >= 0 (0: no overlap), got {self.blocks_in_flight}")
        if self.epochs < 0 or self.checkpoint_every < 0:
            raise ValueError("--epochs and --checkpoint-every must be >= 0")
        if self.keep_checkpoints < 1:
            raise ValueError(f"--keep-checkpoints must be >= 1, got {self.keep_checkpoints}")
        if self.stop_after is not None and self.stop_after < 1:
            raise ValueError(f"--stop-after must be an epoch >= 1, got {self.stop_after}")
        if self.resume not in (False, True, "auto"):
            raise ValueError(f"--resume takes 'auto' or nothing, got {self.resume!r}")
        for name in ("lr", "weight_decay"):
            if not getattr(self, name) >= 0:  # (nan too)
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout must be in [0, 1), got {self.dropout}")
        if self.model == "gat" and self.layers > 1 and self.hidden % self.heads:
            raise ValueError(
                f"--hidden {self.hidden} is not a multiple of --heads {self.heads}: GAT's hidden layers "
                "concatenate the heads, each hidden/heads wide"
            )
        self._validate_typed()
        self._validate_comm()

    def _validate_own_model(self) -> None:
        """A model of one's own takes its options in --model-args; the built-in models take
        flags, and train single-label classification only."""
        defaults = TrainConfig(parts="")
        if self.own_model:
            given = [k for k in BUILT_IN_OPTIONS if getattr(self, k) != getattr(defaults, k)]
            if given:
                flags = ", ".join("--" + k.replace("_", "-") for k in given)
                raise ValueError(f"{flags}: options of the built-in models; a model of your own ({self.model}) takes "
                                 f"its options in --model-args '{{\"name\": value, ...}}', passed to its factory")
            if self.model_args is not None and not isinstance(self.model_args, dict):
                raise ValueError(f"--model-args must be a JSON object of keyword arguments, got {self.model_args!r}")
            return
        if self.model_args is not None:
            raise ValueError(f"--model-args is for a model of your own (--model MODULE:FACTORY); --model {self.model} "
                             "takes flags (--layers, --hidden, ...)")
        if self.task != "classification":
            raise ValueError(f"--task {self.task}: the built-in models ({', '.join(MODELS)}) predict one class per "
                             "node; bring a model of your own (--model MODULE:FACTORY) for other tasks")

    def _validate_typed(self) -> None:
        """The options that belong to one kind of model only."""
        if self.own_model:
            return
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


def _out_dir(cfg: TrainConfig) -> str:
    out = Path(cfg.out) if cfg.out else Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    return str(out)


def _parser() -> argparse.ArgumentParser:
    d = TrainConfig(parts="")
    ap = argparse.ArgumentParser(
        prog="python -m sarcompile.train",
        description="Train a GNN full-batch on a partitioned graph (sarcompile partition), in one process or on "
        "N torchrun workers, with the same loss as on one machine; a JSONL log, checkpoints and --resume.",
        epilog="Run under torchrun for N workers (the partition must have N parts); docs/training.md has the "
        "log and checkpoint formats.",
    )
    ap.add_argument("--parts", required=True, help="partition directory (sarcompile partition --out)")
    ap.add_argument("--model", default=d.model, metavar="NAME|MODULE:FACTORY",
                    help=f"a built-in model ({', '.join(MODELS)}; default {d.model}) or one of your own: FACTORY in "
                    "MODULE (a dotted module or a .py file) returns it, called with in_features, num_classes (and on "
                    "a typed partition metadata and num_nodes) and the items of --model-args")
    ap.add_argument("--model-args", metavar="JSON",
                    help="keyword arguments for the factory of --model MODULE:FACTORY, as a JSON object")
    ap.add_argument("--task", choices=list(TASKS), default=d.task,
                    help="classification (cross-entropy, accuracy; default), multilabel (binary cross-entropy per "
                    "label, ROC-AUC) or regression (mean squared error, RMSE); multilabel and regression need a "
                    "model of your own")
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
        "heterogeneous graphs", "--model rgcn or hgt on a typed partition (see sarcompile.train.typed_models)"
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
                    help=f"write a checkpoint (OUT/checkpoints/epoch-NNNNNN) every K epochs and at the end; "
                    f"0: only at the end (default {d.checkpoint_every})")
    ap.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints, metavar="K",
                    help=f"keep the latest K checkpoints, delete older ones once a new one is complete "
                    f"(default {d.keep_checkpoints})")
    ap.add_argument("--resume", nargs="?", const=True, default=d.resume, choices=["auto"],
                    help="--resume auto: continue from OUT's latest complete checkpoint if there is one, else start "
                    "afresh (what torchrun --max-restarts needs: restarted workers continue by themselves); a bare "
                    "--resume: continue from it, and stop if there is none")
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


def _as_mapping(config: Any) -> dict[str, Any]:
    if isinstance(config, TrainConfig):
        return dataclasses.asdict(config)
    if isinstance(config, argparse.Namespace):
        return vars(config)
    if isinstance(config, Mapping):
        return dict(config)
    raise TypeError(f"expected a config dict, TrainConfig or argparse.Namespace, got {type(config).__name__}")


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
