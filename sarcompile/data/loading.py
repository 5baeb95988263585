"""A worker's part of a partition directory loaded, the whole graph reassembled from
all parts, and the user's own node ids read back.

A worker memory-maps its part file (copy-on-write): the edge lists are read once into
its shard and unmapped, and only the node rows it uses become resident. Its node data is
checked again as it was when partitioned (:mod:`sarcompile.data.validate`), since a
partition written by an older version may hold NaN features or float labels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sarcompile.errors import PartitionError
from sarcompile.graph.graph import Graph
from sarcompile.graph.hetero import HeteroGraph, HeteroShard, parse_relation_key, relation_key
from sarcompile.graph.shard import ShardGraph
from sarcompile.dist.memory import release_free
from sarcompile.data.manifest import Manifest, read_manifest
from sarcompile.data.node_ids import open_ids
from sarcompile.data.part_files import _as_part, _load_part, read_part, read_typed
from sarcompile.data.validate import check_node_data

__all__ = ["Partition", "load_partition", "load_whole_graph", "read_node_ids"]


@dataclass
class Partition:
    """One worker's share of a partitioned graph, as :func:`load_partition` returns it.
    Of a typed partition: ``graph`` is a :class:`~sarcompile.graph.hetero.HeteroShard`, and
    ``node_data`` and ``global_ids`` are dicts by node type (``node_data["paper"]["x"]``).
    The graph's frames hold the node data, as a DGL script's graph does (``graph.ndata["x"]``;
    typed, ``graph.nodes["paper"].data["x"]``; see :mod:`sarcompile.graph.frames`): a model
    reading them runs as ``model(part.graph)``.

    Example:

    >>> import tempfile
    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> d = tempfile.mkdtemp()
    >>> _ = sc.partition(g, 2, d, node_data={"x": torch.ones(3, 2)})
    >>> parts = [sc.load_partition(d, rank=r, world_size=2) for r in range(2)]
    >>> sum(p.graph.num_nodes for p in parts)   # every node in exactly one part
    3
    """

    graph: ShardGraph | HeteroShard
    node_data: dict[str, Any] = field(repr=False)  # local rows, local order
    global_ids: torch.Tensor | dict[str, torch.Tensor] = field(repr=False)  # original id of every local row
    rank: int
    manifest: Manifest = field(repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.graph, HeteroShard):
            for t, data in self.node_data.items():
                self.graph.nodes[t].data.update(data)
        else:
            self.graph.ndata.update(self.node_data)


def load_partition(
    out_dir: str | os.PathLike,
    rank: int | None = None,
    world_size: int | None = None,
    allow_nonfinite: bool = False,
) -> Partition:
    """Load worker ``rank``'s part of the partition in ``out_dir``.

    ``rank`` and ``world_size`` default to torch.distributed's when a process group is
    up, else to 0 and 1. The part file is checked against the manifest's checksum and
    halo sizes before it is used, and its node data as :func:`partition` checks it
    (a partition written by an older version may hold NaN features or float labels):
    a :class:`PartitionError` names the node and column.

    Example:

    >>> import tempfile
    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> d = tempfile.mkdtemp()
    >>> _ = sc.partition(g, 2, d, node_data={"x": torch.arange(6.).reshape(3, 2)})
    >>> part = sc.load_partition(d, rank=0, world_size=2)   # in a worker: sc.load_partition(d)
    >>> part.graph.num_nodes == part.node_data["x"].shape[0]
    True
    """
    rank, world_size = _rank_and_world(rank, world_size)
    manifest = read_manifest(out_dir)
    if manifest.num_parts != world_size:
        raise PartitionError(
            f"partition '{out_dir}' has {manifest.num_parts} parts but this run has {world_size} workers: "
            f"start {manifest.num_parts} workers in all (torchrun's --nnodes x --nproc-per-node), "
            f"or repartition with --parts {world_size}"
        )
    if not 0 <= rank < world_size:
        raise PartitionError(f"rank {rank} is outside [0, {world_size})")
    if manifest.typed:
        return load_typed(out_dir, manifest, rank, allow_nonfinite)
    part = read_part(out_dir, manifest, rank, mmap=True)
    graph = ShardGraph.from_part(part, rank, world_size, manifest.num_nodes, manifest.num_edges)
    # The part file is mapped, not read: a worker's pages are only those it touches. Its
    # edge lists were touched to build the shard, which holds copies; dropping every
    # tensor of that mapping unmaps them. The node data comes from a second mapping of
    # the same (already checked) file, so only its node-data pages become resident.
    path = Path(out_dir) / manifest.parts[rank].file
    del part
    node_data = _as_part(_load_part(path, mmap=True), path).node_data
    check_node_data(
        node_data, ids=graph.global_ids, allow_nonfinite=allow_nonfinite, error=PartitionError,
        where=f"part file '{path}': node_data", fix="re-run partition with corrected node data",
    )
    release_free()
    return Partition(graph, node_data, graph.global_ids, rank, manifest)


def load_whole_graph(out_dir: str | os.PathLike) -> tuple[Graph | HeteroGraph, dict[str, Any]]:
    """Reassemble the original graph (edges in their original order) and node tensors
    from every part of a partition directory: the single-machine reference of a run.
    A typed partition gives a :class:`~sarcompile.graph.hetero.HeteroGraph` and node tensors per type.

    Example:

    >>> import tempfile
    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> d = tempfile.mkdtemp()
    >>> _ = sc.partition(g, 2, d, node_data={"x": torch.ones(3, 2)})
    >>> whole, data = sc.load_whole_graph(d)
    >>> whole.num_nodes, whole.num_edges, list(data)
    (3, 4, ['x'])
    """
    manifest = read_manifest(out_dir)
    if manifest.typed:
        return load_whole_typed(out_dir, manifest)
    parts = [read_part(out_dir, manifest, r) for r in range(manifest.num_parts)]
    src = torch.empty(manifest.num_edges, dtype=torch.long)
    dst = torch.empty(manifest.num_edges, dtype=torch.long)
    node_data: dict[str, torch.Tensor] = {}
    for part in parts:
        src[part.edge_ids] = part.edge_src_gid
        dst[part.edge_ids] = part.global_ids[part.edge_dst_local]
        for key, rows in part.node_data.items():
            if key not in node_data:
                node_data[key] = rows.new_empty((manifest.num_nodes, *rows.shape[1:]))
            node_data[key][part.global_ids] = rows
    return Graph(src, dst, manifest.num_nodes), node_data


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    dist = torch.distributed
    running = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if running else 0
    if world_size is None:
        world_size = dist.get_world_size() if running else 1
    return rank, world_size


def load_typed(out_dir: str | os.PathLike, manifest: Manifest, rank: int, allow_nonfinite: bool) -> Partition:
    """Worker ``rank``'s share of a typed partition (see :func:`sarcompile.load_partition`)."""
    path, saved, parts = read_typed(out_dir, manifest, rank)
    ids = saved["global_ids"]
    for ntype, tensors in saved["node_data"].items():
        check_node_data(
            tensors, ids=ids[ntype], allow_nonfinite=allow_nonfinite, error=PartitionError,
            where=f"part file '{path}': node_data[{ntype!r}]", fix="re-run partition with corrected node data",
        )
    world = manifest.num_parts
    shards = {}
    for rel, part in parts.items():
        src_ids = ids[rel[0]] if rel[0] != rel[2] else None
        shards[rel] = ShardGraph.from_part(part, rank, world, manifest.node_types[rel[2]]["num_nodes"],
                                           manifest.edge_types[relation_key(rel)]["num_edges"], src_ids)
    del parts  # the file's edge lists: the shards' blocks replace them
    release_free()
    num_global = {t: info["num_nodes"] for t, info in manifest.node_types.items()}
    graph = HeteroShard(rank, world, ids, shards, num_global)
    return Partition(graph, saved["node_data"], ids, rank, manifest)


def load_whole_typed(out_dir: str | os.PathLike, manifest: Manifest) -> tuple[HeteroGraph, dict[str, dict]]:
    """The typed graph (each relation's edges in their original order) and its node
    tensors per type, from every part: the single-machine reference."""
    counts = {t: info["num_nodes"] for t, info in manifest.node_types.items()}
    edges = {parse_relation_key(k): (torch.empty(info["num_edges"], dtype=torch.long),
                                     torch.empty(info["num_edges"], dtype=torch.long))
             for k, info in manifest.edge_types.items()}
    node_data: dict[str, dict[str, torch.Tensor]] = {t: {} for t in counts}
    for r in range(manifest.num_parts):
        _, saved, parts = read_typed(out_dir, manifest, r)
        for rel, part in parts.items():
            src, dst = edges[rel]
            src[part.edge_ids] = part.edge_src_gid
            dst[part.edge_ids] = part.global_ids[part.edge_dst_local]
        for ntype, tensors in saved["node_data"].items():
            for key, rows in tensors.items():
                whole = node_data[ntype].setdefault(key, rows.new_empty((counts[ntype], *rows.shape[1:])))
                whole[saved["global_ids"][ntype]] = rows
    return HeteroGraph.from_edges(edges, counts), node_data



def read_node_ids(directory: str | os.PathLike) -> np.ndarray | dict[str, np.ndarray]:
    """The user's id of every global node id of the partition in ``directory`` (see the
    module docstring): an array memory-mapped read-only, ``ids[i]`` the id of node ``i``; a
    dict of them per node type for a typed partition (the types that have ids).

    A partition made without the user's ids, or whose id file is missing or damaged,
    raises :class:`PartitionError` saying what to do.

    Example:

    >>> import tempfile
    >>> g = sc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    >>> d = tempfile.mkdtemp()
    >>> _ = sc.partition(g, 1, d, node_ids=np.array([10**12, 7]))
    >>> sc.read_node_ids(d).tolist()
    [1000000000000, 7]
    """
    manifest = read_manifest(directory)
    if manifest.node_ids is None:
        raise PartitionError(f"partition '{directory}' was made from node ids 0..n-1 (no ids of the user's are "
                             "recorded): global node id i is the graph's node i")
    redo = "re-run sarcompile partition"
    if manifest.typed:
        return {t: open_ids(Path(directory), r, PartitionError, redo) for t, r in manifest.node_ids.items()}
    return open_ids(Path(directory), manifest.node_ids, PartitionError, redo)
