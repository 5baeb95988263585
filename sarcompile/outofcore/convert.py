"""Text and container formats converted a chunk at a time into raw binary scratch files,
which :class:`.sources.DiskArray` then reads like any array on disk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..data.datasets import _labels
from ..errors import DatasetError, GraphError
from .sources import DiskArray, EdgeFiles, csv_header

__all__ = ["ScratchWriter", "csv_edges", "read_csv"]


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
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise GraphError(f"edge file '{path}' not found")
    with open(path, encoding="utf-8-sig") as f:
        order = csv_header(f.readline(), path)
    swap = order is not None and order.index("src") == 1

    def pairs() -> Iterator[np.ndarray]:
        try:
            with pd.read_csv(path, header=None, skiprows=int(order is not None), dtype=np.int64,
                             chunksize=writer.chunk_rows, encoding="utf-8-sig") as reader:
                for frame in reader:
                    if frame.shape[1] != 2:
                        raise GraphError(f"'{path}' has {frame.shape[1]} columns; expected two: src,dst")
                    rows = frame.to_numpy()
                    yield rows[:, ::-1] if swap else rows
        except (ValueError, pd.errors.ParserError) as e:
            raise GraphError(f"'{path}' is not a CSV of integer src,dst pairs ({e})") from None

    src, dst = writer.edges(pairs())
    return EdgeFiles(src, dst, num_nodes)
