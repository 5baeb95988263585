"""The user's own node ids of a partition: which id of theirs every global node id stands for.

A graph given with its own ids (an edge CSV partitioned with ``--own-ids``, an OGB dataset
whose directory has OGB's ``mapping/`` files, or ``sc.partition(..., node_ids=...)``) is
numbered ``0..n-1``; the partition directory then keeps, for global node id ``i``, the
user's id at row ``i`` of one ``.npy`` file::

    node_ids.npy                # one node type
    node_ids.{type}.npy         # a typed partition: per node type that has ids

Integer ids are ``int64``; string ids are fixed-width unicode (numpy ``<U{longest}``), so
that both are plain ``.npy`` files any numpy memory-maps (``np.load(path, mmap_mode="r")``)
and a row is found without reading the others. A string file takes 4 bytes per character
of the longest id, per node. Each file is written to a temporary name and renamed into
place before the manifest, which records per file its sha256, dtype, kind (``"integer"`` or
``"string"``) and length. Nothing loads the file whole: the
workers never open it, and :func:`sarcompile.read_node_ids` memory-maps it after
checking it.

>>> import tempfile
>>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
>>> d = tempfile.mkdtemp()
>>> _ = sc.partition(g, 2, d, node_ids=np.array(["ann", "bob", "cy"]))
>>> sc.read_node_ids(d).tolist()
['ann', 'bob', 'cy']
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from sarcompile.errors import GraphError
from sarcompile.data.rundir import _atomic_write, _sha256

__all__ = ["IDS_FILES", "Ids", "check_ids", "ids_file_name", "kind_of", "open_ids", "write_node_ids"]

IDS_FILES = "node_ids*.npy"  # what a partition run removes before it writes (glob)


class ChunkedIds(Protocol):
    """Integer ids on disk, read a chunk at a time (:class:`sarcompile.data.outofcore.DiskArray`)."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def chunks(self, rows: int) -> Iterator[tuple[int, np.ndarray]]: ...


Ids = np.ndarray | ChunkedIds


def kind_of(dtype: np.dtype) -> str:
    """``"integer"`` or ``"string"``: what a file of ``dtype`` holds."""
    return "string" if dtype.kind == "U" else "integer"


def check_ids(ids: Any, num_nodes: int, what: str) -> Ids:
    """``ids`` as one id per node: a one-dimensional array of ``num_nodes`` integers or
    strings, each once (an array in memory is checked for repeats; ids read from disk in
    chunks come from a numbering that cannot repeat). Integers become int64; anything
    else raises :class:`GraphError` naming ``what``."""
    if not isinstance(ids, np.ndarray) and hasattr(ids, "chunks"):
        if ids.shape != (num_nodes,) or ids.dtype.kind not in "iu":
            raise GraphError(f"{what}: {ids.shape} {ids.dtype} on disk, expected {num_nodes} integer ids")
        return ids
    try:
        array = np.asarray(ids.numpy() if hasattr(ids, "numpy") else ids)
    except (TypeError, ValueError) as e:
        raise GraphError(f"{what} is not an array of node ids ({e})") from None
    if array.dtype.kind in "iu":
        if array.dtype == np.uint64 and array.size and int(array.max()) > np.iinfo(np.int64).max:
            raise GraphError(f"{what}: ids above 2**63 - 1 do not fit int64; give them as strings")
        array = array.astype(np.int64, copy=False)
    elif array.dtype.kind == "O" and all(isinstance(v, str) for v in array.reshape(-1)):
        array = array.astype(str)
    elif array.dtype.kind != "U":
        raise GraphError(f"{what} has dtype {array.dtype}: node ids are integers or strings")
    if array.shape != (num_nodes,):
        raise GraphError(f"{what} has shape {array.shape} but the graph has {num_nodes} nodes: give one id per node, "
                         "in global node order")
    unique, counts = np.unique(array, return_counts=True)
    if unique.size != array.size:
        raise GraphError(f"{what} repeats id {unique[counts > 1][0].item()!r}: each node needs an id of its own")
    return array


def ids_file_name(ntype: str | None, index: int) -> str:
    """The file of a node type's ids (the ``index``-th type; None: a one-type graph)."""
    if ntype is None:
        return "node_ids.npy"
    stem = ntype if re.fullmatch(r"[\w-]+", ntype) else f"type{index}"  # a name safe as a file name
    return f"node_ids.{stem}.npy"


def write_node_ids(out: Path, ids: Ids | dict[str, Ids]) -> dict[str, Any]:
    """Write the ids (one array, or a dict per node type) into ``out``, atomically; returns
    the manifest's record: one file's record, or a dict of them per node type."""
    def write(ntype: str | None, index: int, array: Ids) -> dict[str, Any]:
        path = out / ids_file_name(ntype, index)
        _atomic_write(path, lambda f: _save(f, array))
        return {"file": path.name, "sha256": _sha256(path), "kind": kind_of(array.dtype),
                "dtype": np.lib.format.dtype_to_descr(np.dtype(array.dtype)), "num_nodes": int(array.shape[0])}

    if isinstance(ids, dict):
        return {t: write(t, i, a) for i, (t, a) in enumerate(ids.items())}
    return write(None, 0, ids)


def _save(f: Any, ids: Ids) -> None:
    if isinstance(ids, np.ndarray):
        np.save(f, ids, allow_pickle=False)
        return
    dtype = np.dtype(np.int64)
    np.lib.format.write_array_header_1_0(f, {"descr": dtype.str, "fortran_order": False, "shape": ids.shape})
    for _, chunk in ids.chunks(1 << 20):
        np.ascontiguousarray(chunk, dtype=dtype).tofile(f)


def open_ids(directory: Path, record: dict[str, Any], error: type[Exception], redo: str) -> np.ndarray:
    """The ids file ``record`` names in ``directory``, memory-mapped read-only, after checking
    it is there with the recorded checksum, dtype and length; else ``error`` saying ``redo``."""
    path = directory / record["file"]
    if not path.is_file():
        raise error(f"node id file '{path}' is missing: {redo}")
    if _sha256(path) != record["sha256"]:
        raise error(f"node id file '{path}' does not match its checksum in the manifest (damaged or replaced): {redo}")
    try:
        ids = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise error(f"cannot read node id file '{path}' ({e}): {redo}") from None
    if ids.shape != (record["num_nodes"],) or np.lib.format.dtype_to_descr(ids.dtype) != record["dtype"]:
        raise error(f"node id file '{path}' holds {ids.dtype} {ids.shape}, the manifest says {record['dtype']} "
                    f"({record['num_nodes']},): {redo}")
    return ids
