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

Node tables (:mod:`sarcompile.graph.tables`: the embeddings of featureless node types) live
row-sharded on the workers. Such a file holds them whole, in global row order:
:func:`shard_state` gives each worker its own rows of a model and optimizer loaded whole. That single file is the format
of older versions: it still loads (:func:`latest_checkpoint` finds it, and the trainer and
``load_trained`` read it), but checkpoints are now written sharded.

A *sharded* checkpoint is a directory (the trainer's: ``OUT/checkpoints/epoch-000003``)::

    manifest.json                     written last: format, epoch, world size, graph sha256,
                                      the node tables, and a sha256 and length per file
    replicated.pt                     rank 0: every parameter and buffer but the node tables,
                                      the optimizer's state but their per-row state, RNG, ...
    rank-0002/emb.author.weight.ids.npy      worker 2's global ids of the table's rows, sorted
    rank-0002/emb.author.weight.param.npy    its rows in that order; ``.exp_avg.npy``, ...:
                                             the optimizer's per-row state, likewise
    rank-0002/links.pt                worker 2's stale caches and error-feedback residuals

Each worker writes its own rows (:func:`write_rank_files`); a worker of a run on any number
of workers reads only the rows it owns (:func:`read_rows`): plain ``.npy`` files, read in
bounded chunks without pickles, the ids sorted so that a reader finds its rows with a binary
search and no index. One ``.npy`` per table in global order, written by every worker into
place, would need a file created before any worker writes and a shared file system that
takes concurrent writes into one file; per-worker files need neither, and each worker hashes
what it wrote. A directory is written as ``checkpoints/.tmp-epoch-000003`` and renamed into
place once its manifest is in it (:func:`publish`), so a directory named ``epoch-*`` with a
manifest is complete.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import torch
import torch.distributed as dist
from torch import nn

from sarcompile.errors import CheckpointError
from sarcompile.data.rundir import _atomic_write, _fsync_dir
from sarcompile.graph.tables import find_node_tables, shard_rows, shard_tables, table_type

__all__ = ["CHECKPOINTS", "CHECKPOINT_NAME", "MAGIC", "MANIFEST", "REPLICATED", "TableRows", "checkpoint_dir",
           "complete_checkpoints", "latest_checkpoint", "load_checkpoint", "prune_checkpoints", "publish",
           "read_header", "read_manifest", "read_replicated", "read_rows", "read_state", "recorded_header",
           "recorded_identity",
           "remove_temp_checkpoints", "save_checkpoint", "shard_optimizer_rows", "shard_state", "sorted_rows", "temp_dir",
           "verify_files", "write_manifest", "write_rank_files", "write_replicated"]

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


def _per_row(value: Any, shape: tuple[int, ...]) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == shape




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


def remove_temp_checkpoints(out_dir: str | os.PathLike) -> list[Path]:
    """Delete the checkpoint directories a killed run left half written (or half replaced)
    in ``out_dir``; returns them. Call it only while holding the run directory's lock."""
    root = Path(out_dir) / CHECKPOINTS
    left = [d for d in root.iterdir() if d.name.startswith((_TEMP, _OLD))] if root.is_dir() else []
    for d in left:
        shutil.rmtree(d, ignore_errors=True)
    return left


def prune_checkpoints(out_dir: str | os.PathLike, keep: int) -> list[Path]:
    """Delete all but the latest ``keep`` complete checkpoints of ``out_dir`` (an older
    version's ``checkpoint.pt`` counts as the oldest); returns what was deleted."""
    dirs = complete_checkpoints(out_dir)
    old = Path(out_dir) / CHECKPOINT_NAME
    doomed = dirs[: max(len(dirs) - keep, 0)]
    for d in doomed:
        shutil.rmtree(d)
    if old.is_file() and len(dirs) >= keep:
        old.unlink()
        doomed.append(old)
    return doomed


@dataclass
class TableRows:
    """One worker's rows of a node table: their global ids (any order) and, by name, the
    tensors with one row per id (``param``: the table's; the optimizer's per-row state)."""

    ids: torch.Tensor
    tensors: dict[str, torch.Tensor]


def sorted_rows(table: TableRows) -> TableRows:
    """A copy of ``table`` on the CPU, its rows in the order of their global ids (int64),
    as :func:`write_rank_files` writes them: indexing copies, so the copy costs no more
    memory than the rows themselves (a background write holds it while training goes on)."""
    order = torch.argsort(table.ids.cpu())
    return TableRows(table.ids.cpu()[order].to(torch.int64),
                     {k: t[order.to(t.device)].cpu() for k, t in table.tensors.items()})


class _Hashing:
    """A writable file that hashes and counts what goes through it."""

    def __init__(self, f):
        self.f, self.sha, self.bytes = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.bytes += len(data)
        return self.f.write(data)


def _write_file(path: Path, write) -> dict[str, Any]:
    """Create ``path`` with ``write(file)``, fsync'ed; returns its ``sha256`` and ``bytes``."""
    with open(path, "wb") as f:
        out = _Hashing(f)
        write(out)
        f.flush()
        os.fsync(f.fileno())
    return {"sha256": out.sha.hexdigest(), "bytes": out.bytes}


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    return t.view(_AS_INTEGERS[t.dtype]).numpy() if t.dtype in _AS_INTEGERS else t.numpy()


def write_rank_files(directory: Path, rank: int, tables: Mapping[str, TableRows],
                     links: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Write worker ``rank``'s rows of every node table (by parameter name) under
    ``directory/rank-NNNN/``, sorted by global id, and its links' state (``links.pt``);
    returns ``{file name relative to directory: {"sha256", "bytes", "rows"?}}`` for the
    manifest. Every file is fsync'ed (the directory too)."""
    sub = directory / f"rank-{rank:04d}"
    sub.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, table in tables.items():
        ids = table.ids.cpu()
        if ids.dtype != torch.int64 or (ids[1:] <= ids[:-1]).any():  # (a sorted copy is written as it is)
            table = sorted_rows(table)
        for key, t in {"ids": table.ids, **table.tensors}.items():
            array = _numpy(t)
            info = _write_file(sub / f"{name}.{key}.npy",
                               lambda f, a=array: np.lib.format.write_array(f, a, allow_pickle=False))
            files[f"{sub.name}/{name}.{key}.npy"] = {**info, "rows": int(array.shape[0])}
    if links is not None:
        files[f"{sub.name}/links.pt"] = _write_file(sub / "links.pt", lambda f: f.write(_pickled(links)))
    _fsync_dir(sub)
    return files


def _pickled(state: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def write_replicated(directory: Path, state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Write what every worker holds alike (rank 0): ``replicated.pt``; returns its manifest entry."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = _pickled(state)  # (serialised first: a state that cannot be saved fails before the disk is touched)
    return {REPLICATED: _write_file(directory / REPLICATED, lambda f: f.write(payload))}


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest (last, rank 0): ``manifest`` with the format's name and version."""
    text = json.dumps({"format": SHARDED_FORMAT, "version": SHARDED_VERSION, **manifest}, indent=1)
    _atomic_write(directory / MANIFEST, lambda f: f.write(text.encode()))


def publish(temp: Path, final: Path) -> None:
    """Rename the complete checkpoint directory ``temp`` to ``final`` (one of the same name,
    which a resumed run rewriting an epoch may find, is replaced)."""
    old = final.parent / f"{_OLD}{final.name}"
    if final.exists():
        os.replace(final, old)
    os.replace(temp, final)
    _fsync_dir(final.parent)
    if old.exists():
        shutil.rmtree(old)


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """The manifest of the sharded checkpoint ``directory``; a :class:`CheckpointError`
    naming the file where it is missing or damaged."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        what = "does not exist" if not Path(directory).exists() else f"has no {MANIFEST}"
        raise CheckpointError(
            f"checkpoint '{directory}' {what}: not a complete checkpoint (a write that was interrupted leaves none); "
            "resume from another one, or start the run again without --resume"
        )
    try:
        manifest = json.loads(path.read_text())
        if manifest.get("format") != SHARDED_FORMAT or not {"files", "tables", "world_size"} <= manifest.keys():
            raise ValueError("not a sarcompile checkpoint manifest")
    except (OSError, ValueError, AttributeError) as e:
        raise CheckpointError(f"checkpoint manifest '{path}' is damaged ({e}); restore a good copy, or resume from "
                              "another checkpoint") from None
    if manifest.get("version") != SHARDED_VERSION:
        raise CheckpointError(f"checkpoint '{directory}' has format version {manifest.get('version')}, this version "
                              f"of sarcompile reads {SHARDED_VERSION}")
    return manifest


def verify_files(directory: str | os.PathLike, manifest: dict[str, Any], names: list[str]) -> None:
    """Check files ``names`` of checkpoint ``directory`` against the manifest's length and
    sha256, reading each in chunks; a :class:`CheckpointError` naming the first missing,
    cut or changed one."""
    for name in names:
        path = Path(directory) / name
        want = manifest["files"][name]
        try:
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256")
            size = path.stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint file '{path}' is missing; restore it, or resume from another "
                                  "checkpoint") from None
        except OSError as e:
            raise CheckpointError(f"cannot read checkpoint file '{path}' ({e})") from None
        if size != want["bytes"]:
            raise CheckpointError(f"checkpoint file '{path}' has {size} bytes, {want['bytes']} were written (cut "
                                  "short or changed); restore it, or resume from another checkpoint")
        if digest.hexdigest() != want["sha256"]:
            raise CheckpointError(f"checkpoint file '{path}' is corrupt: its contents do not match the sha256 "
                                  "recorded when it was written; restore it, or resume from another checkpoint")


def read_replicated(directory: str | os.PathLike, manifest: dict[str, Any], name: str = REPLICATED) -> dict[str, Any]:
    """``replicated.pt`` (or a worker's ``links.pt``) of checkpoint ``directory``, checked
    against the manifest and read with ``weights_only``."""
    verify_files(directory, manifest, [name])
    path = Path(directory) / name
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (unpickling raises many types; each means the same here)
        raise CheckpointError(f"cannot unpickle checkpoint file '{path}' ({type(e).__name__}: {e})") from None


def read_rows(directory: str | os.PathLike, manifest: dict[str, Any], table: str, key: str,
              ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` (global ids) of node table ``table``'s tensor ``key`` in checkpoint
    ``directory``, in the order of ``ids``: each writer's ids are read in chunks and its
    rows only where some are wanted, so the reader holds its rows and one chunk."""
    entry = manifest["tables"][table]
    dtype = getattr(torch, entry["dtypes"][key].removeprefix("torch."))
    want = ids.cpu().to(torch.int64).numpy()
    order = np.argsort(want, kind="stable")
    wanted = want[order]
    stored = _AS_INTEGERS.get(dtype, dtype)
    out = torch.empty((len(want), *entry["shape"][1:]), dtype=stored).numpy()
    found = np.zeros(len(want), dtype=bool)
    for rank in range(manifest["world_size"]):
        base = Path(directory) / f"rank-{rank:04d}" / table
        for start, have in _chunks(Path(f"{base}.ids.npy")):
            pos = np.minimum(np.searchsorted(wanted, have), len(wanted) - 1) if len(wanted) else have[:0]
            hit = wanted[pos] == have if len(wanted) else np.zeros(len(have), dtype=bool)
            if hit.any():
                first, last = np.flatnonzero(hit)[[0, -1]]
                rows = _read_npy(Path(f"{base}.{key}.npy"), start + int(first), start + int(last) + 1)
                out[order[pos[hit]]] = rows[hit[first : last + 1]]
                found[order[pos[hit]]] = True
    if not found.all():
        missing = want[~found][:5].tolist()
        raise CheckpointError(f"checkpoint '{directory}' has no row of node table {table!r} for node ids {missing}"
                              f"{' ...' if (~found).sum() > 5 else ''}: it was written for another graph")
    result = torch.from_numpy(out)
    return result.view(dtype) if dtype in _AS_INTEGERS else result


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, offset of the data) of a ``.npy`` file."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        if fortran:
            raise CheckpointError(f"checkpoint file '{path}' holds a Fortran-order array, not one written here")
        return shape, dtype, f.tell()


def _read_npy(path: Path, lo: int, hi: int) -> np.ndarray:
    """Rows ``lo:hi`` of a ``.npy`` file, read from the file (no memory map)."""
    shape, dtype, offset = _npy_header(path)
    width = int(np.prod(shape[1:], dtype=np.int64))
    data = np.fromfile(path, dtype=dtype, count=(hi - lo) * width, offset=offset + lo * width * dtype.itemsize)
    return data.reshape(hi - lo, *shape[1:])


def _chunks(path: Path):
    """``(first row, rows)`` of a ``.npy`` file in chunks of about :data:`_CHUNK_BYTES`."""
    shape, dtype, _ = _npy_header(path)
    step = max(_CHUNK_BYTES // max(dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64)), 1), 1)
    for lo in range(0, shape[0], step):
        yield lo, _read_npy(path, lo, min(lo + step, shape[0]))


def recorded_identity(path: str | os.PathLike) -> dict[str, Any]:
    """``epoch`` and ``sha256`` of checkpoint ``path``, read without its tensors: a
    directory's manifest's sha256 and epoch, or a file's header (see :func:`recorded_header`);
    ``{}`` where there is none."""
    path = Path(path)
    if not path.is_dir():
        return recorded_header(path)
    try:
        data = (path / MANIFEST).read_bytes()
        return {"epoch": json.loads(data).get("epoch"), "sha256": hashlib.sha256(data).hexdigest()}
    except (OSError, ValueError, AttributeError):
        return {}


def read_state(path: str | os.PathLike) -> dict[str, Any]:
    """The whole state of a checkpoint, every file checked, as one machine loads it: a
    sharded checkpoint directory's ``replicated.pt`` with every node table, and its
    optimizer's per-row state, put together whole in global row order; or an older
    version's single file. (Every table whole: for one machine, not for a worker.)"""
    path = Path(path)
    if not path.is_dir():
        return load_checkpoint(path)
    manifest = read_manifest(path)
    verify_files(path, manifest, sorted(manifest["files"]))
    state = read_replicated(path, manifest)
    for name, entry in manifest["tables"].items():
        everyone = torch.arange(entry["shape"][0])
        state["model"][name] = read_rows(path, manifest, name, "param", everyone)
        if entry.get("optimizer") is not None:
            packed = state["optimizer"]["state"].setdefault(entry["optimizer"], {})
            packed.update({k: read_rows(path, manifest, name, k, everyone) for k in entry["dtypes"] if k != "param"})
    return state
