"""A multilevel partitioner whose working set is one bucket and a few per-node arrays.

1. **Coarsen** by size-constrained label propagation: every node starts in a cluster of
   its own and, bucket by bucket, joins the cluster most of its neighbours (by edge
   weight) are in, when that beats its own and the cluster stays under ``max_cluster``
   node weight. Contracting the clusters gives a weighted graph (cluster sizes as node
   weights, edges between clusters summed); that repeats, in memory, until METIS fits.
2. **METIS** splits the coarsest graph, balancing node weight.
3. **Project** each node to its cluster's part, and **refine** in streaming passes: a node
   moves to the part holding most of its neighbours when that is strictly more than its
   own part holds and the target stays within the balance bound.

Nodes are moved a slice of a bucket at a time (:data:`SLICES` slices by a hash of the
node id), each slice seeing the moves of the slices before it. Moving a whole bucket at
once would let two neighbours swap labels forever, and would not let clusters snowball
the way one-node-at-a-time label propagation does; slices give most of that at the cost
of a vectorised pass. Ties go to the heavier cluster, which also helps clusters grow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from sarcompile.errors import PartitionError
from sarcompile.data.outofcore.adjacency import Block
from sarcompile.data.outofcore.budget import Budget

__all__ = ["Coarse", "multilevel_partition"]

CLUSTERS_PER_PART = 32  # a cluster weighs at most 1/32 of a part: METIS can still balance
LP_ROUNDS = 5
REFINE_ROUNDS = 3
IMBALANCE = 1.03  # METIS's default bound on a part's weight, over the average
MAX_LEVELS = 8
SLICES = 16


@dataclass
class Coarse:
    """A weighted graph in memory: CSR by node, node weights ``vw``, edge weights ``w``."""

    xadj: np.ndarray
    adj: np.ndarray
    w: np.ndarray
    vw: np.ndarray

    @property
    def num_nodes(self) -> int:
        return self.vw.size

    def blocks(self) -> Iterator[Block]:
        a = np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(self.xadj))
        yield Block(0, self.num_nodes, a, self.adj, self.w)


def multilevel_partition(
    blocks: Callable[[], Iterable[Block]], num_nodes: int, num_parts: int, budget: Budget, seed: int,
    log: Callable[[str], None] = lambda s: None,
) -> np.ndarray:
    """The part of every node of the graph whose adjacency ``blocks()`` streams (see
    :mod:`.adjacency`): coarsen until METIS fits ``budget``, split, project, refine."""
    vw = np.ones(num_nodes, dtype=np.int64)
    max_cluster = max(1, num_nodes // (num_parts * CLUSTERS_PER_PART))
    labels = _compact(label_propagation(blocks, vw, max_cluster))
    coarse = contract(blocks(), labels, vw, budget)
    log(f"level 1: {num_nodes} nodes -> {coarse.num_nodes} clusters, {coarse.adj.size} adjacency entries")
    level = 1
    while not budget.metis_fits(coarse.num_nodes, coarse.adj.size):
        level += 1
        finer = _compact(label_propagation(coarse.blocks, coarse.vw, max_cluster))
        if level > MAX_LEVELS or finer.max(initial=-1) + 1 == coarse.num_nodes:
            raise PartitionError(
                f"coarsening stalled at {coarse.num_nodes} clusters and {coarse.adj.size} adjacency entries, "
                f"more than METIS can take within the memory limit; raise --memory-limit or use more parts"
            )
        labels = finer[labels]
        coarse = contract(coarse.blocks(), finer, coarse.vw, budget)
        log(f"level {level}: {coarse.num_nodes} clusters, {coarse.adj.size} adjacency entries")
    parts = metis(coarse, num_parts, seed)[labels]
    del labels, coarse
    refine(blocks, parts, num_parts)
    return parts


def label_propagation(blocks: Callable[[], Iterable[Block]], vw: np.ndarray, max_cluster: int) -> np.ndarray:
    """Cluster labels by size-constrained label propagation (module docstring, step 1)."""
    labels = np.arange(vw.size, dtype=np.int64)
    sizes = vw.copy()  # cluster weight, indexed by label
    for _ in range(LP_ROUNDS):
        moved = sum(_move(block, labels, sizes, max_cluster, vw, _best_label) for block in blocks())
        if moved <= vw.size // 100:
            break
    return labels


def refine(blocks: Callable[[], Iterable[Block]], parts: np.ndarray, num_parts: int) -> None:
    """Greedy streaming refinement of ``parts`` in place (module docstring, step 3)."""
    vw = np.ones(parts.size, dtype=np.int64)
    sizes = np.bincount(parts, minlength=num_parts).astype(np.int64)
    cap = max(int(np.ceil(parts.size / num_parts * IMBALANCE)), int(sizes.max(initial=0)))
    best = _best_part(num_parts)
    for _ in range(REFINE_ROUNDS):
        if sum(_move(block, parts, sizes, cap, vw, best) for block in blocks()) == 0:
            break


def _move(block: Block, group: np.ndarray, sizes: np.ndarray, cap: int, vw: np.ndarray, choose: Chooser) -> int:
    """Move the block's nodes, a slice at a time, to their best group; how many moved."""
    slice_of = (block.a * 0x9E3779B1 >> 7) % SLICES  # a hash: slices mix the node-id order
    order = np.argsort(slice_of, kind="stable")
    bounds = np.cumsum(np.bincount(slice_of, minlength=SLICES))[:-1]
    moved = 0
    for piece in np.split(order, bounds):
        if piece.size:
            sub = Block(block.lo, block.hi, block.a[piece], block.b[piece],
                        None if block.w is None else block.w[piece])
            moved += _move_slice(sub, group, sizes, cap, vw, choose)
    return moved


# What a node would join: for each of the block's nodes with a neighbour, (node, target,
# weight of its neighbours in the target, weight of its neighbours in its own group),
# given the groups, their sizes, and per entry the largest size its node may join.
Chooser = Callable[[Block, np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]


def _move_slice(block: Block, group: np.ndarray, sizes: np.ndarray, cap: int, vw: np.ndarray,
                choose: Chooser) -> int:
    """Move each of the block's nodes whose best group gains, while the group stays within
    ``cap``; updates ``group`` and ``sizes`` in place and returns how many moved."""
    node, target, gain_to, gain_own = choose(block, group, sizes, cap - vw[block.a])
    move = (target != group[node]) & (gain_to > gain_own)
    node, target, gain = node[move], target[move], (gain_to - gain_own)[move]
    if node.size == 0:
        return 0
    # Within each target, the largest gains first, as long as the target stays under cap.
    order = np.lexsort((-gain, target))
    node, target = node[order], target[order]
    weight = vw[node]
    first = np.r_[True, target[1:] != target[:-1]]
    start = np.maximum.accumulate(np.where(first, np.arange(target.size), 0))
    before = np.cumsum(weight) - weight
    taken = before - before[start] + weight  # weight entering the target up to this node
    ok = sizes[target] + taken <= cap
    node, target, weight = node[ok], target[ok], weight[ok]
    np.subtract.at(sizes, group[node], weight)
    np.add.at(sizes, target, weight)
    group[node] = target
    return int(node.size)


def _best_label(block: Block, labels: np.ndarray, sizes: np.ndarray, room: np.ndarray):
    """For label propagation: each node's heaviest neighbouring label with room for it
    (ties: the larger cluster, then the lower label)."""
    n = labels.size
    lab_b = labels[block.b]
    key = (block.a - block.lo) * n + lab_b
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    weight = np.bincount(inverse, weights=block.w) if block.w is not None else np.bincount(inverse).astype(float)
    node, lab = uniq // n + block.lo, uniq % n
    own = np.zeros(block.hi - block.lo)
    mine = lab == labels[node]
    own[node[mine] - block.lo] = weight[mine]
    fits = mine | (sizes[lab] <= room[first])
    node, lab, weight = node[fits], lab[fits], weight[fits]
    order = np.lexsort((lab, -sizes[lab], -weight, node))
    head = order[np.r_[True, node[order][1:] != node[order][:-1]]] if order.size else order
    return node[head], lab[head], weight[head], own[node[head] - block.lo]


def _best_part(num_parts: int) -> Chooser:
    def choose(block: Block, parts: np.ndarray, sizes: np.ndarray, room: np.ndarray):
        span = block.hi - block.lo
        conn = np.bincount((block.a - block.lo) * num_parts + parts[block.b], weights=block.w,
                           minlength=span * num_parts).reshape(span, num_parts)
        node, first = np.unique(block.a, return_index=True)
        rows = conn[node - block.lo]
        own = rows[np.arange(node.size), parts[node]]
        full = sizes[None, :] > room[first][:, None]
        full[np.arange(node.size), parts[node]] = False
        target = np.where(full, -1.0, rows).argmax(axis=1)
        return node, target, rows[np.arange(node.size), target], own
    return choose


def _compact(labels: np.ndarray) -> np.ndarray:
    """Labels renumbered 0..C-1 in order of first appearance of their value."""
    return np.unique(labels, return_inverse=True)[1].astype(np.int64).reshape(-1)


def contract(blocks: Iterable[Block], labels: np.ndarray, vw: np.ndarray, budget: Budget) -> Coarse:
    """The graph of clusters: an entry between two clusters weighs the entries between their nodes."""
    count = int(labels.max(initial=-1)) + 1
    merged = (np.empty(0, dtype=np.int64), np.empty(0))
    pending: list[tuple[np.ndarray, np.ndarray]] = []
    held = 0
    for block in blocks:
        ca, cb = labels[block.a], labels[block.b]
        cross = ca != cb
        key, w = ca[cross] * count + cb[cross], (1.0 if block.w is None else block.w[cross])
        uniq, inverse = np.unique(key, return_inverse=True)
        pending.append((uniq, np.bincount(inverse, weights=np.broadcast_to(w, key.shape))))
        held += uniq.size
        if held > budget.metis_entries:  # fold what is held before it outgrows the budget
            merged, pending = _merge([merged, *pending]), []
            held = merged[0].size
    key, w = _merge([merged, *pending])
    a, b = key // count, key % count
    xadj = np.concatenate([[0], np.cumsum(np.bincount(a, minlength=count))]).astype(np.int64)
    return Coarse(xadj, b, np.rint(w).astype(np.int64), np.bincount(labels, weights=vw, minlength=count).astype(np.int64))


def _merge(pieces: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    keys = np.concatenate([k for k, _ in pieces])
    uniq, inverse = np.unique(keys, return_inverse=True)
    return uniq, np.bincount(inverse, weights=np.concatenate([w for _, w in pieces]), minlength=uniq.size)


def metis(g: Coarse, num_parts: int, seed: int) -> np.ndarray:
    """METIS k-way on a weighted graph (balancing node weight)."""
    import pymetis

    if g.adj.size == 0 or g.num_nodes < num_parts:  # nothing to cut: deal clusters out by weight
        return np.argsort(np.argsort(-g.vw, kind="stable"), kind="stable") % num_parts
    options = pymetis.Options(seed=seed)
    if hasattr(pymetis, "CSRAdjacency"):
        _, parts = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(g.xadj, g.adj), vweights=g.vw,
                                      eweights=g.w, options=options)
    else:  # pymetis < 2025.2
        _, parts = pymetis.part_graph(num_parts, xadj=g.xadj, adjncy=g.adj, vweights=g.vw, eweights=g.w,
                                      options=options)
    return np.asarray(parts, dtype=np.int64)
