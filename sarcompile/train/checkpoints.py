"""Checkpoints written and read in agreement across workers: rank 0 writes, every rank learns
the outcome within ``SARCOMPILE_CHECKPOINT_TIMEOUT``, and a resume refuses other options or
another graph, naming the flags that restore them.
"""

from __future__ import annotations

import dataclasses
import math
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..data.checkpoint import load_checkpoint, save_checkpoint
from ..errors import CheckpointError, CommError
from ..runtime.comm import global_sum, timeout
from .config import (
    CHECKPOINT_TIMEOUT_ENV,
    CHECKPOINT_TIMEOUT_FACTOR,
    COMM_KEYS,
    DERIVED_KEYS,
    OWN_MODEL_KEYS,
    FORMAT,
    NEGATED,
    RESUME_KEYS,
    TrainConfig,
)


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
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.name in COMM_KEYS + OWN_MODEL_KEYS}
    saved = {**defaults, **state["config"]}  # a checkpoint older than these keys: exact, a built-in model
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
