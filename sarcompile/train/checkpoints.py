"""Checkpoints written and read in agreement across workers: each worker writes its rows of
the node tables and rank 0 the rest (:mod:`sarcompile.data.checkpoint`), every rank learns
the outcome within ``SARCOMPILE_CHECKPOINT_TIMEOUT``, and a resume refuses other options or
another graph, naming the flags that restore them. :func:`save_checkpoint` and
:func:`load_checkpoint` are the same for a loop of one's own (``sc.save_checkpoint``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from torch import nn

from sarcompile.compile.distribute import DistributedModule
from sarcompile.data import checkpoint as files
from sarcompile.errors import CheckpointError, CommError
from sarcompile.dist.collectives import global_sum
from sarcompile.dist.process_group import timeout
from sarcompile.graph.tables import follow_rows, table_rows, table_type
from sarcompile.train.config import (
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


def _gather(obj: Any, what: str, group: Any = None, limit_s: float | None = None) -> list[Any]:
    """Every rank's ``obj``, on every rank (meeting in ``group``, whose waits are bounded)."""
    if not _distributed():
        return [obj]
    out = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(out, obj, group=group)
    except RuntimeError as e:  # gloo reports timeouts and closed peers as RuntimeError
        raise CommError(
            f"{what}: a peer worker did not answer within {limit_s or timeout():.0f}s or went away ({e}). "
            f"Check the other workers' logs; raise {CHECKPOINT_TIMEOUT_ENV} if the disk is just slow."
        ) from None
    return out


def _agreed(what: str, step, group: Any = None, limit_s: float | None = None) -> Any:
    """``step()``'s result on this rank, once every rank ran its own: where any failed, the
    first failure's one-line message is raised on every rank (a :class:`CheckpointError`)."""
    result, error = None, None
    try:
        result = step()
    # Whatever failed, the other ranks must hear of it rather than wait.
    except Exception as e:  # noqa: BLE001
        error = str(e) if isinstance(e, CheckpointError) else f"{what} failed ({type(e).__name__}: {e})"
    failed = [e for e in _gather(error, what, group, limit_s) if e is not None]
    if failed:
        raise CheckpointError(failed[0])
    return result


def _split_state(net: nn.Module, optimizer: torch.optim.Optimizer | None):
    """``(model state, optimizer state, this worker's table rows, the manifest's tables)``:
    the state dicts without the sharded node tables, and without their optimizer's per-row
    state (tensors of the local table's shape: Adam's moments), which go to the rows."""
    weights = net.state_dict()
    opt_state = optimizer.state_dict() if optimizer is not None else None
    order = [p for group in optimizer.param_groups for p in group["params"]] if optimizer is not None else []
    index = {id(p): i for i, p in enumerate(order)}
    rows, tables = {}, {}
    for path, p in net.named_parameters():
        held = table_rows(p)
        if held is None:
            continue
        ids, total = held
        del weights[path]
        tensors = {"param": p.detach()}
        i = index.get(id(p))
        if i is not None:
            packed = opt_state["state"].get(i, {})
            keys = sorted(k for k, v in packed.items() if files._per_row(v, p.shape))
            tensors |= {k: packed[k] for k in keys}
            opt_state["state"][i] = {k: v for k, v in packed.items() if k not in keys}
        rows[path] = files.TableRows(ids, tensors)
        tables[path] = {"type": table_type(p), "shape": [total, *p.shape[1:]], "optimizer": i,
                        "dtypes": {k: str(t.dtype) for k, t in tensors.items()}}
    return weights, opt_state, rows, tables


def write_sharded(final: Path, rank: int, replicated: dict[str, Any], rows: dict[str, files.TableRows],
                  manifest: dict[str, Any], links: Any = None, group: Any = None,
                  limit_s: float | None = None) -> None:
    """Write the checkpoint directory ``final``, every rank its ``rows`` (and ``links``, a
    worker's own state), rank 0 ``replicated`` and, once every rank's files are fsync'ed,
    the manifest (``manifest`` and the files' sha256); then rename it into place. Any
    failure is raised on every rank, the previous checkpoints untouched."""
    temp = files.temp_dir(final)
    what = f"writing checkpoint '{final}'"

    def prepare() -> None:
        if rank == 0:
            shutil.rmtree(temp, ignore_errors=True)  # a killed run's (we hold the run's lock)
            temp.mkdir(parents=True)

    def write() -> dict[str, Any]:
        written = files.write_rank_files(temp, rank, rows, links)
        return {**written, **files.write_replicated(temp, replicated)} if rank == 0 else written

    def finish() -> None:
        if rank == 0:
            files.write_manifest(temp, {**manifest, "files": {k: v for part in written for k, v in part.items()}})
            files.publish(temp, final)

    try:
        _agreed(what, prepare, group, limit_s)
        written = _gather(_agreed(what, write, group, limit_s), what, group, limit_s)
        _agreed(what, finish, group, limit_s)
    except CheckpointError as e:
        if rank == 0:
            shutil.rmtree(temp, ignore_errors=True)
        raise CheckpointError(f"{e}; the previous checkpoint is intact") from None


def _copied(obj: Any) -> Any:
    """``obj`` with every tensor in it cloned (dicts, lists and tuples rebuilt): a snapshot
    that later in-place updates (the optimizer's step) do not reach."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _copied(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_copied(v) for v in obj)
    return obj


class BackgroundWriter:
    """The trainer's checkpoints, written while training goes on.

    :meth:`start` copies a checkpoint's tensors (this worker's sorted rows of the node
    tables, its links' state, and on rank 0 the replicated state) and hands them to a
    thread that writes them with :func:`write_sharded` over the checkpoint process group
    (never the training group), then runs ``after`` (pruning older checkpoints). At most
    one write is in flight: :meth:`start` first waits for the previous one, so the copy's
    memory is bounded by one checkpoint. A write's failure is raised by the main thread
    from :meth:`wait`, the same :class:`CheckpointError` on every rank (the thread's steps
    are agreed), the previous checkpoint untouched. :meth:`finished` is this worker's half
    of deciding, without waiting, that every worker's write is done: summed over the
    workers (the trainer adds it to each epoch's all-reduce), it reaches the world size at
    the same epoch on every rank, which then calls :meth:`wait` and returns at once.

    ``saved`` is the epoch of the latest complete checkpoint (None: none yet); ``copy_s``
    and ``wait_s`` the seconds the training loop spent copying and waiting for the disk.
    """

    def __init__(self, rank: int, group: Any, limit_s: float, saved: int | None) -> None:
        self.rank, self.group, self.limit_s, self.saved = rank, group, limit_s, saved
        self.copy_s = self.wait_s = 0.0
        self._thread: threading.Thread | None = None
        self._epoch: int | None = None
        self._error: BaseException | None = None

    @property
    def in_flight(self) -> bool:
        """Whether a write was started and not yet waited for."""
        return self._thread is not None

    def finished(self) -> float:
        """1.0 where this worker's write in flight has ended (or none is in flight), else 0.0."""
        return 0.0 if self._thread is not None and self._thread.is_alive() else 1.0

    def start(self, epoch: int, final: Path, replicated: dict[str, Any], rows: dict[str, files.TableRows],
              manifest: dict[str, Any], links: Any = None, after: Callable[[], None] | None = None) -> None:
        """Copy the checkpoint of ``epoch`` (see :func:`write_sharded` for the arguments) and
        start writing it; the previous write is waited for first (its failure raised)."""
        self.wait()
        began = time.perf_counter()
        copy = (_copied(replicated) if self.rank == 0 else None,
                {name: files.sorted_rows(table) for name, table in rows.items()}, _copied(links))
        self.copy_s += time.perf_counter() - began
        self._epoch = epoch
        self._thread = threading.Thread(target=self._write, args=(final, *copy, manifest, after),
                                        name=f"sarcompile-checkpoint-{epoch}", daemon=True)
        self._thread.start()

    def _write(self, final: Path, replicated, rows, links, manifest: dict[str, Any],
               after: Callable[[], None] | None) -> None:
        try:
            write_sharded(final, self.rank, replicated, rows, manifest, links, self.group, self.limit_s)
            if after is not None:
                after()
        except BaseException as e:  # noqa: BLE001 (raised again by the main thread, in wait)
            self._error = e

    def wait(self) -> None:
        """Wait for the write in flight (none: return); raise its failure, else record its
        epoch as ``saved``. Every wait inside the write is bounded (the checkpoint group's
        timeout), so this returns."""
        if self._thread is None:
            return
        began = time.perf_counter()
        self._thread.join()
        self.wait_s += time.perf_counter() - began
        error, self._thread, self._error = self._error, None, None
        if error is not None:
            raise error
        self.saved = self._epoch

    def close(self) -> None:
        """Wait for the write in flight, its failure dropped: the run is ending on another
        error, and a complete checkpoint is still worth having."""
        with contextlib.suppress(Exception):
            self.wait()


def read_sharded(path: Path, rank: int, world_size: int, group: Any = None,
                 limit_s: float | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(replicated state, manifest)`` of the checkpoint ``path`` (``(state, None)`` for an
    older version's single file), every file checked: the node tables' files shared out
    among the ranks, ``replicated.pt`` by each. A failure is raised on every rank."""
    what = f"reading checkpoint '{path}'"

    def read() -> tuple[dict[str, Any], dict[str, Any] | None]:
        if not path.is_dir():
            return files.load_checkpoint(path), None
        manifest = files.read_manifest(path)
        shards = sorted(n for n in manifest["files"] if n.endswith(".npy"))
        files.verify_files(path, manifest, shards[rank::world_size])
        return files.read_replicated(path, manifest), manifest

    return _agreed(what, read, group, limit_s)


def load_sharded(path: Path, manifest: dict[str, Any], state: dict[str, Any], net: nn.Module,
                 optimizer: torch.optim.Optimizer | None) -> None:
    """Load a sharded checkpoint's ``state`` (its ``replicated.pt``) and node tables into
    ``net`` and ``optimizer``. A table sharded already gets the rows it holds, read alone;
    a whole one gets every row, and its optimizer's per-row state follows it when it is
    sharded (:func:`sarcompile.graph.tables.follow_rows`)."""
    missing, unexpected = net.load_state_dict(state["model"], strict=False)
    if set(missing) != set(manifest["tables"]) or unexpected:
        raise CheckpointError(
            f"checkpoint '{path}' does not fit this model: "
            + "; ".join(f"{what} {sorted(keys)}" for what, keys in (
                ("its node tables", set(manifest["tables"])), ("the model lacks", set(unexpected)),
                ("the checkpoint lacks", set(missing) - set(manifest["tables"]))) if keys)
        )
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    for name, entry in manifest["tables"].items():
        p = net.get_parameter(name)
        held = table_rows(p)
        ids = held[0] if held is not None else torch.arange(entry["shape"][0])
        with torch.no_grad():
            p.copy_(files.read_rows(path, manifest, name, "param", ids))
        if optimizer is None or entry["optimizer"] is None:
            continue
        per_row = optimizer.state[p]
        per_row.update({k: files.read_rows(path, manifest, name, k, ids).to(p.device)
                        for k in entry["dtypes"] if k != "param"})
        if held is None:
            keys = [k for k in entry["dtypes"] if k != "param"]
            follow_rows(p, lambda kept, s=per_row, keys=keys: s.update({k: s[k][kept.to(s[k].device)] for k in keys}))


def check_trainer_state(state: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint ``path`` whose (replicated) ``state`` the trainer did not write."""
    if state.get("format") != FORMAT or not {"model", "optimizer", "epoch", "config"} <= state.keys():
        raise CheckpointError(f"checkpoint '{path}' was not written by this version of sarcompile.train")


# -- a loop of one's own -------------------------------------------------------------------------
USER_FORMAT = "sarcompile-user-checkpoint"


def save_checkpoint(directory: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    extra: Any = None) -> None:
    """Write a checkpoint of ``model`` (compiled with :func:`sarcompile.distribute`, or a
    plain module) and ``optimizer`` into ``directory``, on every worker (a collective):
    each worker writes its rows of the node tables, rank 0 the rest (parameters, buffers,
    the optimizer's state, the dropout masks' and torch's RNG state, and ``extra``:
    tensors, numbers, strings, lists and dicts). The directory appears whole or not at all;
    one of the same name is replaced. :func:`load_checkpoint` resumes it on any number of
    workers.

    >>> import tempfile, torch, sarcompile as sc
    >>> net = torch.nn.Linear(2, 2); opt = torch.optim.Adam(net.parameters())
    >>> sc.save_checkpoint(tempfile.mkdtemp() + "/ckpt", net, opt, extra={"epoch": 3})
    """
    net, masks = _unwrapped(model)
    weights, opt_state, rows, tables = _split_state(net, optimizer)
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if _distributed() else (0, 1)
    replicated = {"format": USER_FORMAT, "model": weights, "optimizer": opt_state, "extra": extra,
                  "rng": {"torch": torch.get_rng_state(), "masks": masks}}
    manifest = {"world_size": world_size, "tables": tables}
    limit = checkpoint_timeout()
    group = _checkpoint_group(limit)
    try:
        write_sharded(Path(directory), rank, replicated, rows, manifest, group=group, limit_s=limit)
    finally:
        if group is not None:
            dist.destroy_process_group(group)


def load_checkpoint(directory: str | os.PathLike, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None) -> Any:
    """Load the checkpoint :func:`save_checkpoint` wrote into ``model`` (and ``optimizer``,
    its state included), on every worker, whatever number of workers wrote it; returns its
    ``extra``. Torch's RNG and the dropout masks continue where they were. A worker whose
    node tables are sharded already (the compiled model was called once) reads only its
    own rows; before the first call every row is read, and the first call keeps the
    worker's. Every file is checked: a missing or damaged one is refused on every worker,
    named, with a :class:`~sarcompile.CheckpointError`.

    >>> import tempfile, torch, sarcompile as sc
    >>> path = tempfile.mkdtemp() + "/ckpt"
    >>> sc.save_checkpoint(path, torch.nn.Linear(2, 2), extra={"epoch": 3})
    >>> sc.load_checkpoint(path, torch.nn.Linear(2, 2))
    {'epoch': 3}
    """
    net, _ = _unwrapped(model)
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if _distributed() else (0, 1)
    limit = checkpoint_timeout()
    group = _checkpoint_group(limit)
    path = Path(directory)
    try:
        state, manifest = read_sharded(path, rank, world_size, group, limit)
        if manifest is None or state.get("format") != USER_FORMAT:
            raise CheckpointError(f"'{path}' is not a checkpoint written by sarcompile.save_checkpoint")
        _agreed(f"loading checkpoint '{path}'", lambda: load_sharded(path, manifest, state, net, optimizer),
                group, limit)
    finally:
        if group is not None:
            dist.destroy_process_group(group)
    torch.set_rng_state(state["rng"]["torch"])
    if state["rng"]["masks"] is not None:
        model.load_mask_state(state["rng"]["masks"])
    return state["extra"]


def _unwrapped(model: nn.Module) -> tuple[nn.Module, dict[str, Any] | None]:
    """The module whose parameters a checkpoint names (a compiled model's original, whose
    ``state_dict`` keys are the user's), and its dropout masks' state (None for a plain module)."""
    if isinstance(model, DistributedModule):
        return model.original, model.mask_state()
    return model, None


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
