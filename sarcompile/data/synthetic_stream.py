"""Large synthetic graphs written straight to ``.npy`` files, never held whole in memory.

What it generates: a directed stochastic block model (SBM). Node ``v`` belongs to planted
block ``v % num_blocks``; a share ``p_in`` of the edges join two nodes of one block, the
rest join two different blocks. Degrees are either uniform (every node equally likely at
either end of an edge: Poisson-like degrees) or ``"powerlaw"``: within its block each node
has a Pareto popularity weight (tail index :data:`~sarcompile.data.synthetic.PARETO_ALPHA`, the
same as the in-memory generator's), so in- and out-degrees are heavy-tailed and a few hubs
hold a large share of the edges. With ``features > 0`` it adds node features (the centroid
of the node's class plus unit noise, so labels are learnable from features alone), labels
``y = block % num_classes`` and disjoint train/valid/test masks.
:func:`write_papers100m_like` fixes the parameters to ogbn-papers100M's shape, scaled.

Why streamed: the graphs this is for (out-of-core partitioning, papers100M-sized dry runs)
are bigger than the memory they are partitioned in. Every array is written front to back,
one draw unit at a time, and nothing the size of the graph is ever held: a node's block
and its popularity are functions of its id (the hub ranks are scattered over each block by
a multiplicative permutation, not a stored table), and every unit of
:data:`DRAW_UNIT` values has its own random generator seeded from ``(seed, stream, unit
index)``. So peak memory is ``O(chunk_edges)`` (the write buffers) plus ``O(DRAW_UNIT)``,
whatever the graph's size, and the output does not depend on ``chunk_edges``: the same
arguments (``chunk_edges`` aside) give byte-identical files.

Layout of ``out_dir`` (plain ``.npy`` files, readable by ``np.load``, memory-mapped with
``mmap_mode="r"`` too):

==================  =============================  =====================================
file                dtype, shape                   content
==================  =============================  =====================================
``src.npy``         int64 ``[num_edges]``          edge ``i`` goes ``src[i] -> dst[i]``
``dst.npy``         int64 ``[num_edges]``
``block.npy``       int64 ``[num_nodes]``          the planted block, ``v % num_blocks``
``x.npy``           float32 ``[num_nodes, F]``     with ``features = F > 0`` only
``y.npy``           int64 ``[num_nodes]``          ``block % num_classes``; -1: unlabelled
``*_mask.npy``      bool ``[num_nodes]``           ``train``, ``val``, ``test``: disjoint
==================  =============================  =====================================

Each file is written under a temporary name in ``out_dir`` (``.NAME.<random>.tmp``, what
:func:`sarcompile.data.rundir.remove_stale_temps` cleans) and renamed into place only once
every file of the graph is complete, so a killed run leaves no partial file under a final
name. Example::

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as out:
    ...     g = write_sbm(out, num_nodes=1000, avg_degree=4.5, num_blocks=4, features=8)
    ...     print(g.num_nodes, g.num_edges, sorted(g.files))
    ...     print(np.load(g.files["x"], mmap_mode="r").shape)
    1000 4500 ['block', 'dst', 'src', 'test_mask', 'train_mask', 'val_mask', 'x', 'y']
    (1000, 8)
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sarcompile.errors import GraphError
from sarcompile.data.rundir import _create_temp, _fsync_dir
from sarcompile.data.synthetic import PARETO_ALPHA, SEPARATION, SPLIT
from sarcompile.data.validate import MASKS

__all__ = [
    "DRAW_UNIT",
    "PAPERS100M",
    "StreamedGraph",
    "write_papers100m_like",
    "write_sbm",
]

DRAW_UNIT = 1 << 15  # values drawn from one seeded generator: the output's unit of determinism
DEGREES = ("uniform", "powerlaw")
# Golden-ratio multiplier: consecutive popularity ranks land far apart within a block, so
# the hubs are spread over the id range instead of sitting at its start.
_SPREAD = (math.sqrt(5) - 1) / 2
# Random streams, one per kind of draw: changing how one is drawn leaves the others alone.
_LAYOUT, _EDGES, _SPLIT, _NOISE = range(4)

# ogbn-papers100M as OGB ships it; its 172 subject areas are the planted blocks. p_in is an
# assumption, not a measurement of papers100M: citations mostly stay within a field.
PAPERS100M = {
    "num_nodes": 111_059_956,
    "num_edges": 1_615_685_872,
    "num_classes": 172,
    "split": (1_207_179, 125_265, 214_338),  # train / valid / test nodes; the rest unlabelled
    "p_in": 0.65,
}


@dataclass
class StreamedGraph:
    """The files of a graph written by this module (see the module docstring's layout);
    ``files`` holds exactly what the call wrote, keyed by name without ``.npy``."""

    num_nodes: int
    num_edges: int
    files: dict[str, Path]

    def edges(self) -> tuple[Path, Path]:
        """``(src.npy, dst.npy)``."""
        return self.files["src"], self.files["dst"]


def write_sbm(
    out_dir: str | os.PathLike,
    num_nodes: int,
    avg_degree: float,
    num_blocks: int,
    *,
    p_in: float = 0.9,
    degree: str = "uniform",
    features: int = 0,
    num_classes: int = 16,
    seed: int = 0,
    chunk_edges: int = 1 << 22,
) -> StreamedGraph:
    """Write a directed SBM graph to ``out_dir`` (created if missing); its files.

    ``num_edges = round(num_nodes * avg_degree)`` (Python's ``round``: nearest integer, ties
    to even), so ``avg_degree`` is the mean out-degree (and in-degree). Each edge is drawn
    independently: its source by degree model (uniform over all nodes, or by popularity
    within a block picked in proportion to block size), its target in the source's block
    with probability ``p_in`` and otherwise in a uniformly chosen other block, then by
    degree model within that block. Multi-edges occur; self-loops do not (a draw of the
    source itself moves to the next node of its block), except in a block of one node.
    With ``num_blocks == 1`` every edge is within the block whatever ``p_in``.

    ``features > 0`` adds ``x``, ``y`` and the masks: each node independently lands in
    train/valid/test with probability 0.8/0.1/0.1. ``chunk_edges`` is how many values each
    open file buffers before writing (the memory knob); it does not change the output.
    Raises :class:`GraphError` naming the argument that is out of range.
    """
    if not (math.isfinite(avg_degree) and avg_degree >= 0):
        raise GraphError(f"avg_degree must be a finite number >= 0, got {avg_degree}")
    _check_count("num_nodes", num_nodes, 1)
    return _write(
        Path(out_dir), num_nodes, round(num_nodes * avg_degree), num_blocks, p_in=p_in, degree=degree,
        features=features, num_classes=num_classes, split=(SPLIT[0], SPLIT[1], 1 - sum(SPLIT)),
        seed=seed, chunk_edges=chunk_edges,
    )


def write_papers100m_like(
    out_dir: str | os.PathLike,
    scale: float = 1.0,
    *,
    features: int = 128,
    seed: int = 0,
    chunk_edges: int = 1 << 22,
) -> StreamedGraph:
    """Write a graph shaped like ogbn-papers100M times ``scale`` to ``out_dir``.

    ``round(111_059_956 * scale)`` nodes (at least 172) and ``round(1_615_685_872 * scale)``
    directed edges (mean out-degree about 14.5), power-law degrees, 172 planted blocks that
    are also the 172 classes, ``p_in`` = ``PAPERS100M["p_in"]``, ``features`` wide float32
    features (128, papers100M's width; 0: none). Like papers100M, only about 1.4% of the
    nodes are labelled: each node independently is train, valid or test with papers100M's
    shares (1.09%, 0.11%, 0.19%); every other node has ``y = -1``. At ``scale=1`` the
    files take about 26 GB of edges plus 57 GB of features. Raises :class:`GraphError` for
    ``scale <= 0`` or one that leaves fewer nodes than blocks (below about 1.6e-6).
    """
    if not (math.isfinite(scale) and scale > 0):
        raise GraphError(f"scale must be a finite number > 0 (1.0: papers100M's size), got {scale}")
    p = PAPERS100M
    n = round(p["num_nodes"] * scale)
    if n < p["num_classes"]:
        least = p["num_classes"] / p["num_nodes"]
        raise GraphError(f"scale {scale} gives {n} nodes, fewer than the {p['num_classes']} blocks: "
                         f"use scale >= {least:.2g}")
    return _write(
        Path(out_dir), n, round(p["num_edges"] * scale), p["num_classes"],
        p_in=p["p_in"], degree="powerlaw", features=features, num_classes=p["num_classes"],
        split=tuple(k / p["num_nodes"] for k in p["split"]), seed=seed, chunk_edges=chunk_edges,
    )


def _write(out: Path, n: int, m: int, num_blocks: int, *, p_in: float, degree: str, features: int,
           num_classes: int, split: tuple[float, ...], seed: int, chunk_edges: int) -> StreamedGraph:
    """Check the arguments, then write the edges and node files of one graph (see :func:`write_sbm`)."""
    _check_count("num_nodes", n, 1)
    _check_count("num_blocks", num_blocks, 1)
    if num_blocks > n:
        raise GraphError(f"num_blocks ({num_blocks}) must be at most num_nodes ({n}): every block needs a node")
    if -(-n // num_blocks) > 2**31:
        # k * multiplier in _Blocks must stay inside int64
        raise GraphError(f"blocks of more than 2**31 nodes are not supported: raise num_blocks above {num_blocks}")
    if not 0 <= p_in <= 1:
        raise GraphError(f"p_in, the share of within-block edges, must be in [0, 1], got {p_in}")
    if degree not in DEGREES:
        raise GraphError(f"degree must be one of {DEGREES}, got {degree!r}")
    _check_count("features", features, 0)
    _check_count("num_classes", num_classes, 1)
    _check_count("seed", seed, 0)
    _check_count("chunk_edges", chunk_edges, 1)

    out.mkdir(parents=True, exist_ok=True)
    blocks = _Blocks(n, num_blocks, degree == "powerlaw", seed)
    with _Staging(out, chunk_edges) as files:
        src, dst = files.open("src", np.int64, (m,)), files.open("dst", np.int64, (m,))
        for index, lo, hi in _units(m, DRAW_UNIT):
            s, d = blocks.edges(_rng(seed, _EDGES, index), hi - lo, p_in)
            src.write(s)
            dst.write(d)
        src.finish()
        dst.finish()
        files.open("block", np.int64, (n,)).write_units(n, lambda _, lo, hi: np.arange(lo, hi) % num_blocks)
        if features:
            _write_node_data(files, blocks, n, features, num_classes, split, seed)
    return StreamedGraph(n, m, files.paths)


def _write_node_data(files: _Staging, blocks: _Blocks, n: int, features: int, num_classes: int,
                     split: tuple[float, ...], seed: int) -> None:
    """``y``, the masks and ``x`` (see the module docstring)."""
    bounds = np.cumsum(split)
    if math.isclose(bounds[-1], 1):
        bounds[-1] = np.inf  # shares summing to one label every node, whatever the rounding

    def part(index: int, lo: int, hi: int) -> np.ndarray:
        """Which of train/valid/test (0, 1, 2) each node is in; 3: none."""
        return np.searchsorted(bounds, _rng(seed, _SPLIT, index).random(hi - lo), side="right")

    def labels(index: int, lo: int, hi: int) -> np.ndarray:
        return np.where(part(index, lo, hi) < len(MASKS), np.arange(lo, hi) % blocks.count % num_classes, -1)

    files.open("y", np.int64, (n,)).write_units(n, labels)
    for i, name in enumerate(MASKS):
        files.open(name, np.bool_, (n,)).write_units(n, lambda index, lo, hi, i=i: part(index, lo, hi) == i)

    # Centroids a fixed number of noise deviations apart whatever the width, as synthetic.mag_like's.
    layout = _rng(seed, _LAYOUT, 1)
    centroids = layout.standard_normal((num_classes, features), dtype=np.float32)
    centroids *= np.float32(SEPARATION / math.sqrt(2 * features))
    rows = max(1, DRAW_UNIT // features)

    def x(index: int, lo: int, hi: int) -> np.ndarray:
        noise = _rng(seed, _NOISE, index).standard_normal((hi - lo, features), dtype=np.float32)
        return noise + centroids[np.arange(lo, hi) % blocks.count % num_classes]

    files.open("x", np.float32, (n, features)).write_units(n, x, rows)


class _Blocks:
    """The planted blocks, all as functions of node ids: block ``b`` holds the nodes
    ``b + count * k`` for ``k < size[b]``, so blocks interleave and node order says nothing
    about them.

    With ``powerlaw``, node ``k`` of a block is picked by inverse-CDF sampling of Zipf-like
    ranks: rank ``r = floor(size * u**gamma)`` for uniform ``u``, ``gamma = alpha/(alpha-1)``,
    gives rank ``r`` probability ~ ``r**(-1/alpha)``, so degrees have a Pareto tail of index
    ``alpha``. Ranks map to ``k`` by ``(r * mult + offset) mod size`` (``mult`` coprime to
    ``size``: a permutation), one offset per block and end of the edge so that in- and
    out-hubs differ and each seed has its own.
    """

    def __init__(self, n: int, count: int, powerlaw: bool, seed: int):
        self.n, self.count, self.powerlaw = n, count, powerlaw
        self.size = (n - np.arange(count) + count - 1) // count
        self.gamma = PARETO_ALPHA / (PARETO_ALPHA - 1)
        # Block sizes take at most two values (n // count and one more): one multiplier each.
        mult = {int(s): _coprime_near(int(s), _SPREAD) for s in np.unique(self.size)}
        self.mult = np.array([mult[int(s)] for s in self.size], dtype=np.int64)
        self.offset = np.floor(_rng(seed, _LAYOUT, 0).random((2, count)) * self.size).astype(np.int64)

    def edges(self, rng: np.random.Generator, count: int, p_in: float) -> tuple[np.ndarray, np.ndarray]:
        """``count`` edges drawn from ``rng`` (see :func:`write_sbm`)."""
        any_node = rng.integers(0, self.n, count)
        same = rng.random(count) < p_in
        hop = rng.integers(1, self.count, count) if self.count > 1 else np.zeros(count, np.int64)
        u_dst = rng.random(count)
        src_block = any_node % self.count
        # The source's block is that of a uniform node: blocks are hit in proportion to their size.
        src = self._pick(src_block, rng.random(count), 0) if self.powerlaw else any_node
        dst_block = np.where(same, src_block, (src_block + hop) % self.count)
        dst = self._pick(dst_block, u_dst, 1)
        loop = dst == src
        size = self.size[dst_block[loop]]
        dst[loop] = dst_block[loop] + self.count * ((dst[loop] // self.count + 1) % size)
        return src, dst

    def _pick(self, block: np.ndarray, u: np.ndarray, end: int) -> np.ndarray:
        """One node of each ``block`` from uniforms ``u``; ``end`` 0: source, 1: target."""
        size = self.size[block]
        if self.powerlaw:
            rank = np.minimum(np.floor(size * u**self.gamma).astype(np.int64), size - 1)
            k = (rank * self.mult[block] + self.offset[end, block]) % size
        else:
            k = np.minimum(np.floor(u * size).astype(np.int64), size - 1)
        return block + self.count * k


def _coprime_near(size: int, fraction: float) -> int:
    """The least integer >= ``fraction * size`` (and >= 1) coprime to ``size``."""
    mult = max(1, math.ceil(fraction * size))
    while math.gcd(mult, size) != 1:
        mult += 1
    return mult


class _NpyFile:
    """One ``.npy`` file written front to back under a temporary name: the header for the
    final shape first, then the values in order. :meth:`finish` checks that exactly that
    many values came and closes the file; :class:`_Staging` renames it into place."""

    def __init__(self, path: Path, dtype: type, shape: tuple[int, ...], buffer_values: int):
        self.path, self.dtype, self.shape = path, np.dtype(dtype), shape
        fd, self.tmp = _create_temp(path)
        self.file = os.fdopen(fd, "wb", buffering=max(1 << 16, buffer_values * self.dtype.itemsize))
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(self.file, header)
        self.rows = 0

    def write(self, rows: np.ndarray) -> None:
        """Append ``rows`` (their first axis continues the file's first axis)."""
        self.file.write(np.ascontiguousarray(rows, dtype=self.dtype).data)
        self.rows += len(rows)

    def write_units(self, n: int, make: Callable[[int, int, int], np.ndarray], unit: int = DRAW_UNIT) -> None:
        """Write all ``n`` rows as ``make(unit_index, lo, hi)`` for consecutive ``unit``-row
        spans, then :meth:`finish`."""
        for index, lo, hi in _units(n, unit):
            self.write(make(index, lo, hi))
        self.finish()

    def finish(self) -> None:
        if self.file.closed:
            return
        if self.rows != self.shape[0]:
            raise RuntimeError(f"{self.path.name}: {self.rows} rows written for a shape of {self.shape}")
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()


class _Staging:
    """The files of one graph: opened under temporary names, renamed into place together
    when the ``with`` block ends normally, deleted if it raises."""

    def __init__(self, out: Path, buffer_values: int):
        self.out, self.buffer_values = out, buffer_values
        self.files: dict[str, _NpyFile] = {}

    @property
    def paths(self) -> dict[str, Path]:
        return {name: f.path for name, f in self.files.items()}

    def open(self, name: str, dtype: type, shape: tuple[int, ...]) -> _NpyFile:
        self.files[name] = f = _NpyFile(self.out / f"{name}.npy", dtype, shape, self.buffer_values)
        return f

    def __enter__(self) -> _Staging:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        try:
            if kind is None:
                for f in self.files.values():
                    f.finish()
                for f in self.files.values():
                    os.replace(f.tmp, f.path)
        finally:
            for f in self.files.values():
                f.file.close()
                Path(f.tmp).unlink(missing_ok=True)
        _fsync_dir(self.out)


def _units(total: int, unit: int) -> Iterator[tuple[int, int, int]]:
    """``(index, lo, hi)`` of the consecutive ``unit``-long spans covering ``range(total)``."""
    for index, lo in enumerate(range(0, total, unit)):
        yield index, lo, min(lo + unit, total)


def _rng(seed: int, stream: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream, index])


def _check_count(name: str, value: int, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise GraphError(f"{name} must be an integer >= {least}, got {value!r}")
