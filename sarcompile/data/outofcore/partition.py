"""``partition_files``: partition a graph given as files on disk, within a memory limit."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from sarcompile.errors import GraphError, PartitionError
from sarcompile.graph.graph import Graph
from sarcompile.data.assign import METHODS, _check_num_parts, assign
from sarcompile.data.manifest import Manifest, PartInfo, chunked_graph_sha256, describe_node_data, now
from sarcompile.data.part_files import write_locked
from sarcompile.data.rundir import lock_dir
from sarcompile.data.outofcore.adjacency import build_buckets
from sarcompile.data.outofcore.budget import Budget, parse_size
from sarcompile.data.node_ids import Ids, kind_of
from sarcompile.data.outofcore.convert import ScratchWriter, csv_edges, csv_own_edges
from sarcompile.data.outofcore.multilevel import multilevel_partition
from sarcompile.data.outofcore.sources import DiskArray, EdgeFiles, open_edges
from sarcompile.data.outofcore.writer import PartWriter

__all__ = ["MULTILEVEL", "default_memory_limit", "locked_scratch", "partition_files", "start_budget", "write_partition"]

MULTILEVEL = "metis-multilevel"  # the manifest's method when METIS saw the coarsened graph
SCRATCH_PREFIX = ".scratch-"


def default_memory_limit() -> int:
    """Three quarters of the memory the kernel says is available now."""
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024 * 3 // 4
    except (OSError, KeyError, ValueError):
        return 8 * 2**30


def partition_files(
    edges: EdgeFiles | tuple[str | os.PathLike, str | os.PathLike] | str | os.PathLike,
    num_parts: int,
    out_dir: str | os.PathLike,
    node_data: dict[str, str | os.PathLike] | None = None,
    *,
    num_nodes: int | None = None,
    method: str = "metis",
    seed: int = 0,
    name: str = "graph",
    memory_limit: int | str | None = None,
    scratch_dir: str | os.PathLike | None = None,
    allow_nonfinite: bool = False,
    own_ids: bool = False,
    log: Callable[[str], None] = lambda s: None,
) -> Manifest:
    """Partition the graph of ``edges`` and the node tensors in the ``.npy`` files
    ``node_data`` (name -> path) into ``num_parts`` part files under ``out_dir``, holding
    at most ``memory_limit`` bytes of resident memory (the whole process, e.g. ``"8GiB"``;
    default: 3/4 of what is available). ``edges`` is a pair of ``.npy`` paths (source and
    destination ids), the path of an edge CSV (two integer columns, optionally under a
    ``src,dst`` header; converted in chunks), both with ``num_nodes``, or what
    :func:`.sources.open_edges` returns. With ``own_ids=True`` (a CSV, without
    ``num_nodes``) the CSV's ids are the user's own, integers or strings: they are
    numbered ``0..n-1`` in sorted order (see :func:`.convert.csv_own_edges`), the node
    data's rows follow that order, and the ids are kept in the directory
    (:mod:`sarcompile.data.node_ids`)::

        sc.partition_files(("src.npy", "dst.npy"), 8, "parts8", {"x": "x.npy", "y": "y.npy"},
                           num_nodes=1_000_000, memory_limit="1GiB")

    The directory is what :func:`sarcompile.partition` writes, locked the same way while
    this runs. ``method`` is as there; with ``"metis"``, METIS gets the whole graph when
    that fits the limit (the very assignment :func:`sarcompile.partition` makes, recorded
    as ``"metis"``), and otherwise the graph coarsened out of core until it fits (recorded
    as ``"metis-multilevel"``; see :mod:`.multilevel`). Scratch files (about three times
    the edge files, plus the node data once) go to ``scratch_dir``, by default a hidden
    folder in ``out_dir``, and are deleted at the end.

    Example:

    >>> import os, tempfile, numpy as np
    >>> d = tempfile.mkdtemp()
    >>> np.save(os.path.join(d, "src.npy"), np.array([0, 1, 2, 2])); np.save(os.path.join(d, "dst.npy"), np.array([1, 2, 0, 1]))
    >>> manifest = sc.partition_files((os.path.join(d, "src.npy"), os.path.join(d, "dst.npy")), 2, os.path.join(d, "parts"),
    ...                               num_nodes=3, memory_limit="1GiB")
    >>> manifest.num_parts, manifest.num_edges
    (2, 4)
    """
    csv = not isinstance(edges, (EdgeFiles, tuple))
    if own_ids and (not csv or num_nodes is not None):
        raise GraphError("own_ids=True numbers the node ids of an edge CSV itself: give the CSV's path and no "
                         "num_nodes" if csv else "own_ids=True applies to an edge CSV; .npy edges hold ids 0..N-1")
    if not (own_ids or isinstance(edges, EdgeFiles)) and num_nodes is None:
        raise GraphError("partition_files(edge files, ...) needs num_nodes=N (node ids are 0..N-1), or "
                         "own_ids=True for a CSV of the user's own ids")
    if isinstance(edges, tuple):
        edges = open_edges(*edges, num_nodes)
    budget = start_budget(num_parts, method, memory_limit)
    n = edges.num_nodes if isinstance(edges, EdgeFiles) else num_nodes
    arrays = None if own_ids else _open_node_data(node_data or {}, n)  # own ids: once they are counted
    with locked_scratch(Path(out_dir), scratch_dir) as scratch:
        ids = None
        if own_ids:
            edges, ids = csv_own_edges(edges, ScratchWriter(scratch, budget.chunk_edges))
            log(f"{edges.num_nodes} distinct node ids ({kind_of(ids.dtype)}s) numbered in sorted order")
            arrays = _open_node_data(node_data or {}, edges.num_nodes)
        elif csv:
            edges = csv_edges(edges, n, ScratchWriter(scratch, budget.chunk_edges))
        return write_partition(edges, arrays, num_parts, Path(out_dir), scratch, budget.for_nodes(edges.num_nodes),
                               method=method, seed=seed, name=name, allow_nonfinite=allow_nonfinite, log=log,
                               node_ids=ids)


def start_budget(num_parts: int, method: str, memory_limit: int | str | None) -> Budget:
    """The run's budget, after checking the arguments every entry point shares."""
    _check_num_parts(num_parts)
    if method not in METHODS:
        raise PartitionError(f"unknown partition method {method!r}; choose one of {', '.join(METHODS)}")
    limit = default_memory_limit() if memory_limit is None else parse_size(memory_limit) \
        if isinstance(memory_limit, str) else int(memory_limit)
    return Budget.start(limit)


@contextlib.contextmanager
def locked_scratch(out: Path, scratch_dir: str | os.PathLike | None) -> Iterator[Path]:
    """``out`` locked for a partition run, and a scratch folder deleted at the end (a
    killed run's scratch in ``out`` is deleted first: holding the lock says it is over)."""
    with lock_dir(out, "partition run"):
        for stale in out.glob(f"{SCRATCH_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
        scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=scratch_dir or out))
        try:
            yield scratch
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def write_partition(
    edges: EdgeFiles, arrays: dict[str, DiskArray], num_parts: int, out: Path, scratch: Path, budget: Budget, *,
    method: str, seed: int, name: str, allow_nonfinite: bool, log: Callable[[str], None],
    node_ids: Ids | None = None,
) -> Manifest:
    """Assign, scatter and write, ``out`` being locked by the caller (see :func:`partition_files`);
    ``node_ids``: the user's ids of the nodes, kept in ``out``."""
    parts, recorded = _assign(edges, num_parts, method, seed, budget, scratch, log)
    log(f"assigned: part sizes {np.bincount(parts, minlength=num_parts).tolist()}")
    writer = PartWriter(edges, arrays, parts, num_parts, scratch, budget.chunk_edges, allow_nonfinite)
    writer.scatter()
    digest = _sha256(edges, arrays, budget.chunk_edges)
    halos = writer.halo_sizes()

    def manifest(infos: list[PartInfo]) -> Manifest:
        return Manifest(
            num_parts=num_parts, num_nodes=edges.num_nodes, num_edges=edges.num_edges, method=recorded,
            seed=seed, name=name, parts=infos, halo_sizes=halos, edge_cut=writer.edge_cut,
            node_data=describe_node_data({k: _empty(a) for k, a in arrays.items()}), created=now(),
            graph_sha256=digest,
        )

    return write_locked(out, num_parts, writer.payloads(), manifest, node_ids)


def _assign(
    edges: EdgeFiles, num_parts: int, method: str, seed: int, budget: Budget, scratch: Path,
    log: Callable[[str], None],
) -> tuple[np.ndarray, str]:
    """Every node's part, and the method the manifest records."""
    n = edges.num_nodes
    if method != "metis" or num_parts == 1 or n == 0:  # what sarcompile.partition computes, without edges
        no_edges = torch.empty(0, dtype=torch.long)
        return assign(Graph(no_edges, no_edges, n), num_parts, method, seed).numpy(), method
    if budget.in_memory_fits(n, edges.num_edges):  # as sarcompile.partition does (assign reads only edges)
        src = torch.from_numpy(edges.src.read(0, edges.num_edges).astype(np.int64))
        dst = torch.from_numpy(edges.dst.read(0, edges.num_edges).astype(np.int64))
        parts = assign(Graph(src, dst, n), num_parts, method, seed).numpy()
        return parts, method
    log(f"the whole graph does not fit METIS within {budget.limit / 2**30:.2f} GiB: coarsening out of core")
    buckets = build_buckets(edges, scratch, budget.chunk_edges, budget.bucket_entries)
    log(f"{len(buckets.files)} adjacency buckets, {buckets.num_entries} entries")
    parts = multilevel_partition(buckets.blocks, n, num_parts, budget, seed, log)
    for path in buckets.files:
        path.unlink()
    return parts, MULTILEVEL


def _open_node_data(paths: dict[str, str | os.PathLike | DiskArray], num_nodes: int) -> dict[str, DiskArray]:
    arrays = {}
    for key, path in paths.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise GraphError(f"node data names must be identifiers (x, y, train_mask), got {key!r}")
        array = path if isinstance(path, DiskArray) else DiskArray.npy(path)
        if not array.shape or array.rows != num_nodes:
            raise GraphError(
                f"node data {key!r} ('{path}') has shape {array.shape} but the graph has {num_nodes} nodes; "
                "node tensors need one row per node"
            )
        arrays[key] = array
    return arrays


def _empty(array: DiskArray) -> torch.Tensor:
    """A zero-row tensor of ``array``'s dtype and trailing shape (for the manifest's record)."""
    return torch.from_numpy(np.empty((0, *array.shape[1:]), dtype=array.dtype))


def _sha256(edges: EdgeFiles, arrays: dict[str, DiskArray], chunk_edges: int) -> str:
    """:func:`sarcompile.data.partitioning.graph_sha256` of the files, read once more in chunks."""
    def rows(array: DiskArray):
        return (torch.from_numpy(c) for _, c in array.chunks(max(1, chunk_edges * 8 // max(array.row_bytes, 1))))

    node_data = {k: (_empty(a).dtype, a.shape, rows(a)) for k, a in arrays.items()}
    return chunked_graph_sha256(edges.num_nodes, edges.num_edges, rows(edges.src), rows(edges.dst), node_data)
