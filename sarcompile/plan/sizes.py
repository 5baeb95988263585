"""The sizes of each worker's shard that a plan needs: rows, edges, halos, blocks.

A plan (:mod:`sarcompile.plan.plan`) prices every op from these numbers alone, so they come
from wherever is cheapest: a partition directory's manifest (no part file read), its part
files (manifests written before the manifest recorded the sizes), or a graph partitioned in
memory. A one-type graph gives one :class:`WorkerStats` per worker; a typed graph
(:class:`~sarcompile.graph.hetero.HeteroGraph`) one :class:`TypedWorkerStats`: rows per node type
and a :class:`WorkerStats` per relation, whose "nodes" are its destination type's rows and
whose halos are its source type's rows. Each op is priced on the stats of the graph it
aggregates over, so one set of rules serves both.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sarcompile.errors import CompileError
from sarcompile.graph.graph import Graph
from sarcompile.graph.hetero import HeteroGraph, HeteroShard, Relation, parse_relation_key, relation_key
from sarcompile.data.typed_partition import assign_typed
from sarcompile.data.part_files import read_typed
from sarcompile.data.assign import assign
from sarcompile.data.manifest import part_self_loops, read_manifest
from sarcompile.data.part_files import read_part
from sarcompile.graph.shard import PartData, ShardGraph, split_graph

__all__ = ["WorkerStats", "TypedWorkerStats", "worker_stats", "shard_stats"]


@dataclass
class WorkerStats:
    """The sizes of one worker's shard that its memory depends on (of one relation, in a
    typed graph: ``nodes`` are then its destination type's rows)."""

    nodes: int
    edges: int  # in-edges of its nodes
    self_loops: int
    halo: list[int]  # rows received from each worker per aggregation (0 for itself)
    block_edges: list[int]  # of its in-edges, how many come from each worker's nodes
    node_data_bytes: int = 0  # the node tensors its part file holds (features, labels, masks)

    def largest_block(self, rank: int) -> int:
        """Edges of its largest block, counting the local one as it is once self-loops
        are replaced by one per node (as GCN and GAT do), whichever is larger."""
        local = self.block_edges[rank] - self.self_loops + self.nodes
        return max(max(self.block_edges, default=0), local)


@dataclass
class TypedWorkerStats:
    """One worker's share of a typed graph: its rows of each node type, and per relation
    the sizes of its shard of that relation."""

    nodes: dict[str, int]
    relations: dict[Relation, WorkerStats]
    num_global_nodes: dict[str, int]  # each type's nodes in the whole graph
    node_data_bytes: int = 0


def shard_stats(part: PartData, rank: int, halo: list[int], loops: bool = True) -> WorkerStats:
    """The sizes of one part as :func:`~sarcompile.graph.shard.split_graph` cut it; ``halo[q]``
    the rows it receives from part ``q``; ``loops``: whether self-loops can occur (not on
    a relation between two types)."""
    return WorkerStats(
        part.global_ids.numel(), part.edge_ids.numel(), part_self_loops(part, rank) if loops else 0, list(halo),
        torch.bincount(part.edge_src_part, minlength=len(halo)).tolist(),
        sum(t.numel() * t.element_size() for t in part.node_data.values()),
    )


def worker_stats(
    source: Any, num_parts: int | None = None, method: str | torch.Tensor | dict = "metis", seed: int = 0
) -> list[WorkerStats] | list[TypedWorkerStats]:
    """Shard sizes from a partition directory, or from partitioning a graph in memory with
    ``method`` (a partition method, or an explicit part-per-node tensor -- per type, a dict
    of them, for a typed graph)."""
    if isinstance(source, (Graph, HeteroGraph)):
        if num_parts is None:
            raise CompileError("plan(graph, num_parts=N): give the number of workers to plan for")
        if isinstance(source, HeteroGraph):
            return _typed_from_graph(source, num_parts, method, seed)
        return _from_graph(source, num_parts, method, seed)
    if not isinstance(source, (str, os.PathLike)):
        raise CompileError(
            f"plan() takes a partition directory or a whole Graph / HeteroGraph, not a {type(source).__name__}"
            + (" (one worker's shard): give the partition directory it was loaded from"
               if isinstance(source, (ShardGraph, HeteroShard)) else "")
        )
    manifest = read_manifest(Path(source))
    if manifest.typed:
        if all(p.relations is not None for p in manifest.parts):  # every worker plans: read no part file
            return _typed_from_manifest(manifest)
        return [_typed_from_part(manifest, r, *read_typed(source, manifest, r)[1:]) for r in range(manifest.num_parts)]
    if all(p.block_edges is not None for p in manifest.parts):  # every worker plans: read no part file
        return _from_manifest(manifest)
    parts = [read_part(source, manifest, r) for r in range(manifest.num_parts)]
    return [shard_stats(part, r, manifest.halo_sizes[r]) for r, part in enumerate(parts)]


def _from_graph(g: Graph, num_parts: int, method: str | torch.Tensor, seed: int) -> list[WorkerStats]:
    assignment = method if isinstance(method, torch.Tensor) else assign(g, num_parts, method, seed)
    parts = split_graph(g, assignment, num_parts)
    return [shard_stats(part, r, _halo(parts, r)) for r, part in enumerate(parts)]


def _halo(parts: list[PartData], r: int) -> list[int]:
    """Rows part ``r`` receives from each part: what each keeps to send it."""
    return [len(parts[q].send_index[r]) for q in range(len(parts))]


def _typed_from_graph(g: HeteroGraph, num_parts: int, method: str | dict, seed: int) -> list[TypedWorkerStats]:
    assignment = assign_typed(g, num_parts, method, seed)
    counts = {t: torch.bincount(a, minlength=num_parts).tolist() for t, a in assignment.items()}
    relations = {
        rel: split_graph(rg, assignment[rel[2]], num_parts, None, assignment[rel[0]] if rg.bipartite else None)
        for rel, rg in g.items()
    }
    return [
        TypedWorkerStats(
            {t: counts[t][r] for t in g.node_types},
            {rel: shard_stats(parts[r], r, _halo(parts, r), not g[rel].bipartite) for rel, parts in relations.items()},
            {t: g.num_nodes(t) for t in g.node_types},
        )
        for r in range(num_parts)
    ]


def _row_bytes(described: dict[str, dict[str, Any]]) -> int:
    """Bytes of one node's row of the node tensors a manifest describes."""
    return sum(math.prod(d["shape"]) * torch.empty(0, dtype=getattr(torch, d["dtype"])).element_size()
               for d in described.values())


def _from_manifest(manifest) -> list[WorkerStats]:
    row_bytes = _row_bytes(manifest.node_data)
    return [
        WorkerStats(p.num_nodes, p.num_edges, p.self_loops, list(manifest.halo_sizes[r]), list(p.block_edges),
                    p.num_nodes * row_bytes)
        for r, p in enumerate(manifest.parts)
    ]


def _typed_from_manifest(manifest) -> list[TypedWorkerStats]:
    out = []
    for r, p in enumerate(manifest.parts):
        relations = {}
        for key, info in manifest.edge_types.items():
            rel, sizes = parse_relation_key(key), p.relations[key]
            relations[rel] = WorkerStats(p.type_nodes[rel[2]], sizes["num_edges"], sizes["self_loops"],
                                         list(info["halo_sizes"][r]), list(sizes["block_edges"]))
        out.append(TypedWorkerStats(dict(p.type_nodes), relations, _global_nodes(manifest),
                                    _typed_data_bytes(manifest, p.type_nodes)))
    return out


def _typed_data_bytes(manifest, type_nodes: dict[str, int]) -> int:
    return sum(n * _row_bytes(manifest.node_types[t]["node_data"]) for t, n in type_nodes.items())


def _typed_from_part(manifest, rank: int, saved: dict, parts: dict[Relation, PartData]) -> TypedWorkerStats:
    """A typed worker's sizes from its part file (a manifest without per-relation sizes)."""
    ids = saved["global_ids"]
    relations = {
        rel: shard_stats(part, rank, manifest.edge_types[relation_key(rel)]["halo_sizes"][rank], rel[0] == rel[2])
        for rel, part in parts.items()
    }
    nodes = {t: v.numel() for t, v in ids.items()}
    return TypedWorkerStats(nodes, relations, _global_nodes(manifest), _typed_data_bytes(manifest, nodes))


def _global_nodes(manifest) -> dict[str, int]:
    return {t: info["num_nodes"] for t, info in manifest.node_types.items()}
