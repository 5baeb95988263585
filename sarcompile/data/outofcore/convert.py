"""Text and container formats converted a chunk at a time into raw binary scratch files,
which :class:`.sources.DiskArray` then reads like any array on disk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from sarcompile.data.datasets import _labels
from sarcompile.errors import DatasetError, GraphError
from sarcompile.data.outofcore.sources import DiskArray, EdgeFiles, csv_header

__all__ = ["ScratchWriter", "csv_edge_arrays", "csv_edges", "csv_own_edges", "read_csv"]


class ScratchWriter:
    """Raw binary files in ``scratch``, appended a chunk at a time."""

    def __init__(self, scratch: Path, chunk_rows: int):
        self.scratch, self.chunk_rows = scratch, chunk_rows

    def convert(self, key: str, chunks: Iterator, dtype: type) -> DiskArray:
        path, rows, shape = self.scratch / f"{key}.bin", 0, ()
        with open(path, "wb") as f:
            for chunk in chunks:
                np.ascontiguousarray(chunk, dtype=dtype).tofile(f)
                rows, shape = rows + len(chunk), chunk.shape[1:]
        return DiskArray(path, (rows, *shape), np.dtype(dtype), 0)

    def labels(self, chunks: Iterator, name: str) -> DiskArray:
        def checked():
            first = 0
            for chunk in chunks:
                yield _labels(chunk.reshape(len(chunk), -1), len(chunk), name, first).numpy()
                first += len(chunk)
        return self.convert("y", checked(), np.int64)

    def edges(self, pairs: Iterator[np.ndarray]) -> tuple[DiskArray, DiskArray]:
        paths = self.scratch / "src.bin", self.scratch / "dst.bin"
        count = 0
        with open(paths[0], "wb") as fs, open(paths[1], "wb") as fd:
            for p in pairs:
                np.ascontiguousarray(p[:, 0]).tofile(fs)
                np.ascontiguousarray(p[:, 1]).tofile(fd)
                count += len(p)
        return tuple(DiskArray(path, (count,), np.dtype(np.int64), 0) for path in paths)

    def array(self, key: str, values: np.ndarray) -> DiskArray:
        return self.convert(key, iter([values]), values.dtype.type)


def read_csv(path: Path, dtype: type, chunk_rows: int) -> Iterator[np.ndarray]:
    """The rows of one of OGB's headerless gzip CSVs, ``chunk_rows`` at a time."""
    import pandas as pd  # an ogb dependency

    try:
        with pd.read_csv(path, header=None, dtype=dtype, chunksize=chunk_rows, compression="gzip") as reader:
            for frame in reader:
                yield frame.to_numpy()
    except (ValueError, OSError, pd.errors.ParserError) as e:
        raise DatasetError(f"cannot read '{path}' ({type(e).__name__}: {e}); re-extract OGB's zip") from None


def csv_edges(path: str | Path, num_nodes: int, writer: ScratchWriter) -> EdgeFiles:
    """The edges of a CSV edge file (two integer columns; an optional header names them
    ``src,dst`` or ``dst,src``), converted a chunk at a time."""
    path, order = _csv_start(path, own_ids=False)
    src, dst = writer.edges(_int_pairs(path, order, writer.chunk_rows))
    return EdgeFiles(src, dst, num_nodes)


def csv_edge_arrays(path: str | Path, chunk_rows: int = 1 << 20) -> tuple[np.ndarray, np.ndarray]:
    """The edges of a CSV edge file as two int64 arrays (src, dst), read whole: the file
    read as :func:`csv_edges` reads it, for a graph partitioned in memory."""
    path, order = _csv_start(path, own_ids=False)
    edges = np.concatenate(list(_int_pairs(path, order, chunk_rows)))  # pandas: no rows is EmptyDataError
    return np.ascontiguousarray(edges[:, 0]), np.ascontiguousarray(edges[:, 1])


def _int_pairs(path: Path, order: list[str] | None, chunk_rows: int) -> Iterator[np.ndarray]:
    """:func:`_csv_pairs` of int64 node ids, a field that is not one named as such."""
    _check_integer_text(path, order is not None)
    try:
        yield from _csv_pairs(path, order, np.int64, chunk_rows)
    except GraphError:
        raise
    except (ValueError, OverflowError) as e:
        raise GraphError(f"'{path}' is not a CSV of integer src,dst pairs ({e})") from None


def csv_own_edges(path: str | Path, writer: ScratchWriter) -> tuple[EdgeFiles, np.ndarray]:
    """The edges of a CSV whose two columns are the user's own node ids, numbered ``0..n-1``
    in the ids' sorted order, and the ids in that order (``ids[i]`` is node ``i``'s).

    The ids are integers (int64, sorted ascending) where every field of the file is a
    64-bit signed integer, else strings (surrounding spaces stripped, sorted by code
    point; ``"7"`` and ``"007"`` are then two nodes). Only nodes that some edge names
    exist. Two passes over the file: the sorted distinct ids, merged chunk by chunk (they
    are held in memory: 8 bytes per node for integers), then every edge numbered by
    binary search. A first line that is exactly ``src,dst`` (or ``dst,src``) is a header."""
    path, order = _csv_start(path, own_ids=True)
    chunk = writer.chunk_rows
    try:
        ids, dtype = _sorted_unique(_csv_pairs(path, order, np.int64, chunk), chunk), np.int64
    except GraphError:
        raise
    except (ValueError, OverflowError):  # a field that is not a 64-bit integer: every id is a string
        ids, dtype = _sorted_unique(_csv_pairs(path, order, str, chunk), chunk), str
    src, dst = writer.edges(np.searchsorted(ids, rows) for rows in _csv_pairs(path, order, dtype, chunk))
    return EdgeFiles(src, dst, len(ids)), ids


# The bytes of a CSV of integers (quotes: pandas reads "3" as 3).
_INTEGER_BYTES = np.zeros(256, dtype=bool)
_INTEGER_BYTES[list(b"0123456789+-, \t\r\n\"")] = True


def _check_integer_text(path: Path, header: bool, block: int = 1 << 24) -> None:
    """Refuse a field that is not written as an integer: pandas reads ``1e3`` or ``1.0``
    as an int64 (it parses a float and keeps it when integral), but node ids are
    integers. One pass over the file in ``block``-byte reads (bounded memory)."""
    with open(path, "rb") as f:
        first = f.readline() if header else f.read(3)
        if not header and first != b"\xef\xbb\xbf":  # a byte-order mark is no field
            f.seek(0)
        line = int(header) + 1
        while data := f.read(block):
            bad = np.flatnonzero(~_INTEGER_BYTES[np.frombuffer(data, dtype=np.uint8)])
            if bad.size:
                at = int(bad[0])
                line += data.count(b"\n", 0, at)
                start = data.rfind(b"\n", 0, at) + 1
                end = data.find(b"\n", at)
                text = data[start:end if end >= 0 else len(data)].decode("utf-8", "replace").strip()
                raise GraphError(f"'{path}' is not a CSV of integer src,dst pairs (line {line}: {text!r})")
            line += data.count(b"\n")


def _csv_start(path: str | Path, own_ids: bool) -> tuple[Path, list[str] | None]:
    """The path of an edge CSV, checked, and the column order its header names (None: no header)."""
    path = Path(path)
    if not path.is_file():
        raise GraphError(f"edge file '{path}' not found")
    with open(path, encoding="utf-8-sig") as f:
        return path, csv_header(f.readline(), path, own_ids)


def _csv_pairs(path: Path, order: list[str] | None, dtype: type, chunk_rows: int) -> Iterator[np.ndarray]:
    """The rows of an edge CSV as ``[k, 2]`` arrays of (src, dst), ``chunk_rows`` at a time:
    int64, or with ``dtype=str`` the fields as strings, stripped. A field that does not
    parse as ``dtype`` raises pandas' ValueError; a row that is not two fields, or an empty
    id, :class:`GraphError`."""
    import pandas as pd

    text = dtype is str
    options = {"keep_default_na": False, "na_filter": False} if text else {}
    swap, first = order is not None and order.index("src") == 1, 0
    try:
        with pd.read_csv(path, header=None, skiprows=int(order is not None), dtype=dtype, chunksize=chunk_rows,
                         encoding="utf-8-sig", **options) as reader:
            for frame in reader:
                if frame.shape[1] != 2:
                    raise GraphError(f"'{path}' has {frame.shape[1]} columns; expected two: src,dst")
                rows = frame.to_numpy()
                if text:
                    rows = np.char.strip(rows.astype(str))
                    empty = np.flatnonzero((rows == "").any(axis=1))
                    if empty.size:
                        raise GraphError(f"'{path}': edge {first + int(empty[0])} has an empty node id")
                first += len(rows)
                yield rows[:, ::-1] if swap else rows
    except pd.errors.EmptyDataError:
        raise GraphError(f"'{path}' has no edges") from None
    except pd.errors.ParserError as e:
        raise GraphError(f"'{path}' is not a CSV of src,dst pairs ({e})") from None


def _sorted_unique(chunks: Iterator[np.ndarray], chunk_rows: int) -> np.ndarray:
    """The distinct values of every chunk, sorted; chunks' distinct values are merged once
    they outgrow what is merged already (or a chunk), so that the merging stays linear."""
    done, pending, size = None, [], 0
    for chunk in chunks:
        pending.append(np.unique(chunk))
        size += pending[-1].size
        if size > max(0 if done is None else done.size, chunk_rows):
            done, pending, size = np.unique(np.concatenate(pending if done is None else [done, *pending])), [], 0
    parts = pending if done is None else [done, *pending]
    if not parts:
        raise GraphError("the edge file has no edges")
    return np.unique(np.concatenate(parts))
