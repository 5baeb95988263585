"""Arrays on disk read a chunk at a time.

A ``.npy`` file is read with plain file reads at computed offsets rather than through
``np.load(mmap_mode="r")``: the pages of a mapping stay in the process's resident set once
touched, so one pass over a mapped 20 GB file would count 20 GB against a memory limit. A
read chunk is an ordinary array that is freed when the caller drops it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sarcompile.errors import GraphError

__all__ = ["CSV_COLUMNS", "DiskArray", "EdgeFiles", "csv_header", "open_edges"]

CSV_COLUMNS = ("src", "dst")


@dataclass(frozen=True)
class DiskArray:
    """A C-ordered array stored in a file from byte ``offset`` on: a ``.npy`` file
    (:meth:`npy`), or raw bytes another reader wrote or found inside a container."""

    path: Path
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int

    @classmethod
    def npy(cls, path: str | os.PathLike, start: int = 0) -> DiskArray:
        """Read the header of the ``.npy`` data at byte ``start`` of ``path`` (0: a ``.npy``
        file; more: one stored inside a container); a missing, non-``.npy`` or
        Fortran-ordered file raises :class:`GraphError` saying so."""
        path = Path(path)
        if not path.is_file():
            raise GraphError(f"array file '{path}' not found")
        try:
            with open(path, "rb") as f:
                f.seek(start)
                version = np.lib.format.read_magic(f)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read_header(f)
                offset = f.tell()
        except ValueError as e:
            raise GraphError(f"'{path}' is not a .npy file ({e}); save arrays with numpy.save") from None
        if fortran and len(shape) > 1:
            raise GraphError(f"'{path}' is Fortran-ordered; save it C-ordered (np.ascontiguousarray) to stream it")
        if dtype.hasobject:
            raise GraphError(f"'{path}' holds Python objects; node data and edges must be numeric arrays")
        expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if path.stat().st_size < expected:
            raise GraphError(f"'{path}' is truncated: its header promises {expected} bytes, "
                             f"the file has {path.stat().st_size}")
        return cls(path, tuple(int(s) for s in shape), dtype, offset)

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a fresh array."""
        stop = min(stop, self.rows)
        count = max(stop - start, 0) * int(np.prod(self.shape[1:], dtype=np.int64))
        with open(self.path, "rb") as f:
            f.seek(self.offset + start * self.row_bytes)
            data = np.fromfile(f, dtype=self.dtype, count=count)
        return data.reshape((max(stop - start, 0), *self.shape[1:]))

    def chunks(self, rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, rows start..start+len)`` for consecutive chunks of at most ``rows`` rows."""
        for start in range(0, self.rows, max(rows, 1)):
            yield start, self.read(start, start + rows)


@dataclass(frozen=True)
class EdgeFiles:
    """Edges ``src[i] -> dst[i]`` as two one-dimensional integer ``.npy`` files."""

    src: DiskArray
    dst: DiskArray
    num_nodes: int

    @property
    def num_edges(self) -> int:
        return self.src.rows

    def chunks(self, size: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(first edge id, src, dst)`` as int64 arrays of at most ``size`` edges, in edge order;
        an id outside ``[0, num_nodes)`` raises :class:`GraphError` naming the edge."""
        for start in range(0, self.num_edges, max(size, 1)):
            src = self.src.read(start, start + size).astype(np.int64, copy=False)
            dst = self.dst.read(start, start + size).astype(np.int64, copy=False)
            for name, ids in (("src", src), ("dst", dst)):
                bad = np.flatnonzero((ids < 0) | (ids >= self.num_nodes))
                if bad.size:
                    raise GraphError(
                        f"edge {start + int(bad[0])} has {name} {int(ids[bad[0]])}, outside [0, {self.num_nodes}): "
                        "node ids must be below --num-nodes"
                    )
            yield start, src, dst


def open_edges(src: str | os.PathLike, dst: str | os.PathLike, num_nodes: int) -> EdgeFiles:
    """The edge arrays ``src`` and ``dst`` (``.npy``), checked: one-dimensional integers of
    one length, and ``num_nodes`` a non-negative integer."""
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
        raise GraphError(f"num_nodes must be an integer >= 0, got {num_nodes!r}")
    arrays = DiskArray.npy(src), DiskArray.npy(dst)
    for a in arrays:
        if len(a.shape) != 1 or a.dtype.kind not in "iu":
            raise GraphError(f"'{a.path}' has shape {a.shape} and dtype {a.dtype}: an edge file holds "
                             "one integer node id per edge (a one-dimensional integer array)")
    if arrays[0].rows != arrays[1].rows:
        raise GraphError(f"'{arrays[0].path}' has {arrays[0].rows} edges but '{arrays[1].path}' has "
                         f"{arrays[1].rows}; src and dst must pair up")
    return EdgeFiles(*arrays, num_nodes)


def csv_header(line: str, path: Path, own_ids: bool = False) -> list[str] | None:
    """The column names of an edge CSV's header line (``src,dst`` in either order), or None
    for a line of data. A line with a number in it is always data (``1e3,2`` is a bad
    edge, not a header); a line of other words that are not src and dst is refused, since
    taking its columns by position could swap the edges' directions. With ``own_ids``
    (ids may be any words) only a line that is exactly src and dst is a header."""
    fields = [c.strip() for c in line.split(",")]
    names = [c.lower() for c in fields]
    if sorted(names) == sorted(CSV_COLUMNS):
        return names
    if own_ids or not line.strip() or any(_is_number(c) for c in fields):
        return None
    raise GraphError(
        f"'{path}': the header line {line.strip()!r} does not name the columns src and dst; "
        "write the header as src,dst (or dst,src) or leave it out (the columns are then src,dst); if these are "
        "node ids of your own (words, not integers 0..n-1), partition with --own-ids"
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
