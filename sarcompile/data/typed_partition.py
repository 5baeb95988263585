"""Partitioning a :class:`~sarcompile.graph.hetero.HeteroGraph`: every node type across all parts.

The assignment comes from one partitioner run on the homogeneous view (all nodes in one
range, all relations' edges together). METIS balances the node count only, and a type
clustered in the graph can land on few parts, so a pass then balances every node type
on its own (:func:`balance_types`, what DGL asks of METIS with ``balance_ntypes``;
pymetis passes METIS one balance constraint only): nodes move out of a part with too
many of their type to the part where most of their neighbours are, among those with
room. Each relation is then split exactly as a one-type graph is
(:func:`sarcompile.graph.shard.split_graph`, with the source type's assignment for its
sources), so a worker's relation is an ordinary shard whose halo rows are the source
type's rows, and the runtime's exchange serves it unchanged.

A typed part file holds ``{"global_ids": {type: ids}, "node_data": {type: {name: rows}},
"relations": {key: part}}``; the manifest records per type the node count and node
tensors, per relation the edge count, halo sizes and edge cut (``Manifest.node_types``,
``Manifest.edge_types``), and its ``halo_sizes`` sum the relations'. Writing, locking,
checksums and validation are :mod:`sarcompile.data.part_files`' and :mod:`sarcompile.data.validate`'s;
reading a typed part back is :mod:`sarcompile.data.loading`'s.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Callable

import torch

from sarcompile.errors import GraphError, PartitionError
from sarcompile.graph.graph import Graph
from sarcompile.graph.hetero import HeteroGraph, relation_key
from sarcompile.graph.shard import PartData, local_rows, split_graph
from sarcompile.data.assign import METHODS, _check_num_parts, _contiguous, _given_assignment, _metis
from sarcompile.data.manifest import Manifest, PartInfo, _hash_tensor, describe_node_data, now, part_self_loops
from sarcompile.data.node_ids import check_ids
from sarcompile.data.part_files import write_directory
from sarcompile.data.validate import check_node_data, check_node_tensors

# How far above an even share of its type a part may be after balancing (METIS's own
# default imbalance is 3% of the node count).
BALANCE_SLACK = 0.05

__all__ = ["balance_types", "assign_typed", "partition_typed", "typed_graph_sha256"]


def assign_typed(
    g: HeteroGraph, num_parts: int, method: str | dict[str, torch.Tensor] = "metis", seed: int = 0
) -> dict[str, torch.Tensor]:
    """The part of every node, per type: ``{type: LongTensor of num_nodes(type) part ids}``.

    * ``"metis"``: METIS on the homogeneous view, each node type balanced across parts
      (a type with no nodes adds no constraint);
    * ``"random"``: every node uniformly at random, reproducible from ``seed``;
    * ``"contiguous"``: each type cut into ``num_parts`` equal runs of ids;
    * a dict of per-type tensors: that assignment, checked.
    """
    _check_num_parts(num_parts)
    if isinstance(method, dict):
        missing = [t for t in g.node_types if t not in method]
        if missing:
            raise PartitionError(f"the given assignment has no part ids for node types {missing}")
        return {t: _given_assignment(torch.as_tensor(method[t]), g.num_nodes(t), num_parts) for t in g.node_types}
    if isinstance(method, torch.Tensor):
        raise PartitionError("a typed graph's assignment is a dict of per-type part-id tensors, not one tensor")
    if method not in METHODS:
        raise PartitionError(f"unknown partition method {method!r}; choose one of {', '.join(METHODS)}")
    if num_parts == 1:
        return {t: torch.zeros(g.num_nodes(t), dtype=torch.long) for t in g.node_types}
    if method == "contiguous":
        return {t: _contiguous(g.num_nodes(t), num_parts) for t in g.node_types}
    if method == "random":
        gen = torch.Generator().manual_seed(seed)
        return {t: torch.randint(num_parts, (g.num_nodes(t),), generator=gen) for t in g.node_types}
    homogeneous = g.to_homogeneous()
    parts = balance_types(homogeneous, _metis(homogeneous, num_parts, seed), g.node_type_ids(), num_parts)
    return dict(zip(g.node_types, parts.split([g.num_nodes(t) for t in g.node_types])))


def balance_types(g: Graph, parts: torch.Tensor, types: torch.Tensor, num_parts: int,
                  slack: float = BALANCE_SLACK) -> torch.Tensor:
    """``parts`` with every node type's count per part at most ``ceil(n_t / N * (1 +
    slack))``: the excess of a part moves, best gain first, to the parts with room, where
    a node's gain is its neighbours in the new part minus those in the old (edges either
    way, as METIS counts them). A new tensor; ``parts`` is kept."""
    parts = parts.clone()
    keep = g.src != g.dst
    ends = torch.cat([g.src[keep], g.dst[keep]]), torch.cat([g.dst[keep], g.src[keep]])
    for t in torch.unique(types).tolist():
        of_type = torch.nonzero(types == t).flatten()
        cap = math.ceil(of_type.numel() / num_parts * (1 + slack))
        sizes = torch.bincount(parts[of_type], minlength=num_parts)
        if int(sizes.max()) <= cap:
            continue
        # neighbours of each node of this type in each part (dense [n_t, N]: N is small)
        row = torch.full((g.num_nodes,), -1, dtype=torch.long)
        row[of_type] = torch.arange(of_type.numel())
        hit = row[ends[0]] >= 0
        links = torch.zeros((of_type.numel(), num_parts), dtype=torch.long)
        links.index_put_((row[ends[0][hit]], parts[ends[1][hit]]), torch.ones(int(hit.sum()), dtype=torch.long),
                         accumulate=True)
        for p in torch.argsort(sizes, descending=True).tolist():
            excess = int(sizes[p]) - cap
            if excess <= 0:
                break
            members = torch.nonzero(parts[of_type] == p).flatten()
            for q in torch.argsort(sizes).tolist():
                room = cap - int(sizes[q])
                if q == p or room <= 0 or excess <= 0:
                    continue
                take = min(room, excess)
                gain = links[members, q] - links[members, p]
                chosen = members[torch.argsort(gain, descending=True, stable=True)[:take]]
                parts[of_type[chosen]] = q
                members = members[~torch.isin(members, chosen)]
                sizes[q] += take
                sizes[p] -= take
                excess -= take
    return parts


def _check_typed_node_data(g: HeteroGraph, node_data: dict | None, allow_nonfinite: bool) -> dict[str, dict]:
    """Per-type node tensors, detached on the CPU, checked as one type's are."""
    checked: dict[str, dict[str, torch.Tensor]] = {t: {} for t in g.node_types}
    for ntype, tensors in (node_data or {}).items():
        if ntype not in checked:
            raise GraphError(f"node_data has a node type {ntype!r} the graph does not have ({list(g.node_types)})")
        if not isinstance(tensors, dict):
            raise GraphError(f"node_data[{ntype!r}] must be a dict of name -> tensor, got {type(tensors).__name__} "
                             "(a typed graph takes node_data={'paper': {'x': X, ...}})")
        where = f"node_data[{ntype!r}]"
        checked[ntype] = check_node_tensors(tensors, g.num_nodes(ntype), where, f"type {ntype!r}")
        check_node_data(checked[ntype], allow_nonfinite=allow_nonfinite, where=where)
    return checked


def partition_typed(
    g: HeteroGraph,
    num_parts: int,
    out_dir: str | os.PathLike,
    node_data: dict[str, dict[str, torch.Tensor]] | None = None,
    method: str | dict[str, torch.Tensor] = "metis",
    seed: int = 0,
    name: str = "graph",
    allow_nonfinite: bool = False,
    node_ids: dict[str, Any] | None = None,
) -> Manifest:
    """:func:`sarcompile.partition` of a typed graph (see the module docstring)."""
    _check_num_parts(num_parts)
    data = _check_typed_node_data(g, node_data, allow_nonfinite)
    user_ids = None if node_ids is None else _check_typed_ids(g, node_ids)
    assignment = assign_typed(g, num_parts, method, seed)
    # Per type: its nodes in each part, numbered as split_graph numbers them.
    ids = {}
    for t, a in assignment.items():
        order, counts, _, _ = local_rows(a, num_parts)
        ids[t] = [rows.clone() for rows in order.split(counts.tolist())]  # a view would save all of `order`
    relations = {
        rel: split_graph(rg, assignment[rel[2]], num_parts, None, assignment[rel[0]] if rg.bipartite else None)
        for rel, rg in g.items()
    }
    payloads = []
    for r in range(num_parts):
        rels = {relation_key(rel): _without_nodes(parts[r]) for rel, parts in relations.items()}
        payload = {
            "global_ids": {t: ids[t][r] for t in g.node_types},
            "node_data": {t: {k: v[ids[t][r]].clone() for k, v in data[t].items()} for t in g.node_types},
            "relations": rels,
        }
        payloads.append((payload, _info(g, relations, ids, r, num_parts)))
    halos = {rel: [[len(parts[q].send_index[r]) for q in range(num_parts)] for r in range(num_parts)]
             for rel, parts in relations.items()}
    cuts = {rel: int((assignment[rel[0]][rg.src] != assignment[rel[2]][rg.dst]).sum()) for rel, rg in g.items()}

    def manifest(infos: list[PartInfo]) -> Manifest:
        return Manifest(
            num_parts=num_parts,
            num_nodes=g.num_nodes(),
            num_edges=g.num_edges(),
            method="given" if isinstance(method, dict) else method,
            seed=seed,
            name=name,
            parts=infos,
            halo_sizes=[[sum(h[r][q] for h in halos.values()) for q in range(num_parts)] for r in range(num_parts)],
            edge_cut=sum(cuts.values()),
            node_data={},
            created=now(),
            graph_sha256=typed_graph_sha256(g, data),
            node_types={t: {"num_nodes": g.num_nodes(t), "node_data": describe_node_data(data[t])}
                        for t in g.node_types},
            edge_types={relation_key(rel): {"num_edges": rg.num_edges, "halo_sizes": halos[rel],
                                            "edge_cut": cuts[rel]} for rel, rg in g.items()},
        )

    return write_directory(Path(out_dir), payloads, manifest, user_ids)


def _check_typed_ids(g: HeteroGraph, node_ids: Any) -> dict[str, Any]:
    """``node_ids`` per node type (the types that have ids), each checked as one id per node."""
    if not isinstance(node_ids, dict) or not set(node_ids) <= set(g.node_types):
        given = sorted(node_ids) if isinstance(node_ids, dict) else type(node_ids).__name__
        raise GraphError(f"node_ids of a typed graph is a dict by node type ({', '.join(g.node_types)}), got {given}")
    return {t: check_ids(ids, g.num_nodes(t), f"node_ids[{t!r}]") for t, ids in node_ids.items()}


def _without_nodes(part: PartData) -> dict:
    """A relation's part as saved: its destination ids and node data live with the type."""
    saved = part.to_dict()
    del saved["global_ids"], saved["node_data"]
    return saved


def _info(g: HeteroGraph, relations: dict, ids: dict, r: int, num_parts: int) -> Callable[[int], PartInfo]:
    """Part ``r``'s manifest entry: its sizes per type and per relation (what a plan needs),
    and their sums."""
    sizes = {}
    for rel, parts in relations.items():
        sizes[relation_key(rel)] = {
            "num_edges": parts[r].edge_ids.numel(),
            "self_loops": 0 if g[rel].bipartite else part_self_loops(parts[r], r),
            "block_edges": torch.bincount(parts[r].edge_src_part, minlength=num_parts).tolist(),
        }
    return lambda rank: PartInfo(
        file="", sha256="", bytes=0,
        num_nodes=sum(ids[t][r].numel() for t in g.node_types),
        num_edges=sum(s["num_edges"] for s in sizes.values()),
        self_loops=sum(s["self_loops"] for s in sizes.values()),
        block_edges=[sum(s["block_edges"][q] for s in sizes.values()) for q in range(num_parts)],
        type_nodes={t: ids[t][r].numel() for t in g.node_types},
        relations=sizes,
    )


def typed_graph_sha256(g: HeteroGraph, node_data: dict[str, dict[str, torch.Tensor]]) -> str:
    """:func:`sarcompile.data.manifest.graph_sha256` for a typed graph: its types and
    counts, every relation's edges in order, and every type's node tensors."""
    h = hashlib.sha256(b"sarcompile-hetero-graph 1\n")
    h.update(json.dumps([[t, g.num_nodes(t)] for t in g.node_types]).encode())
    for rel, rg in g.items():
        h.update(json.dumps([list(rel), rg.num_edges]).encode())
        for t in (rg.src, rg.dst):
            _hash_tensor(h, t.to(torch.int64))
    for ntype in g.node_types:
        for key in sorted(node_data.get(ntype, {})):
            t = node_data[ntype][key]
            h.update(json.dumps([ntype, key, str(t.dtype), list(t.shape)]).encode())
            _hash_tensor(h, t)
    return h.hexdigest()
