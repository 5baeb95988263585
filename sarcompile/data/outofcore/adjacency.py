"""The undirected simple graph behind a set of edges, as buckets of whole adjacency lists on disk.

Bucket ``i`` holds every adjacency entry ``(u, v)`` with ``u`` in the node range
``[bounds[i], bounds[i+1])``, both directions of every edge, self-loops dropped,
duplicates removed, sorted by ``(u, v)``: what METIS would be given, cut by node ranges.
A pass that loads one bucket at a time therefore sees each node's complete
neighbourhood (label propagation and refinement need it), while only one bucket is ever
in memory. Ranges are cut where the degrees' running sum crosses a multiple of the
bucket size, so buckets hold about the same number of entries whatever the skew (a node
of higher degree than a bucket gets a bucket of its own).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sarcompile.data.outofcore.sources import EdgeFiles

__all__ = ["Block", "Buckets", "build_buckets"]


@dataclass(frozen=True)
class Block:
    """Adjacency entries ``a[i] -> b[i]`` of the nodes ``[lo, hi)``, sorted by ``a``, with
    weights ``w`` (None: every entry weighs 1)."""

    lo: int
    hi: int
    a: np.ndarray
    b: np.ndarray
    w: np.ndarray | None = None


@dataclass(frozen=True)
class Buckets:
    """The bucket files of one graph (see the module docstring)."""

    files: list[Path]
    bounds: np.ndarray  # node ranges: bucket i holds [bounds[i], bounds[i+1])
    entries: list[int]
    num_nodes: int
    dtype: np.dtype  # int32 when the ids fit, halving the disk traffic

    @property
    def num_entries(self) -> int:
        return sum(self.entries)

    def blocks(self) -> Iterator[Block]:
        for i, path in enumerate(self.files):
            pairs = np.fromfile(path, dtype=self.dtype).reshape(-1, 2).astype(np.int64)
            yield Block(int(self.bounds[i]), int(self.bounds[i + 1]), pairs[:, 0].copy(), pairs[:, 1].copy())


def build_buckets(edges: EdgeFiles, scratch: Path, chunk_edges: int, bucket_entries: int) -> Buckets:
    """Write the buckets of ``edges`` under ``scratch``: one pass for the degrees, one to
    scatter the entries, then each bucket sorted and de-duplicated in place."""
    n = edges.num_nodes
    dtype = np.dtype(np.int32 if n < 2**31 else np.int64)
    degree = np.zeros(n, dtype=np.int64)
    for _, src, dst in edges.chunks(chunk_edges):
        keep = src != dst
        degree += np.bincount(src[keep], minlength=n)
        degree += np.bincount(dst[keep], minlength=n)
    bounds = _bounds(degree, bucket_entries)
    del degree
    files = [scratch / f"adjacency-{i}.bin" for i in range(len(bounds) - 1)]
    with contextlib.ExitStack() as stack:
        outs = [stack.enter_context(open(p, "wb")) for p in files]
        for _, src, dst in edges.chunks(chunk_edges):
            keep = src != dst
            a = np.concatenate([src[keep], dst[keep]])
            b = np.concatenate([dst[keep], src[keep]])
            bucket = np.searchsorted(bounds, a, side="right") - 1
            order = np.argsort(bucket, kind="stable")
            pairs = np.stack([a[order], b[order]], axis=1).astype(dtype)
            counts = np.bincount(bucket, minlength=len(files))
            for out, piece in zip(outs, np.split(pairs, np.cumsum(counts)[:-1])):
                piece.tofile(out)
    entries = [_sort_unique(p, n, dtype) for p in files]
    return Buckets(files, bounds, entries, n, dtype)


def _bounds(degree: np.ndarray, bucket_entries: int) -> np.ndarray:
    """Node ranges of about ``bucket_entries`` adjacency entries each (at least one bucket)."""
    n = degree.size
    ends = np.cumsum(degree)
    total = int(ends[-1]) if n else 0
    cuts = np.searchsorted(ends, np.arange(bucket_entries, total, bucket_entries), side="left") + 1
    return np.unique(np.concatenate([[0], cuts[cuts < n], [n]])).astype(np.int64)


def _sort_unique(path: Path, n: int, dtype: np.dtype) -> int:
    """Sort bucket ``path`` by (u, v) and drop repeated entries; the entries left."""
    pairs = np.fromfile(path, dtype=dtype).reshape(-1, 2).astype(np.int64)
    key = np.unique(pairs[:, 0] * n + pairs[:, 1])
    del pairs
    out = np.stack([key // n, key % n], axis=1).astype(dtype)
    out.tofile(path)
    return len(out)
