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
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointError
from .partitioning import _atomic_write

__all__ = ["CHECKPOINT_NAME", "MAGIC", "load_checkpoint", "read_header", "save_checkpoint"]

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
