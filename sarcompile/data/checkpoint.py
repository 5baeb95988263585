"""Training checkpoints: one self-checking file, replaced atomically.

A checkpoint file is a short text header followed by a ``torch.save`` payload::

    SARCOMPILE-CHECKPOINT 1
    {"bytes": 18342, "sha256": "9f2c...", "epoch": 10}
    <payload: torch.save(state)>

The header records the payload's length and sha256, so a file cut short (a full disk, a
copy that stopped) or changed afterwards (a flipped byte) is refused with a
:class:`~sarcompile.errors.CheckpointError` that says which, instead of loading garbage
or failing deep inside unpickling. The file is written to a temporary name in the same
directory, fsync'ed and renamed over the old one (``os.replace``), so at every moment the
path holds either the previous complete checkpoint or the new complete one::

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "checkpoint.pt"
    >>> save_checkpoint(path, {"epoch": 3, "w": torch.ones(2)})
    >>> load_checkpoint(path)["epoch"]
    3
    >>> _ = path.write_bytes(path.read_bytes()[:-5])
    >>> load_checkpoint(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sarcompile.errors.CheckpointError: checkpoint ... is truncated: ...

The payload is read with ``torch.load(weights_only=True)``: tensors, numbers, strings,
lists and dicts only, never arbitrary pickled objects.

Node tables (:mod:`sarcompile.tables`: the embeddings of featureless node types) live
row-sharded on the workers. A checkpoint holds them whole, in global row order, so that it
loads into the one-machine model and into a run on any number of workers:
:func:`global_state` gathers every worker's rows of each table, and of its per-row
optimizer state (Adam's moments), into rank 0's state dicts; :func:`shard_state` gives each
worker its own rows of a model and optimizer loaded whole.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..errors import CheckpointError
from .partitioning import _atomic_write
from ..tables import find_node_tables, shard_rows, shard_tables, table_type

__all__ = ["CHECKPOINTS", "CHECKPOINT_NAME", "checkpoint_dir", "complete_checkpoints", "latest_checkpoint", "MAGIC", "global_state", "load_checkpoint", "read_header", "recorded_header",
           "save_checkpoint", "shard_state"]

CHECKPOINT_NAME = "checkpoint.pt"
MAGIC = b"SARCOMPILE-CHECKPOINT 1\n"
_MAX_HEADER = 4096


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically with its length and checksum in the header.

    The payload is serialised in memory first, so a state that cannot be saved raises
    before the file system is touched; a failure while writing leaves the old file as it
    was (and no temporary file behind).
    """
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    header = {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    if isinstance(state.get("epoch"), int):
        header["epoch"] = state["epoch"]
    head = MAGIC + json.dumps(header).encode() + b"\n"

    def write(f) -> None:
        f.write(head)
        f.write(payload)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, write)


def read_header(path: str | os.PathLike) -> tuple[dict[str, Any], bytes]:
    """The header (as a dict) and the payload bytes of a checkpoint, after checking that
    the payload has the recorded length and sha256; a :class:`CheckpointError` otherwise."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at '{path}': nothing to resume (run without --resume to start afresh)")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint '{path}' ({e})") from None
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + _MAX_HEADER)
    # Cut inside the header: a prefix of the magic line, or no header end before the file's end.
    cut_in_header = MAGIC.startswith(data) or (end < 0 and len(data) < len(MAGIC) + _MAX_HEADER)
    if data and data[: len(MAGIC)] == MAGIC[: len(data)] and cut_in_header:
        raise CheckpointError(
            f"checkpoint '{path}' is truncated: it ends inside its header, after {len(data)} bytes; "
            "restore a good copy or start the run again without --resume"
        )
    if not data.startswith(MAGIC):
        what = "is empty" if not data else "does not start with a sarcompile checkpoint header"
        raise CheckpointError(
            f"checkpoint '{path}' {what}: not a checkpoint written by sarcompile.train, or damaged; "
            "restore a good copy or start the run again without --resume"
        )
    try:
        if end < 0:
            raise ValueError("no end of header line")
        header = json.loads(data[len(MAGIC) : end])
        size, digest = int(header["bytes"]), str(header["sha256"])
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"checkpoint '{path}' has a corrupt header ({e}): restore a good copy or start the run again "
            "without --resume"
        ) from None
    payload = data[end + 1 :]
    if len(payload) < size:
        raise CheckpointError(
            f"checkpoint '{path}' is truncated: {len(payload)} of {size} payload bytes (the file was cut short "
            "after it was written, e.g. by a full disk or an interrupted copy); restore a good copy or start "
            "the run again without --resume"
        )
    if len(payload) > size or hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError(
            f"checkpoint '{path}' is corrupt: its contents do not match the sha256 recorded when it was "
            "written; restore a good copy or start the run again without --resume"
        )
    return header, payload


def recorded_header(path: str | os.PathLike) -> dict[str, Any]:
    """The header of a checkpoint (its payload's ``bytes`` and ``sha256``, and ``epoch``),
    read without the payload; ``{}`` where there is none. It identifies the checkpoint's
    contents; :func:`read_header` is what checks them against it."""
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + _MAX_HEADER)
    end = head.find(b"\n", len(MAGIC))
    if not head.startswith(MAGIC) or end < 0:
        return {}
    try:
        header = json.loads(head[len(MAGIC) : end])
    except ValueError:
        return {}
    return header if isinstance(header, dict) else {}


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The state saved by :func:`save_checkpoint`, checked against its header first."""
    _, payload = read_header(path)
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (unpickling raises many types; each means the same here)
        raise CheckpointError(f"cannot unpickle checkpoint '{path}' ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint '{path}' holds a {type(state).__name__}, not a dict of state")
    return state


# -- node tables ---------------------------------------------------------------------------------
def shard_state(model: nn.Module, optimizer: torch.optim.Optimizer, graph: Any) -> None:
    """Keep only this worker's rows of every node table of ``model``, and of the
    optimizer's per-row state of each (tensors of the table's shape: Adam's moments),
    loaded whole before (fresh, or from a checkpoint). ``graph`` is the worker's typed
    shard (``part.graph``): its ``global_ids`` name the rows. Parameter objects stay the
    same; a table already sharded is left as it is."""
    tables = find_node_tables(model, graph.num_global_nodes)
    whole = [p for path, p in model.named_parameters() if path in tables and table_type(p) is None]
    shard_tables(model, tables, graph.global_ids, graph.num_global_nodes)
    shard_optimizer_rows(whole, optimizer, graph)


def shard_optimizer_rows(tables: list[nn.Parameter], optimizer: torch.optim.Optimizer, graph: Any) -> None:
    """Keep only this worker's rows of the optimizer's per-row state (Adam's moments) of
    each node table in ``tables``, sharded since that state was loaded whole (from a
    checkpoint, in global row order). ``graph`` is the worker's shard (``part.graph``, typed
    or one-type)."""
    global_ids, totals = shard_rows(graph)
    for p in tables:
        ntype = table_type(p)
        state = optimizer.state.get(p, {})
        for key, value in state.items():
            if _per_row(value, (totals[ntype], *p.shape[1:])):
                state[key] = value[global_ids[ntype].to(value.device)].clone()


def global_state(model: nn.Module, optimizer: torch.optim.Optimizer,
                 graph: Any) -> tuple[dict, dict] | tuple[None, None]:
    """``(model.state_dict(), optimizer.state_dict())`` with every sharded node table, and
    its per-row optimizer state, gathered from all workers into global row order: on rank
    0; ``(None, None)`` on the others. Every worker must call it (collective, in the
    parameters' order). The live optimizer state is not changed."""
    weights, opt_state = model.state_dict(), optimizer.state_dict()
    order = [p for group in optimizer.param_groups for p in group["params"]]
    index = {id(p): i for i, p in enumerate(order)}
    for path, p in model.named_parameters():
        ntype = table_type(p)
        if ntype is None:
            continue
        packed = opt_state["state"].get(index.get(id(p)), {})
        keys = sorted(k for k, v in packed.items() if _per_row(v, p.shape))
        global_ids, totals = shard_rows(graph)
        rows = _gather_rows([p.detach(), *(packed[k] for k in keys)], global_ids[ntype], totals[ntype])
        if rows is not None:
            weights[path] = rows[0]
            # a new dict: state_dict() hands out the optimizer's own per-parameter dicts
            opt_state["state"][index[id(p)]] = {**packed, **dict(zip(keys, rows[1:]))}
    if dist.is_initialized() and dist.get_rank() != 0:
        return None, None
    return weights, opt_state


def _per_row(value: Any, shape: tuple[int, ...]) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == shape


def _gather_rows(tensors: list[torch.Tensor], ids: torch.Tensor, total: int) -> list[torch.Tensor] | None:
    """Rank 0: each of ``tensors`` (this worker's rows, named by ``ids``) with every worker's
    rows put at their global ids, ``total`` rows; None on the other ranks."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        parts = [[t.cpu() for t in tensors] + [ids.cpu()]]
    else:
        # gloo gathers tensors of one shape only: each worker pads its rows to the longest
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size())]
        dist.all_gather(sizes, torch.tensor([ids.numel()]))
        most = int(max(sizes))
        parts = [[] for _ in sizes] if dist.get_rank() == 0 else None
        for t in [*tensors, ids]:
            padded = t.new_zeros((most, *t.shape[1:]), device="cpu")
            padded[: t.shape[0]] = t.cpu()
            received = [torch.empty_like(padded) for _ in sizes] if parts is not None else None
            dist.gather(padded, received, dst=0)
            if parts is not None:
                for r, (part, n) in enumerate(zip(received, sizes)):
                    parts[r].append(part[: int(n)])
    if parts is None:
        return None
    out = [t.new_empty((total, *t.shape[1:]), device="cpu") for t in tensors]
    for part in parts:
        for whole, rows in zip(out, part[:-1]):
            whole[part[-1]] = rows
    return out


# -- sharded checkpoints -------------------------------------------------------------------------
CHECKPOINTS = "checkpoints"  # a run directory's sharded checkpoints: OUT/checkpoints/epoch-000003/
MANIFEST = "manifest.json"
REPLICATED = "replicated.pt"
SHARDED_FORMAT = "sarcompile-sharded-checkpoint"
SHARDED_VERSION = 2  # (1: the single file)
_EPOCH_DIR = re.compile(r"epoch-(\d+)")
_TEMP = ".tmp-"  # a directory being written: .tmp-epoch-000003
_OLD = ".old-"  # a complete directory being replaced by one of the same name
_CHUNK_BYTES = 32 << 20  # rows read at a time: a reader holds its rows plus one chunk
# torch dtypes numpy has not, written as the integers of their width (the manifest names the dtype)
_AS_INTEGERS = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


def checkpoint_dir(out_dir: str | os.PathLike, epoch: int) -> Path:
    """Where the trainer writes the checkpoint of ``epoch`` in run directory ``out_dir``."""
    return Path(out_dir) / CHECKPOINTS / f"epoch-{epoch:06d}"


def temp_dir(final: Path) -> Path:
    """Where the checkpoint directory ``final`` is written before :func:`publish`."""
    return final.parent / f"{_TEMP}{final.name}"


def complete_checkpoints(out_dir: str | os.PathLike) -> list[Path]:
    """The complete sharded checkpoints of run directory ``out_dir``, oldest first: the
    ``checkpoints/epoch-*`` directories with a manifest (renamed into place whole)."""
    root = Path(out_dir) / CHECKPOINTS
    found = []
    if root.is_dir():
        for d in root.iterdir():
            m = _EPOCH_DIR.fullmatch(d.name)
            if m and (d / MANIFEST).is_file():
                found.append((int(m.group(1)), d))
    return [d for _, d in sorted(found)]


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The latest complete checkpoint of run directory ``out_dir``: the sharded checkpoint
    directory of the highest epoch, or an older version's single file ``checkpoint.pt``
    where there is no directory of a later epoch; None where there is neither. Reads no
    tensor: the files are checked when the checkpoint is read."""
    dirs = complete_checkpoints(out_dir)
    old = Path(out_dir) / CHECKPOINT_NAME
    if old.is_file() and (not dirs or recorded_header(old).get("epoch", -1) > int(dirs[-1].name.split("-")[1])):
        return old
    return dirs[-1] if dirs else None
