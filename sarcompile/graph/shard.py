"""A worker's piece of the graph: its nodes, their in-edges, one CSR block per source partition.

Worker ``r`` owns nodes ``V_r`` (local rows ``0..n_r-1``, sorted by global id) and every
edge into them. The in-edges coming from partition ``q`` form block ``q``: its source rows
are the *halo* of ``q`` -- the sorted distinct local ids (in ``q``'s numbering) of the
``q``-nodes with an edge into ``V_r``. Block ``r`` is the local block; its source rows are
the local nodes themselves. Worker ``q`` keeps the same list as ``send_index[r]``, so both
sides agree on what travels without any handshake.

Edge tensors on a shard are in *shard order*: the edges of block 0, then block 1, ...,
each block in CSR order. ``edge_ids`` maps them back to the original edge ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sarcompile.errors import PartitionError
from sarcompile.graph.frames import FramesMixin
from sarcompile.graph.graph import Block, Graph, _no_loops_on_bipartite, cached_subset

__all__ = ["DERIVED_GRAPHS", "PartData", "ShardGraph", "local_rows", "split_graph"]

# Graph methods whose result is another graph (with its own index tensors).
DERIVED_GRAPHS = ("with_self_loops", "remove_self_loops", "plus_self_loops")


@dataclass
class PartData:
    """What the partitioner stores for one worker (plain tensors, easy to save and load).

    Edges are the in-edges of this part's nodes: the source is named by its partition,
    its local row there and its global id; the destination by its local row here.
    """

    global_ids: torch.Tensor  # [n_r] sorted
    edge_src_part: torch.Tensor  # [E_r]
    edge_src_local: torch.Tensor  # [E_r]
    edge_src_gid: torch.Tensor  # [E_r]
    edge_dst_local: torch.Tensor  # [E_r]
    edge_ids: torch.Tensor  # [E_r]
    send_index: list[torch.Tensor]  # per peer p: local rows of ours that p's edges read
    node_data: dict[str, torch.Tensor] = field(default_factory=dict)
    edge_values: torch.Tensor | None = None  # [E_r] the graph's adj_values of these edges, if it has them

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def local_rows(
    assignment: torch.Tensor, num_parts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(order, counts, starts, local)``: the nodes sorted by (part, id), the count of each
    part, where each part starts in ``order``, and every node's local row in its part
    (its rank among the part's nodes by global id)."""
    n = assignment.numel()
    order = torch.argsort(assignment * max(n, 1) + torch.arange(n))
    counts = torch.bincount(assignment, minlength=num_parts)
    starts = torch.cumsum(counts, 0) - counts
    local = torch.empty(n, dtype=torch.long)
    local[order] = torch.arange(n) - starts[assignment[order]]
    return order, counts, starts, local


def _check_assignment(assignment: Any, num_nodes: int, num_parts: int) -> torch.Tensor:
    assignment = torch.as_tensor(assignment)
    if assignment.is_floating_point():
        raise PartitionError(f"assignment must hold integer part ids, got dtype {assignment.dtype}")
    assignment = assignment.long()
    if assignment.shape != (num_nodes,):
        raise PartitionError(f"assignment must have one entry per node ({num_nodes}), got {tuple(assignment.shape)}")
    if num_nodes and (int(assignment.min()) < 0 or int(assignment.max()) >= num_parts):
        raise PartitionError(f"assignment values must lie in [0, {num_parts})")
    return assignment


def split_graph(
    g: Graph,
    assignment: torch.Tensor,
    num_parts: int,
    node_data: dict[str, torch.Tensor] | None = None,
    src_assignment: torch.Tensor | None = None,
) -> list[PartData]:
    """Cut ``g`` into ``num_parts`` pieces by ``assignment[v]`` (the part of node v).

    A bipartite ``g`` (one relation of a heterogeneous graph) needs ``src_assignment``
    too, the part of every source node: sources are then named by their local row in
    their own node set's part, which is what the source type's tensors hold there."""
    if num_parts < 1:
        raise PartitionError(f"num_parts must be >= 1, got {num_parts}")
    assignment = _check_assignment(assignment, g.num_nodes, num_parts)
    if g.bipartite != (src_assignment is not None):
        raise PartitionError("a bipartite graph is split with src_assignment (the sources' parts), another without")
    src_assignment = assignment if src_assignment is None else _check_assignment(
        src_assignment, g.num_src_nodes, num_parts)
    node_data = node_data or {}
    for name, t in node_data.items():
        if t.shape[0] != g.num_nodes:
            raise PartitionError(f"node_data[{name!r}] has {t.shape[0]} rows but the graph has {g.num_nodes} nodes")
    order, counts, starts, local = local_rows(assignment, num_parts)
    src_local = local if src_assignment is assignment else local_rows(src_assignment, num_parts)[3]

    src_part, dst_part = src_assignment[g.src], assignment[g.dst]
    # Send lists: distinct (owner, reader, row) triples over the edges that cross parts,
    # sorted, so each list comes out as the sorted halo its reader will compute.
    n = max(g.num_src_nodes, 1)
    cross = src_part != dst_part
    keys = torch.unique((src_part[cross] * num_parts + dst_part[cross]) * n + src_local[g.src[cross]])
    pair, rows = keys // n, keys % n
    pair_counts = torch.bincount(pair, minlength=num_parts * num_parts).tolist()
    send_lists = list(torch.split(rows, pair_counts))
    parts = []
    for r in range(num_parts):
        ids = order[starts[r] : starts[r] + counts[r]].clone()  # a view would save all of `order`
        eids = torch.nonzero(dst_part == r).flatten()
        send = [send_lists[r * num_parts + p].clone() for p in range(num_parts)]
        parts.append(
            PartData(
                global_ids=ids,
                edge_src_part=src_part[eids],
                edge_src_local=src_local[g.src[eids]],
                edge_src_gid=g.src[eids],
                edge_dst_local=local[g.dst[eids]],
                edge_ids=eids,
                send_index=send,
                node_data={k: v[ids].clone() for k, v in node_data.items()},
                edge_values=None if g.adj_values is None else g.adj_values[eids],
            )
        )
    return parts


class ShardGraph(FramesMixin):
    """The graph argument a model gets inside a worker (``part.graph``).

    Same surface as :class:`~sarcompile.graph.graph.Graph` for what models use
    (``num_nodes``, ``in_degrees()``, ``remove_self_loops()``), but with local rows only.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        global_ids: torch.Tensor,
        blocks: list[Block],
        send_index: list[torch.Tensor],
        edge_ids: torch.Tensor,
        num_global_nodes: int,
        edge_id_space: int,
        src_global_ids: torch.Tensor | None = None,
    ):
        self.rank, self.world_size = rank, world_size
        # A relation between two node types: its local block's sources are the source
        # type's local rows (src_global_ids), not this shard's destinations.
        self.bipartite = src_global_ids is not None
        self.src_global_ids = global_ids if src_global_ids is None else src_global_ids
        self.global_ids = global_ids
        self.blocks = blocks
        self.send_index = send_index
        # int32 where every id fits: an int64 per edge was the largest index tensor a
        # worker kept after its CSR (users index with it as with int64 ids).
        self.edge_ids = edge_ids.to(torch.int32 if edge_id_space < 2**31 else torch.int64)
        self.num_global_nodes = num_global_nodes
        # Self-loops added by with_self_loops() get edge id ``edge_id_space + global node id``.
        self.edge_id_space = edge_id_space
        self.edge_ptr = torch.cumsum(torch.tensor([0] + [b.num_edges for b in blocks]), 0).tolist()
        self._derived: dict[Any, ShardGraph] = {}  # by name, or ("subset", mask)
        self.links: dict[int, Any] = {}  # per site: the runtime's stale caches and residuals (runtime/link.py)
        # The whole graph's Graph.adj_values of the shard's edges, in shard order (None if it has none).
        self.adj_values: torch.Tensor | None = None

    @classmethod
    def single(cls, g: Graph) -> "ShardGraph":
        """A whole graph as the only shard of a one-worker world."""
        shard = cls(
            0, 1, g.global_ids, [g.block], [torch.empty(0, dtype=torch.long)], g.edge_ids[g.csr_perm], g.num_nodes,
            g.edge_id_space, g.src_global_ids if g.bipartite else None,
        )
        shard.adj_values = None if g.adj_values is None else g.adj_values[g.csr_perm]
        return shard

    @classmethod
    def from_part(
        cls, part: PartData, rank: int, world_size: int, num_global_nodes: int, num_global_edges: int,
        src_global_ids: torch.Tensor | None = None,
    ) -> "ShardGraph":
        """The shard of ``part``; ``src_global_ids``: for a bipartite relation, the global
        ids of the source type's local rows (in that type's numbering).

        The shard holds copies, never views, of ``part``'s tensors: a part read from a
        memory-mapped file can then be unmapped, and the edge pages read to build the shard
        leave the worker's resident set with it."""
        global_ids = part.global_ids.clone()
        n = global_ids.numel()
        local_src = global_ids if src_global_ids is None else src_global_ids
        # Shard order: edges sorted by (source part, destination), stable within.
        order = torch.sort(part.edge_src_part * max(n, 1) + part.edge_dst_local, stable=True).indices
        src_part = part.edge_src_part[order]
        src, dst, gid = part.edge_src_local[order], part.edge_dst_local[order], part.edge_src_gid[order]
        sizes = torch.bincount(src_part, minlength=world_size).tolist()
        blocks = []
        for q, (s, d, gq) in enumerate(zip(src.split(sizes), dst.split(sizes), gid.split(sizes))):
            if q == rank:
                col, num_src, src_gids = s, local_src.numel(), local_src
            else:
                halo, col = torch.unique(s, return_inverse=True)
                num_src = halo.numel()
                src_gids = torch.empty(num_src, dtype=torch.long)
                src_gids[col] = gq
            counts = torch.bincount(d, minlength=n)
            indptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(counts, 0)])
            blocks.append(Block(indptr, col.reshape(-1), num_src, src_gids))
        shard = cls(
            rank, world_size, global_ids, blocks, [rows.clone() for rows in part.send_index], part.edge_ids[order],
            num_global_nodes, num_global_edges, src_global_ids,
        )
        shard.adj_values = None if part.edge_values is None else part.edge_values[order].clone()
        return shard

    # -- the Graph-like surface models use ---------------------------------------------------
    @property
    def num_nodes(self) -> int:
        """Number of local nodes (rows of every node tensor on this worker)."""
        return self.global_ids.numel()

    num_dst = num_nodes

    @property
    def num_src_nodes(self) -> int:
        """Local source rows: the shard's own nodes, or for a bipartite relation the
        source type's local rows (what a source-side input such as ``spmm``'s ``x`` has)."""
        return self.src_global_ids.numel()

    @property
    def num_edges(self) -> int:
        return self.edge_ptr[-1]

    @property
    def dst_index(self) -> torch.Tensor:
        """Local destination row of every edge, in shard order."""
        if "dst_index" not in self.__dict__:
            rows = [b.row for b in self.blocks]
            self.__dict__["dst_index"] = torch.cat(rows) if rows else torch.empty(0, dtype=torch.long)
        return self.__dict__["dst_index"]

    def in_degrees(self) -> torch.Tensor:
        """Full (global) in-degree of each local node: all its in-edges live on this shard."""
        if "_in_degrees" not in self.__dict__:
            # From each block's CSR offsets: no per-edge index made (or kept) for it.
            degrees = torch.zeros(self.num_nodes, dtype=torch.long)
            for b in self.blocks:
                degrees[: b.num_dst] += b.indptr[1:] - b.indptr[:-1]
            self.__dict__["_in_degrees"] = degrees
        return self.__dict__["_in_degrees"].clone()  # a copy: the cached one must survive in-place edits

    @property
    def loop_mask(self) -> torch.Tensor:
        """Whether each edge is a self-loop, in shard order (loops only sit in the local block)."""
        if "loop_mask" not in self.__dict__:
            mask = torch.zeros(self.num_edges, dtype=torch.bool)
            local = self.blocks[self.rank]
            mask[self.edge_ptr[self.rank] : self.edge_ptr[self.rank + 1]] = local.col == local.row
            self.__dict__["loop_mask"] = mask
        return self.__dict__["loop_mask"]

    def remove_self_loops(self) -> "ShardGraph":
        """Without edges ``v -> v`` (cached). Self-loops only ever sit in the local block,
        so the halos and send lists stay the same."""
        return self._local_loops(("no_loops", None), drop=True, add=False)

    def with_self_loops(self, upto: int | None = None) -> "ShardGraph":
        """Exactly one self-loop per node (with ``upto``, per node of a smaller global id),
        as :meth:`Graph.with_self_loops` (cached)."""
        return self._local_loops(("one_loop", upto), drop=True, add=True)

    def plus_self_loops(self, upto: int | None = None) -> "ShardGraph":
        """Every edge kept and one more self-loop per node (with ``upto``, per node of a
        smaller global id), as :meth:`Graph.plus_self_loops` (cached)."""
        return self._local_loops(("plus_loop", upto), drop=False, add=True)

    def _local_loops(self, key: Any, drop: bool, add: bool) -> "ShardGraph":
        """Rebuild the local block: without its self-loops if ``drop``, then with one more
        per node if ``add`` (ids as :meth:`Graph.with_self_loops` gives them)."""
        if key in self._derived:
            return self._derived[key]
        _no_loops_on_bipartite(self)
        local = self.blocks[self.rank]
        lo, hi = self.edge_ptr[self.rank], self.edge_ptr[self.rank + 1]
        keep = local.col != local.row if drop else torch.ones(local.num_edges, dtype=torch.bool)
        col, row, eids = local.col[keep], local.row[keep], self.edge_ids[lo:hi][keep]
        space = self.edge_id_space
        if add:
            loops = torch.arange(self.num_nodes)
            if key[1] is not None:
                loops = loops[self.global_ids < key[1]]
            col, row = torch.cat([col, loops]), torch.cat([row, loops])
            eids = torch.cat([eids, space + self.global_ids[loops]])
            space += self.num_global_nodes
            order = torch.sort(row, stable=True).indices
            col, row, eids = col[order], row[order], eids[order]
        counts = torch.bincount(row, minlength=self.num_nodes)
        indptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(counts, 0)])
        blocks = list(self.blocks)
        blocks[self.rank] = Block(indptr, col, local.num_src, local.src_gids)
        edge_ids = torch.cat([self.edge_ids[:lo], eids, self.edge_ids[hi:]])
        self._derived[key] = ShardGraph(
            self.rank, self.world_size, self.global_ids, blocks, self.send_index, edge_ids,
            self.num_global_nodes, space,
        )
        return self._derived[key]

    def derived(self, key: tuple) -> "ShardGraph":
        """The shard this one derives under ``key`` (a key of ``_derived``: the self-loop
        variants, an edge subset), made again where it is not yet: a resumed run puts its
        links' state there before the first call makes it."""
        if key[0] == "subset":
            return self.edge_subset(torch.from_numpy(np.unpackbits(np.frombuffer(key[2], np.uint8), count=key[1])).bool())
        drop, add = {"no_loops": (True, False), "one_loop": (True, True), "plus_loop": (False, True)}[key[0]]
        return self._local_loops(key, drop=drop, add=add)

    def edge_subset(self, mask: torch.Tensor) -> "ShardGraph":
        """The edges ``mask`` keeps (one bool per edge, in shard order), still in shard
        order, as :meth:`Graph.edge_subset` (cached per mask content). Each block keeps its
        source rows and the send lists stay: a peer still sends the rows no kept edge
        reads (they are received and unused), since telling it which ones would take a
        message per call."""
        return cached_subset(self._derived, mask, self._subset)

    def _subset(self, keep: torch.Tensor) -> "ShardGraph":
        if keep.numel() != self.num_edges:
            raise PartitionError(f"an edge mask of {keep.numel()} entries for a shard of {self.num_edges} edges")
        blocks = []
        for q, b in enumerate(self.blocks):
            kept = keep[self.edge_ptr[q] : self.edge_ptr[q + 1]]
            counts = torch.bincount(b.row[kept], minlength=b.num_dst)
            indptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(counts, 0)])
            blocks.append(Block(indptr, b.col[kept], b.num_src, b.src_gids))
        return ShardGraph(
            self.rank, self.world_size, self.global_ids, blocks, self.send_index, self.edge_ids[keep],
            self.num_global_nodes, self.edge_id_space, self.src_global_ids if self.bipartite else None,
        )

    def halo_sizes(self) -> list[int]:
        """Rows received from each partition (the local block counts its own nodes)."""
        return [b.num_src for b in self.blocks]

    def __repr__(self) -> str:
        return (
            f"ShardGraph(rank={self.rank}/{self.world_size}, num_nodes={self.num_nodes}, "
            f"num_edges={self.num_edges}, halo={self.halo_sizes()})"
        )
