"""The user-facing graph handle and the CSR block every kernel works on.

A :class:`Graph` is a directed multigraph with edges ``u -> v`` given by two LongTensors.
Aggregation is over *in-edges*: node ``v`` reduces over every ``u`` with an edge ``u -> v``.
Edge tensors passed to the ops are in the order the edges were given.

Internally every aggregation runs over :class:`Block` objects: the CSR (by destination)
of the edges from one set of source rows into one set of destination rows. A whole
single-machine graph is one block; a worker's shard holds one block per source
partition (see :mod:`sarcompile.graph.shard`).
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterator

import numpy as np
import torch

from sarcompile.errors import GraphError
from sarcompile.graph.frames import FramesMixin, copy_dgl_frames

__all__ = ["Graph", "Block", "Tiles", "csr_tensor", "index_dtype", "tile_count", "probe_graph", "probe_relation",
           "cached_subset"]

# int32's range. A block whose row or edge numbers reach it has int64 indices.
INDEX_LIMIT = 2**31

# Edge subsets a graph keeps (one per relation, typically); past this many, the oldest goes.
SUBSET_CACHE = 64

# Dense rows per tile of a CPU sparse product (see Block.tiles). MKL's CSR product reads the
# dense rows in edge order: with 100k source rows of 128 floats (51 MB) nearly every read
# misses the cache. Tiles of this many source rows (8 MB at 128 floats, 16 MB at 256; the
# machine measured has a 32 MB L3) took SAGE's three products on a 100k-node, 2M-edge
# graph from 455 to 200-250 ms; 32k rows gave 270-290, 8k rows 270 (docs/benchmarks.md).
TILE_ROWS = 1 << 14
# The most row offsets the tiles may add per entry. Each tile has an offset per row, so on a
# sparse graph of many nodes (average degree 20, 800k nodes: 49 tiles) they would outgrow
# the entries' own columns; such a product goes whole to the CPU kernel (see tile_count).
TILE_OFFSETS = 0.5


def _no_whole_product_kernel() -> bool:
    return False


# Whether a CPU product left in one tile runs a kernel that beats large tiles (the CPU
# kernel of our own, where it is built). sarcompile.codegen registers
# ``cpu_spmm.enabled`` here when imported: it builds on this module, so cannot be imported by it.
whole_product_kernel: Callable[[], bool] = _no_whole_product_kernel


@dataclass(eq=False)
class Tiles:
    """A sparse product's matrix ``[num_rows, num_cols]`` split by ranges of its columns:
    tile ``i`` holds the entries of columns ``bounds[i]:bounds[i+1]``, CSR by row, as
    ``indptr[i]`` and ``col[edges[i]:edges[i+1]]`` (columns counted from the tile's first).
    ``order[j]`` is the block's CSR position of the ``j``-th entry in tile order (None where
    it is not kept, see :meth:`Block.tiles`); a product takes weights per edge in tile order."""

    shape: tuple[int, int]
    bounds: list[int]
    edges: list[int]
    indptr: list[torch.Tensor]
    col: torch.Tensor
    order: torch.Tensor | None

    def matrices(self, values: torch.Tensor | None, dtype: torch.dtype) -> Iterator[tuple[slice, torch.Tensor]]:
        """Each tile as a sparse CSR matrix with ``values`` (in tile order; ones if None),
        with the slice of the dense operand's rows it multiplies."""
        if values is None:  # (one buffer for all tiles: a tile's own, under the mmap threshold, would leave heap holes)
            values = torch.ones(self.edges[-1], dtype=dtype, device=self.col.device)
        for i, indptr in enumerate(self.indptr):
            e0, e1 = self.edges[i], self.edges[i + 1]
            lo, hi = self.bounds[i], self.bounds[i + 1]
            yield slice(lo, hi), csr_tensor(indptr, self.col[e0:e1], values[e0:e1].to(dtype), (self.shape[0], hi - lo))

    def tensors(self) -> list[torch.Tensor]:
        """The index tensors the tiles keep (to count their bytes)."""
        return [*self.indptr, self.col, *([] if self.order is None else [self.order])]

    def per_row(self, values: torch.Tensor) -> torch.Tensor:
        """``values[row]`` of every entry, in tile order (``values`` has a row per matrix row)."""
        out = values.new_empty(self.edges[-1])  # (made whole, first: see Block._source_tiles)
        for i, ip in enumerate(self.indptr):
            out[self.edges[i] : self.edges[i + 1]] = torch.repeat_interleave(
                values, (ip[1:] - ip[:-1]).long(), output_size=self.edges[i + 1] - self.edges[i])
        return out

    def per_col(self, values: torch.Tensor) -> torch.Tensor:
        """``values[column]`` of every entry, in tile order (``values`` has a row per column)."""
        out = values.new_empty(self.edges[-1])
        for lo, hi, e0, e1 in zip(self.bounds, self.bounds[1:], self.edges, self.edges[1:]):
            torch.index_select(values[lo:hi], 0, self.col[e0:e1], out=out[e0:e1])
        return out


def tile_count(shape: tuple[int, int], edges: int) -> int:
    """Tiles a CPU product splits a ``[rows, cols]`` matrix of ``edges`` entries into: of at
    most :data:`TILE_ROWS` columns, as long as the tiles' row offsets (one per row and
    tile) stay within :data:`TILE_OFFSETS` per entry. Where more would be needed, one tile,
    for the CPU kernel (:mod:`sarcompile.codegen.cpu_spmm`): fewer, larger tiles were
    slower than it, their rows no longer in the cache beside the output, which each tile's
    pass streams whole (200k nodes of degree 20: SAGE's step 2.67 s in 9 tiles of 22k rows
    against 2.44 s in one, median of 14 taken in turn; docs/benchmarks.md). Without that
    kernel (:data:`whole_product_kernel`), fewer, larger tiles of up to twice
    :data:`TILE_ROWS` columns, which beat torch's product of one (2.45 against 2.67 s)."""
    rows, cols = shape
    stretch = 1 if whole_product_kernel() else 2
    count = min(-(-cols // TILE_ROWS), int(TILE_OFFSETS * edges / (rows + 1)))
    return count if count > 1 and cols <= stretch * TILE_ROWS * count else 1


def index_dtype(num_dst: int, num_src: int, num_edges: int) -> torch.dtype:
    """The dtype of a block's indices (its CSR, its transpose, their orders): int32 when
    every number they hold -- edge offsets up to ``num_edges``, source rows below
    ``num_src``, destination rows (the transpose's) below ``num_dst`` -- and their lengths
    fit in it, else int64. Offsets into feature rows (row x width) are not held in them:
    kernels form those in int64 whatever this is (codegen.gpu_compile.check_index)."""
    fits = max(num_edges, num_src + 1, num_dst + 1) < INDEX_LIMIT
    return torch.int32 if fits else torch.int64


def _even(size: int, count: int) -> list[int]:
    """``count`` ranges of (nearly) equal length covering ``[0, size)``, as their bounds."""
    step = max(-(-size // count), 1)
    return [min(i * step, size) for i in range(count + 1)]


@dataclass(eq=False)
class Block:
    """Edges from ``num_src`` source rows into ``num_dst`` destination rows, CSR by destination.

    ``col[i]`` is the source row of the i-th edge in CSR order, ``row[i]`` its destination.
    ``src_gids`` holds the global node id of each source row: the max reduction breaks
    ties by the smallest global id, so its result does not depend on how nodes are split.

    The CSR and its transpose are int32 whenever the block's rows and edges fit (they
    are the largest index tensors a worker keeps: half the bytes, and torch's CSR product
    -- MKL's, int32 -- would otherwise convert them on every call). Kernels index with
    them as they are; Triton kernels widen what they load to int64 before any offset.
    Products read the block as :meth:`tiles`: on a CPU in source-row ranges, elsewhere
    one tile, the CSR and the CSC view (its transpose, with its order).
    """

    indptr: torch.Tensor  # [num_dst + 1]
    col: torch.Tensor  # [nnz] source row of each edge
    num_src: int
    src_gids: torch.Tensor  # [num_src]
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.indptr, self.col = self.indptr.to(self.index_dtype), self.col.to(self.index_dtype)

    @property
    def index_dtype(self) -> torch.dtype:
        """int32 when every row and edge number of the block fits, else int64 (:func:`index_dtype`)."""
        return index_dtype(self.indptr.numel() - 1, self.num_src, self.col.numel())

    @property
    def num_dst(self) -> int:
        return self.indptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.col.numel()

    @cached_property
    def row(self) -> torch.Tensor:
        """Destination row of every edge (CSR expanded). Kept once made: an int64 per edge,
        so what needs only a value per edge uses :meth:`per_edge` instead."""
        return self._rows()

    def _rows(self) -> torch.Tensor:
        """:attr:`row`, made afresh and not kept."""
        return self.per_edge(torch.arange(self.num_dst, device=self.indptr.device))

    def per_edge(self, dst_values: torch.Tensor) -> torch.Tensor:
        """``dst_values[row]``: each edge's value of its destination row (``dst_values`` has
        ``num_dst`` rows), without making or keeping :attr:`row`."""
        counts = self.indptr[1:] - self.indptr[:-1]
        return torch.repeat_interleave(dst_values, counts, dim=0, output_size=self.num_edges)

    def tiles(self, transposed: bool = False, split: bool = True, with_order: bool = False) -> Tiles:
        """The block's matrix ``[num_dst, num_src]`` (``transposed``: ``[num_src, num_dst]``)
        as :class:`Tiles` of at most :data:`TILE_ROWS` columns -- the rows of the dense
        operand a product reads -- made once and kept. One tile on devices other than the
        CPU (their caches are not what the tiles are for) or without ``split``.

        Their order (an int per edge) is kept only ``with_order``, for weights given in CSR
        order; weights made for the tiles (:meth:`Tiles.per_row`, :meth:`Tiles.per_col`)
        need none. Forward tiles never keep it (the CSR itself is at hand): split, they take
        weights only in tile order; unsplit, they are the CSR and take its order."""
        rows, cols = (self.num_src, self.num_dst) if transposed else (self.num_dst, self.num_src)
        count = tile_count((rows, cols), self.num_edges) if split and self.col.device.type == "cpu" else 1
        if not transposed and count == 1:
            return Tiles((rows, cols), [0, cols], [0, self.num_edges], [self.indptr], self.col, None)
        key = ("tiles", transposed, count)
        kept = self._cache.get(key)
        if kept is None or (with_order and kept.order is None):
            kept = self._cache[key] = self._transposed_tiles(count, with_order) if transposed else self._source_tiles(count)
        return kept

    def _source_tiles(self, count: int) -> Tiles:
        """Forward tiles: each tile's edges picked from the CSR by a mask, in its order, its
        row offsets counted from it (no sort, no row per edge: few temporaries)."""
        bounds, dtype = _even(self.num_src, count), self.index_dtype
        # What is kept is made first, whole: a piece per tile under the mmap threshold
        # would sit on the heap between the temporaries and keep their holes resident.
        on = {"dtype": dtype, "device": self.col.device}
        indptr = torch.empty((count, self.num_dst + 1), **on)
        col = torch.empty(self.num_edges, **on)
        seen = torch.zeros(self.num_edges + 1, **on)  # the tile's edges before each edge
        edges = [0]
        for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            inside = (self.col >= lo) & (self.col < hi)
            torch.cumsum(inside, 0, dtype=dtype, out=seen[1:])
            torch.index_select(seen, 0, self.indptr, out=indptr[i])
            edges.append(edges[-1] + int(seen[-1]))
            piece = col[edges[-2] : edges[-1]]
            torch.masked_select(self.col, inside, out=piece)
            piece.sub_(lo)
        return Tiles((self.num_dst, self.num_src), bounds, edges, list(indptr.unbind(0)), col, None)

    def _transposed_tiles(self, count: int, with_order: bool) -> Tiles:
        """Transposed tiles: tile ``i`` is the transpose of destination rows ``bounds[i]:
        bounds[i+1]`` -- a range of the CSR -- its edges sorted by source row (stably: each
        source row's destinations stay in order)."""
        bounds, dtype = _even(self.num_dst, count), self.index_dtype
        on = {"dtype": dtype, "device": self.col.device}
        indptr = torch.zeros((count, self.num_src + 1), **on)  # (kept: made whole, first, as above)
        col = torch.empty(self.num_edges, **on)
        order = torch.empty(self.num_edges, **on) if with_order else None
        edges = self.indptr[bounds].tolist()
        for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            sub = self.rows(lo, hi)
            by_source = torch.sort(sub.col, stable=True).indices
            col[edges[i] : edges[i + 1]] = sub._rows()[by_source]
            if order is not None:
                order[edges[i] : edges[i + 1]] = by_source + edges[i]
            torch.cumsum(torch.bincount(sub.col, minlength=self.num_src), 0, dtype=dtype, out=indptr[i, 1:])
        return Tiles((self.num_src, self.num_dst), bounds, edges, list(indptr.unbind(0)), col, order)

    def row_chunks(self, max_edges: int) -> list[tuple[int, int]]:
        """Consecutive destination-row ranges ``[start, end)`` covering the block, each
        with at most ``max_edges`` edges plus those of one row (rows stay whole): kernels
        that work on one range at a time keep their per-edge temporaries bounded."""
        key = ("row_chunks", max_edges)
        if key not in self._cache:
            marks = torch.arange(0, self.num_edges, max(max_edges, 1), device=self.indptr.device)
            starts = torch.searchsorted(self.indptr, marks, right=True) - 1
            bounds = torch.unique(torch.cat([starts, starts.new_tensor([self.num_dst])])).tolist()
            bounds = [b for b in bounds if 0 <= b <= self.num_dst]
            if bounds[0] != 0:
                bounds.insert(0, 0)
            self._cache[key] = [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
        return self._cache[key]

    def rows(self, start: int, end: int) -> "Block":
        """The block's destination rows ``[start, end)`` with their in-edges (views)."""
        lo, hi = int(self.indptr[start]), int(self.indptr[end])
        return Block(self.indptr[start : end + 1] - lo, self.col[lo:hi], self.num_src, self.src_gids)

    def on(self, device: torch.device) -> "Block":
        """This block with its index tensors on ``device`` (itself when they are there);
        made once per device, so the transfer happens once per graph, not per call."""
        if self.indptr.device == device:
            return self
        key = ("on", str(device))
        if key not in self._cache:
            self._cache[key] = Block(self.indptr.to(device), self.col.to(device), self.num_src, self.src_gids.to(device))
        return self._cache[key]


def csr_tensor(indptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    # torch warns that sparse CSR is beta on construction; ours is valid by construction.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(indptr, col, values, size=size, check_invariants=False)


def _as_index(t: Any, name: str) -> torch.Tensor:
    t = torch.as_tensor(t)
    if t.numel() == 0 and t.dim() == 1:  # torch.as_tensor([]) is float; no ids, no problem
        t = t.long()
    if t.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise GraphError(f"{name} must be an integer tensor of node ids, got dtype {t.dtype}")
    if t.dim() != 1:
        raise GraphError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    return t.long().cpu().contiguous()


class Graph(FramesMixin):
    """A directed graph on one machine. Build it with :meth:`from_edges`, :meth:`from_pyg`
    or :meth:`from_networkx`.

    With ``num_src_nodes`` it is *bipartite*: sources and destinations are two node sets
    (``src`` ids in ``[0, num_src_nodes)``, ``dst`` ids in ``[0, num_nodes)``), as one
    relation of a :class:`~sarcompile.graph.hetero.HeteroGraph` is. ``num_nodes`` is always the
    destinations' count: the rows an aggregation produces; source-side inputs (``spmm``'s
    ``x``) have ``num_src_nodes`` rows.

    >>> g = Graph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 1]), num_nodes=4)
    >>> g.num_nodes, g.num_edges, g.in_degrees().tolist()
    (4, 3, [0, 2, 1, 0])
    """

    def __init__(self, src: torch.Tensor, dst: torch.Tensor, num_nodes: int, num_src_nodes: int | None = None):
        src, dst = _as_index(src, "src"), _as_index(dst, "dst")
        if src.numel() != dst.numel():
            raise GraphError(f"src has {src.numel()} entries but dst has {dst.numel()}; they must pair up")
        num_nodes = int(num_nodes)
        self.bipartite = num_src_nodes is not None
        num_src_nodes = num_nodes if num_src_nodes is None else int(num_src_nodes)
        for name, count in (("num_nodes", num_nodes), ("num_src_nodes", num_src_nodes)):
            if count < 0:
                raise GraphError(f"{name} must be >= 0, got {count}")
        if not self.bipartite and src.numel():
            lo = min(int(src.min()), int(dst.min()))
            hi = max(int(src.max()), int(dst.max()))
            if lo < 0 or hi >= num_nodes:
                raise GraphError(
                    f"edge endpoints must lie in [0, {num_nodes}), found ids from {lo} to {hi}; "
                    "pass the right num_nodes"
                )
        for ids, count, end in ((src, num_src_nodes, "source"), (dst, num_nodes, "destination")):
            if self.bipartite and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= count):
                raise GraphError(
                    f"{end} ids must lie in [0, {count}), found ids from {int(ids.min())} to {int(ids.max())}; "
                    f"pass the right number of {end} nodes"
                )
        self.src, self.dst, self.num_nodes, self.num_src_nodes = src, dst, num_nodes, num_src_nodes
        # Global id of every edge (keys edge dropout). Self-loops a derived graph adds for
        # node v get id ``edge_id_space + v``, beyond every original edge's id.
        self.edge_ids = torch.arange(src.numel())
        self.edge_id_space = src.numel()
        # The values of the sparse adjacency the graph was made from (from_adjacency), one
        # per edge in edge order; None for a graph of edges. A graph derived from it (with
        # self-loops, an edge subset) has none: the layers that read them carry them over.
        self.adj_values: torch.Tensor | None = None
        self._derived: dict[Any, Graph] = {}  # by name, or ("subset", mask)

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def from_edges(cls, src: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> "Graph":
        """Edges ``src[i] -> dst[i]``; multi-edges and self-loops are kept."""
        return cls(src, dst, num_nodes)

    @classmethod
    def from_pyg(cls, data: Any) -> "Graph":
        """From a ``torch_geometric.data.Data``: ``edge_index[0] -> edge_index[1]`` as PyG does."""
        edge_index = getattr(data, "edge_index", None)
        if edge_index is None:
            raise GraphError("the PyG data object has no edge_index")
        return cls(edge_index[0], edge_index[1], int(data.num_nodes))

    @classmethod
    def from_adjacency(cls, adj: torch.Tensor) -> "Graph":
        """From a square sparse adjacency (a ``torch.sparse_csr`` or ``sparse_coo`` tensor; PyG's
        ``adj_t``, rows the destinations): an edge ``u -> v`` per stored ``adj[v, u]`` (entries
        at one place summed, as torch coalesces them), in row-major order. An adjacency with
        values other than 1 or with self-loops keeps its values as :attr:`adj_values`, which
        PyG's layers read as they read such a matrix (a normalised ``adj_t``: GCNConv's weights,
        and a second self-loop where GCNConv adds its own); one of ones without self-loops is
        just its edges, the graph of ``edge_index``.

        >>> adj = torch.tensor([[0., 0.5], [2., 0.]]).to_sparse_csr()
        >>> g = Graph.from_adjacency(adj)
        >>> g.src.tolist(), g.dst.tolist(), g.adj_values.tolist()
        ([1, 0], [0, 1], [0.5, 2.0])
        """
        if not (isinstance(adj, torch.Tensor) and adj.layout in (torch.sparse_csr, torch.sparse_coo)
                and adj.dim() == 2 and adj.shape[0] == adj.shape[1]):
            raise GraphError("Graph.from_adjacency takes a square torch.sparse_csr or sparse_coo matrix "
                             f"(adj_t[dst, src]), got {type(adj).__name__}"
                             f"{tuple(adj.shape) if isinstance(adj, torch.Tensor) else ''}")
        coo = adj.detach().to_sparse_coo().coalesce()
        dst, src = coo.indices().cpu()
        values = coo.values().cpu()
        if values.dim() != 1:
            raise GraphError(f"Graph.from_adjacency takes one value per entry, got values of shape "
                             f"{tuple(values.shape)} (edge features): give them as an edge tensor instead")
        g = cls(src, dst, adj.shape[0])
        if bool((src == dst).any()) or not bool((values == 1).all()):
            g.adj_values = values
        return g

    @classmethod
    def from_networkx(cls, G: Any) -> "Graph":
        """Directed graphs as they are; undirected ones get both directions of every edge.

        Nodes are numbered in ``G.nodes`` order.
        """
        ids = {n: i for i, n in enumerate(G.nodes)}
        pairs = [(ids[u], ids[v]) for u, v in G.edges()]
        if not G.is_directed():
            pairs += [(v, u) for u, v in pairs if u != v]
        src = torch.tensor([p[0] for p in pairs], dtype=torch.long)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.long)
        return cls(src, dst, len(ids))

    @classmethod
    def from_dgl(cls, g: Any) -> "Graph":
        """From a homogeneous ``dgl.DGLGraph``: its edges in edge-id order (so DGL edge
        tensors keep their meaning), ``g.num_nodes()`` nodes. Multi-edges and self-loops
        are kept, as DGL keeps them, and so are its frames (``ndata``, ``edata``, see
        :mod:`sarcompile.graph.frames`); heterographs and sampled blocks are refused."""
        dgl = sys.modules.get("dgl")  # a DGLGraph exists only once its program imported dgl
        if dgl is None or not isinstance(g, dgl.DGLGraph):
            raise GraphError(f"Graph.from_dgl takes a dgl.DGLGraph, got {type(g).__name__}")
        if g.is_block:
            raise GraphError(
                "Graph.from_dgl got a DGLBlock (a sampled bipartite block); sarcompile trains full-batch on "
                "the whole graph: pass the DGLGraph itself"
            )
        if len(g.ntypes) != 1 or len(g.etypes) != 1:
            raise GraphError(
                f"Graph.from_dgl takes a homogeneous graph, got a heterograph with node types {g.ntypes} and "
                f"edge types {g.etypes}; convert it with dgl.to_homogeneous(g) first"
            )
        src, dst = g.edges(order="eid")
        return copy_dgl_frames(g, cls(src.long().cpu(), dst.long().cpu(), g.num_nodes()))

    # -- queries ------------------------------------------------------------------------
    @property
    def num_edges(self) -> int:
        return self.src.numel()

    def in_degrees(self) -> torch.Tensor:
        """In-degree of every node (multi-edges and self-loops counted)."""
        return self._in_degrees.clone()  # a copy: the cached one must survive in-place edits

    @cached_property
    def _in_degrees(self) -> torch.Tensor:
        return torch.bincount(self.dst, minlength=self.num_nodes)

    @property
    def num_dst(self) -> int:
        """Rows an aggregation produces: every node (a shard has only its own)."""
        return self.num_nodes

    @property
    def dst_index(self) -> torch.Tensor:
        """Destination of every edge, in the order edge tensors use."""
        return self.dst

    @property
    def global_ids(self) -> torch.Tensor:
        return torch.arange(self.num_nodes)

    @property
    def src_global_ids(self) -> torch.Tensor:
        """Global id of every source row (those of :attr:`global_ids` unless bipartite)."""
        return torch.arange(self.num_src_nodes)

    @cached_property
    def loop_mask(self) -> torch.Tensor:
        """Whether each edge is a self-loop ``v -> v``, in edge order."""
        return self.src == self.dst

    def remove_self_loops(self) -> "Graph":
        """The same graph without edges ``v -> v`` (computed once and cached)."""
        return self._loops(("no_loops", None), drop=True, add=False)

    def with_self_loops(self, upto: int | None = None) -> "Graph":
        """Exactly one self-loop per node: existing ones dropped, one added to every node
        (what PyG's GCNConv and GATConv do, ``add_remaining_self_loops``); with ``upto``,
        only to the nodes with a smaller id. Cached."""
        return self._loops(("one_loop", upto), drop=True, add=True)

    def plus_self_loops(self, upto: int | None = None) -> "Graph":
        """Every edge kept, existing self-loops too, and one more self-loop added to every
        node (with ``upto``, every node with a smaller id) after them (PyG's
        ``add_self_loops``). Cached."""
        return self._loops(("plus_loop", upto), drop=False, add=True)

    def _loops(self, key: Any, drop: bool, add: bool) -> "Graph":
        _no_loops_on_bipartite(self)
        if key not in self._derived:
            keep = ~self.loop_mask if drop else torch.ones_like(self.loop_mask)
            src, dst, ids = self.src[keep], self.dst[keep], self.edge_ids[keep]
            space = self.edge_id_space
            if add:  # the added loop of node v gets id `edge_id_space + v`
                loops = torch.arange(self.num_nodes if key[1] is None else min(key[1], self.num_nodes))
                src, dst, ids = torch.cat([src, loops]), torch.cat([dst, loops]), torch.cat([ids, space + loops])
                space += self.num_nodes  # loops a further derived graph adds get ids of their own
            self._derived[key] = self._derive(src, dst, ids, space)
        return self._derived[key]

    def edge_subset(self, mask: torch.Tensor) -> "Graph":
        """The edges ``mask`` keeps (one bool per edge), in this graph's edge order, on the
        same nodes: PyG's ``edge_index[:, mask]``. Made once per mask content (cached)."""
        return cached_subset(self._derived, mask, lambda keep: self._derive(
            self.src[keep], self.dst[keep], self.edge_ids[keep]))

    def _derive(self, src: torch.Tensor, dst: torch.Tensor, edge_ids: torch.Tensor,
                edge_id_space: int | None = None) -> "Graph":
        g = Graph(src, dst, self.num_nodes, self.num_src_nodes if self.bipartite else None)
        g.edge_ids = edge_ids
        g.edge_id_space = self.edge_id_space if edge_id_space is None else edge_id_space
        if getattr(self, "is_probe", False):  # a graph derived from a probe stands for any size too
            g.is_probe = True
        return g

    # -- what the kernels use -------------------------------------------------------------
    @cached_property
    def csr_perm(self) -> torch.Tensor:
        """Edge ids in CSR (by destination) order; stable, so multi-edges keep their order."""
        return torch.sort(self.dst, stable=True).indices

    @cached_property
    def csr_inverse_perm(self) -> torch.Tensor:
        """Where each edge (in the order given) sits in CSR order: undoes :attr:`csr_perm`."""
        return torch.argsort(self.csr_perm)

    @cached_property
    def block(self) -> Block:
        """The whole graph as one CSR block (sources are all source nodes)."""
        counts = torch.bincount(self.dst, minlength=self.num_nodes)
        indptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(counts, 0)])
        return Block(indptr, self.src[self.csr_perm], self.num_src_nodes, self.src_global_ids)

    def __repr__(self) -> str:
        if self.bipartite:
            return f"Graph(num_src_nodes={self.num_src_nodes}, num_nodes={self.num_nodes}, num_edges={self.num_edges})"
        return f"Graph(num_nodes={self.num_nodes}, num_edges={self.num_edges})"


def _no_loops_on_bipartite(g: Any) -> None:
    """Self-loops join a node to itself: a relation between two node sets has none to add."""
    if getattr(g, "bipartite", False):
        raise GraphError(
            "self-loops need one node set, but this graph is bipartite (a relation between two node types); "
            "layers on such a relation must not add self-loops (PyG: add_self_loops=False)"
        )


def cached_subset(derived: dict, mask: torch.Tensor, build: Callable[[torch.Tensor], Any]) -> Any:
    """``build(mask)`` (``mask`` a CPU bool tensor), kept in ``derived`` under the mask's
    content: a mask computed anew at every call (``edge_type == i``) finds the graph made
    at the first. The key is the mask packed to bits, exact and E/8 bytes."""
    if mask.dtype != torch.bool or mask.dim() != 1:
        raise GraphError(
            f"an edge subset takes one bool per edge, got a tensor of dtype {mask.dtype} and shape "
            f"{tuple(mask.shape)}; select edges with a mask (edge_type == i), not with indices"
        )
    mask = mask.detach().cpu()
    key = ("subset", mask.numel(), np.packbits(mask.numpy()).tobytes())
    if key not in derived:
        subsets = [k for k in derived if isinstance(k, tuple) and k[0] == "subset"]
        if len(subsets) >= SUBSET_CACHE:
            del derived[subsets[0]]  # dicts keep insertion order: the oldest
        derived[key] = build(mask)
    return derived[key]


def probe_graph(num_nodes: int, num_edges: int, num_loops: int) -> Graph:
    """A small fixed random graph for running a program once to learn its shapes (the
    residency pass, the plan): ``num_loops`` self-loops on nodes ``0..num_loops-1`` and
    ``num_edges - num_loops`` edges between distinct nodes. Pick sizes that no feature
    width is likely to equal, so that a row axis is recognisable."""
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, num_nodes, (num_edges - num_loops,), generator=gen)
    step = torch.randint(1, num_nodes, (num_edges - num_loops,), generator=gen)
    loops = torch.arange(num_loops)
    g = Graph.from_edges(torch.cat([src, loops]), torch.cat([(src + step) % num_nodes, loops]), num_nodes)
    g.is_probe = True  # it stands for a graph of any size (see ops.gather_table)
    return g


def probe_relation(num_src: int, num_dst: int, num_edges: int, num_loops: int, seed: int, same: bool) -> Graph:
    """:func:`probe_graph`'s counterpart for one relation of a typed graph: ``num_edges``
    random edges from ``num_src`` source rows to ``num_dst`` destination rows, the first
    ``num_loops`` of them self-loops when the relation is within one type (``same``, an
    ordinary graph; otherwise a bipartite one)."""
    if same:
        return probe_graph(num_dst, num_edges, num_loops)
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_src, (num_edges,), generator=gen)
    dst = torch.randint(0, num_dst, (num_edges,), generator=gen)
    g = Graph(src, dst, num_dst, num_src)
    g.is_probe = True
    return g
