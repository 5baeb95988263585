"""Per-block kernels in plain torch: what the runtime runs on CPUs (and on GPUs until
Triton kernels are generated for a signature).

Every kernel works on one :class:`~sarcompile.graph.graph.Block` -- the edges from one set of
source rows into the local destination rows -- so the same code serves one machine (one
block) and N workers (one block per source partition). Node tensors may have any
trailing shape (``[n, F]`` or ``[n, heads, F]``); kernels flatten it to 2-D.

Rows are gathered per edge with ``index_select``, never ``t[index]``: on the CPU it copies
whole rows, 3-9x faster than advanced indexing for rows of 4 to 64 values (torch 2.13,
int32 indices; the gathers of GAT's scores were 4% of its step).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from sarcompile.graph.graph import Block, Tiles, csr_tensor
from sarcompile.ir.opdef import EDGE_CHUNK_ELEMENTS
from sarcompile.codegen import cpu_spmm

__all__ = [
    "QUANT_BITS",
    "AttentionState",
    "MaxState",
    "Packed",
    "add_rows",
    "attention_grads",
    "dst_weights",
    "edge_dot",
    "max_grad",
    "pack",
    "pack_prepare",
    "packed_row_bytes",
    "prepare_transpose",
    "sddmm",
    "sddmm_grads",
    "spmm",
    "spmm_t",
    "unpack",
]

# Larger than any node id: marks "no candidate" in the arg-min tie-break of the max.
_NO_ROW = torch.iinfo(torch.long).max

def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], math.prod(t.shape[1:]))


def _scalar_weight(weight: torch.Tensor | None) -> bool:
    return weight is None or weight.dim() == 1


def _per_head(weight: torch.Tensor | None, x: torch.Tensor) -> bool:
    """Weights ``[E, H]`` against features ``[n, H, C]``: one sparse matmul per head."""
    return weight is not None and weight.dim() == 2 and x.dim() == 3 and weight.shape[1] == x.shape[1]


def spmm(block: Block, x: torch.Tensor, weight: torch.Tensor | None, into: torch.Tensor | None = None,
         ordered: bool = False) -> torch.Tensor:
    """``out[v] = sum over edges u->v of w_e * x[u]`` for the block's destination rows;
    with ``into`` (``[num_dst, ...]``, contiguous), added into it and returned: a remote
    block's sums land in the local block's result with no buffer of their own.
    ``ordered``: a weight per edge in the block's tile order (:func:`dst_weights`), which
    the product reads tile by tile; weights in CSR order take the untiled product."""
    block = block.on(x.device)
    if _scalar_weight(weight):
        tiles = block.tiles(split=weight is None or ordered)
        if into is not None:
            _tiled_mm(tiles, weight, _flat(x), _flat(into), accumulate=True)
            return into
        out = _tiled_mm(tiles, weight, _flat(x))
        return out if x.dim() == 2 else out.reshape(block.num_dst, *x.shape[1:])  # (2-D: no view, see passes/inplace)
    if _per_head(weight, x):
        tiles = block.tiles(split=False)
        return _heads(lambda k, out: _tiled_mm(tiles, weight[:, k], x[:, k], out, accumulate=into is not None),
                      x.new_empty((block.num_dst, *x.shape[1:])) if into is None else into)
    # Other broadcasts: materialise one message per edge.
    msg = x.index_select(0, block.col) * weight.reshape(*weight.shape, *([1] * (x.dim() - weight.dim())))
    out = x.new_zeros((block.num_dst, *x.shape[1:])) if into is None else into
    return add_rows(out, block.row, msg)


def prepare_transpose(block: Block, weighted: bool) -> None:
    """Make the transposed tiles :func:`spmm_t` reads, in forward: made in backward, at its
    memory peak, their sorts' temporaries would add to it. ``weighted``: its weights come
    in CSR order (not :func:`dst_weights`'), so the tiles keep their order."""
    block.tiles(transposed=True, with_order=weighted)


def dst_weights(block: Block, values: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """``values[v]`` for every edge u->v of the block (``values``: one per destination row),
    in the order :func:`spmm` (``transposed``: :func:`spmm_t`) takes with ``ordered``."""
    tiles = block.on(values.device).tiles(transposed)
    return tiles.per_col(values) if transposed else tiles.per_row(values)


def _tiled_mm(tiles: Tiles, values: torch.Tensor | None, x: torch.Tensor, out: torch.Tensor | None = None,
              accumulate: bool = False) -> torch.Tensor:
    """The tiles' product with ``x`` (values in tile order, ones if None), tile after
    tile into one output: each tile reads only its own rows of ``x``. One tile (a product
    the tiles would not help, or too large for them) goes to the CPU kernel of our own
    where that runs (:mod:`.cpu_spmm`: it prefetches what no tile keeps in cache)."""
    if len(tiles.indptr) == 1 and cpu_spmm.usable(x, out, values, tiles.col, tiles.edges[-1]):
        out = x.new_empty((tiles.shape[0], x.shape[1])) if out is None else out
        return cpu_spmm.spmm_into(tiles.indptr[0], tiles.col, values, x, out, accumulate)
    for rows, a in tiles.matrices(values, x.dtype):
        out = _csr_mm(a, x[rows], out, accumulate)
        accumulate = True
    return out


def _csr_mm(a: torch.Tensor, x: torch.Tensor, out: torch.Tensor | None = None, accumulate: bool = False) -> torch.Tensor:
    """``a @ x`` for a sparse CSR ``a``, written into ``out`` (a fresh buffer if None; a
    strided view is fine), or added to it with ``accumulate``: ``@`` zero-fills its
    output and copies the product into it, a quarter of the time of the product itself
    (beta=0 ignores the buffer's contents)."""
    if torch.is_grad_enabled() and (a.requires_grad or x.requires_grad):  # differentiated through: no out=
        if out is None:
            return a @ x
        return out.add_(a @ x) if accumulate else out.copy_(a @ x)
    out = x.new_empty((a.shape[0], x.shape[1])) if out is None else out
    return torch.addmm(out, a, x, beta=1.0 if accumulate else 0.0, out=out)


def _heads(one, out: torch.Tensor) -> torch.Tensor:
    """``one(k, out[:, k])`` writes head ``k``'s rows into the output for every head: no
    per-head buffers, no stack."""
    for k in range(out.shape[1]):
        one(k, out[:, k])
    return out


def spmm_t(block: Block, g: torch.Tensor, weight: torch.Tensor | None, out: torch.Tensor | None = None,
           ordered: bool = False) -> torch.Tensor:
    """Transpose of :func:`spmm`: gradient rows for the block's source rows, written into
    ``out`` (``[num_src, ...]``, a strided view is fine) when given. ``ordered``: a weight
    per edge in the transposed tiles' order already (:func:`dst_weights`, kept by the caller)."""
    block = block.on(g.device)
    if ordered or _scalar_weight(weight):  # (a weight in tile order is one per edge)
        tiles = block.tiles(transposed=True, with_order=weight is not None and not ordered)
        values = weight if ordered or weight is None else _in_order(weight, tiles.order)
        flat = _tiled_mm(tiles, values, _flat(g), None if out is None else out.flatten(1))
        return out if out is not None else flat if g.dim() == 2 else flat.reshape(block.num_src, *g.shape[1:])
    if _per_head(weight, g):
        tiles = block.tiles(transposed=True, with_order=True)
        values = g.new_empty(block.num_edges)  # each head's weights in tile order, in turn
        return _heads(lambda k, o: _tiled_mm(tiles, _in_order(weight[:, k], tiles.order, values), g[:, k], o),
                      g.new_empty((block.num_src, *g.shape[1:])) if out is None else out)
    msg = g.index_select(0, block.row) * weight.reshape(*weight.shape, *([1] * (g.dim() - weight.dim())))
    out = g.new_zeros((block.num_src, *g.shape[1:])) if out is None else out.zero_()
    return add_rows(out, block.col, msg)


def _in_order(weight: torch.Tensor, order: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
    """``weight[order]``, written into ``into`` (a buffer reused across heads) where it may
    be: same dtype, and not differentiated through. (index_select: about twice as fast as
    ``weight[order]`` on a CPU.)"""
    if into is not None and weight.dtype == into.dtype and not (torch.is_grad_enabled() and weight.requires_grad):
        return torch.index_select(weight, 0, order, out=into)
    return weight.index_select(0, order)


def edge_dot(block: Block, g: torch.Tensor, x: torch.Tensor, weight_shape: torch.Size) -> torch.Tensor:
    """Gradient of the edge weights of :func:`spmm`: ``<g[v], x[u]>`` per edge u->v,
    summed over the dims the weight broadcast over. A weight per edge, or per edge and
    head, is a sampled dense product (torch's ``sampled_addmm`` on the CSR: no per-edge
    rows at all); other shapes work through the edges in chunks so the per-edge products
    never exceed :data:`EDGE_CHUNK_ELEMENTS`."""
    block = block.on(g.device)
    # (sampled_addmm refuses more entries than the dense product has: a tiny multigraph block)
    if 0 < block.num_edges <= block.num_dst * block.num_src and g.dtype == x.dtype:
        if len(weight_shape) == 1:
            return _sampled_dot(block, _flat(g), _flat(x))
        if len(weight_shape) == 2 and x.dim() == 3 and g.dim() == 3 and weight_shape[1] == x.shape[1]:
            # sampled_addmm wants contiguous operands (else it clones them): each head's
            # columns are copied into one pair of buffers, reused across heads, and its
            # products land in one reused buffer (out's own memory with one head).
            out = g.new_empty((block.num_edges, *weight_shape[1:]))
            g_k, x_k = g.new_empty((g.shape[0], g.shape[2])), x.new_empty((x.shape[0], x.shape[2]))
            values = out.view(-1) if x.shape[1] == 1 else g.new_empty(block.num_edges)
            for k in range(x.shape[1]):
                out[:, k] = _sampled_dot(block, g_k.copy_(g[:, k]), x_k.copy_(x[:, k]), values)  # (one head: a no-op)
            return out
    rest = math.prod(g.shape[1:]) // math.prod(weight_shape[1:])
    out = g.new_empty((block.num_edges, *weight_shape[1:]))
    step = max(1, EDGE_CHUNK_ELEMENTS // max(math.prod(g.shape[1:]), 1))
    for lo in range(0, block.num_edges, step):
        rows, cols = block.row[lo : lo + step], block.col[lo : lo + step]
        prod = g[rows] * x[cols]
        out[lo : lo + step] = prod.reshape(rows.numel(), *weight_shape[1:], rest).sum(-1)
    return out


def _sampled_dot(block: Block, g: torch.Tensor, x: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
    """``<g[v], x[u]>`` for every edge of the block, in CSR order (``g [num_dst, F]``,
    ``x [num_src, F]``), written into ``into`` (``[num_edges]``, contiguous) when given."""
    if torch.is_grad_enabled() and (g.requires_grad or x.requires_grad):  # differentiated through: no out=
        pattern = csr_tensor(block.indptr, block.col, g.new_zeros(block.num_edges), (block.num_dst, block.num_src))
        return torch.sparse.sampled_addmm(pattern, g, x.t(), beta=0.0).values()
    values = g.new_zeros(block.num_edges) if into is None else into.zero_()
    pattern = csr_tensor(block.indptr, block.col, values, (block.num_dst, block.num_src))
    # Into the pattern itself: torch would otherwise copy it (indices and all) into a new
    # result. Its values must be zeros, not garbage: beta=0 does not mask NaNs here.
    torch.sparse.sampled_addmm(pattern, g, x.t(), beta=0.0, out=pattern)
    return values


class MaxState:
    """Running max over blocks with the position of the winner, for the max reduction.

    Ties go to the smallest global source id, so the winner (and so the gradient) is the
    same however the nodes are split across workers. Empty neighbourhoods give 0.
    """

    def __init__(self, num_dst: int, tail: tuple[int, ...], dtype: torch.dtype, device: torch.device | None = None):
        self.tail = tail
        width = math.prod(tail)
        self.value = torch.full((num_dst, width), float("-inf"), dtype=dtype, device=device)
        self.gid = torch.full((num_dst, width), _NO_ROW, dtype=torch.long, device=device)
        self.pos = torch.full((num_dst, width), -1, dtype=torch.long, device=device)

    def update(self, block: Block, x: torch.Tensor, offset: int) -> None:
        """Fold in one block whose source rows sit at ``offset..`` of the concatenated halos."""
        if block.num_edges == 0:
            return
        block = block.on(x.device)
        bmax, brow = self.block_max(block, x)
        has = brow != _NO_ROW
        bgid = torch.where(has, block.src_gids[brow.clamp(max=max(block.num_src - 1, 0))], _NO_ROW)
        better = has & ((bmax > self.value) | ((bmax == self.value) & (bgid < self.gid)))
        self.value = torch.where(better, bmax, self.value)
        self.gid = torch.where(better, bgid, self.gid)
        self.pos = torch.where(better, brow + offset, self.pos)

    def block_max(self, block: Block, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per destination row and feature of one block: the max over its in-edges and the
        smallest source row reaching it (``_NO_ROW`` where there is no in-edge)."""
        msg = _flat(x).index_select(0, block.col)
        idx = block.row.unsqueeze(1).expand_as(msg)
        bmax = torch.full_like(self.value, float("-inf")).scatter_reduce(0, idx, msg, "amax")
        # Source rows of a block are sorted by global id, so the smallest row among the
        # tied edges is the smallest global id.
        tied = msg == bmax.index_select(0, block.row)
        cand = torch.where(tied, block.col.long().unsqueeze(1).expand_as(msg), _NO_ROW)
        return bmax, torch.full_like(self.pos, _NO_ROW).scatter_reduce(0, idx, cand, "amin")

    def result(self) -> torch.Tensor:
        out = torch.where(self.pos >= 0, self.value, torch.zeros_like(self.value))
        return out.reshape(-1, *self.tail)


def max_grad(pos: torch.Tensor, g: torch.Tensor, offset: int, num_src: int) -> torch.Tensor:
    """Gradient rows for the sources at ``offset..offset+num_src`` from the saved winners."""
    g2 = _flat(g)
    width = g2.shape[1]
    hit = (pos >= offset) & (pos < offset + num_src)
    feat = torch.arange(width, device=pos.device).expand_as(pos)
    flat_index = (pos[hit] - offset) * width + feat[hit]
    out = g2.new_zeros(num_src * width).index_add_(0, flat_index, g2[hit])
    return out.reshape(num_src, *g.shape[1:])


def sddmm(block: Block, a: torch.Tensor, b: torch.Tensor | None, op: str) -> torch.Tensor:
    """Per-edge value from ``a`` at the source and ``b`` at the destination, in CSR order;
    ``copy_u`` is ``a`` at the source alone (``b`` is None)."""
    block = block.on(a.device)
    au = a.index_select(0, block.col)
    if op == "copy_u":
        return au
    bv = b.index_select(0, block.row)
    if op == "add":
        return au + bv
    if op == "sub":
        return au - bv
    if op == "mul":
        return au * bv
    return (au * bv).sum(-1)  # dot


def sddmm_grads(
    block: Block, g: torch.Tensor, a: torch.Tensor | None, b: torch.Tensor, op: str, want_a: bool, want_b: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of :func:`sddmm` for the block's source rows and for the local rows.

    ``a`` (the source rows) is only read for ``mul``/``dot`` when ``want_b``; callers may
    pass None otherwise -- that is what lets add/sub skip the re-fetch.
    """
    block = block.on(g.device)
    if op == "dot":
        g = g.unsqueeze(-1)
    ga = gb = None
    if want_a:
        msg = g if op in ("add", "sub", "copy_u") else g * b.index_select(0, block.row)
        ga = add_rows(msg.new_zeros((block.num_src, *msg.shape[1:])), block.col, msg)
    if want_b:
        if op == "add":
            msg = g
        elif op == "sub":
            msg = -g
        else:
            msg = g * a.index_select(0, block.col)
        gb = add_rows(msg.new_zeros((block.num_dst, *msg.shape[1:])), block.row, msg)
    return ga, gb


class AttentionState:
    """Online softmax-weighted aggregation over blocks (exact, as in FlashAttention).

    Per destination row and head it keeps the running max ``m`` of the scores seen so far,
    the running sum ``l`` of ``exp(score - m)`` and the running weighted sum ``acc``; when a
    block raises the max, what was accumulated is rescaled by ``exp(m_old - m_new)``. No
    per-edge tensor outlives the block it belongs to.
    """

    def __init__(self, num_dst: int, heads: int, channels: int, dtype: torch.dtype, device: torch.device | None = None):
        self.m = torch.full((num_dst, heads), float("-inf"), dtype=dtype, device=device)
        self.l = torch.zeros((num_dst, heads), dtype=dtype, device=device)
        self.acc = torch.zeros((num_dst, heads, channels), dtype=dtype, device=device)

    def update(
        self,
        block: Block,
        h: torch.Tensor,
        a_src: torch.Tensor,
        a_dst: torch.Tensor,
        negative_slope: float,
        keep: torch.Tensor | None,
        a_edge: torch.Tensor | None = None,
    ) -> None:
        """Fold in one block: source features ``h [num_src, H, C]`` and scores ``a_src
        [num_src, H]``, destination scores ``a_dst [num_dst, H]``, the per-edge scores
        ``a_edge [E_b, H]`` in CSR order (or None; edge score: ``leaky_relu(a_src[u] +
        a_dst[v] + a_edge[e])``) and the dropout multiplier ``keep [E_b, H]`` (or None)."""
        if block.num_edges == 0:
            return
        block = block.on(h.device)
        for r0, r1 in block.row_chunks(_chunk_edges(h.shape[1])):
            # Rows are independent: each range updates its slice of the state in place,
            # computing exactly what one pass over the whole block would.
            sub, lo, hi = block.rows(r0, r1), int(block.indptr[r0]), int(block.indptr[r1])
            m, l, acc = self.m[r0:r1], self.l[r0:r1], self.acc[r0:r1]
            pre = _pre_scores(sub, a_src, a_dst[r0:r1], None if a_edge is None else a_edge[lo:hi])
            score = torch.nn.functional.leaky_relu(pre, negative_slope)
            del pre
            idx = sub.row.unsqueeze(1).expand_as(score)
            block_max = torch.full_like(m, float("-inf")).scatter_reduce(0, idx, score, "amax")
            m_new = torch.maximum(m, block_max)
            # Rows that have seen no edge yet keep m = -inf; rescaling them would give nan.
            rescale = torch.where(torch.isinf(m_new), torch.ones_like(m_new), torch.exp(m - m_new))
            e = torch.exp(score - m_new.index_select(0, sub.row))
            l.mul_(rescale).add_(add_rows(torch.zeros_like(l), sub.row, e))
            spmm(sub, h, e if keep is None else e * keep[lo:hi], into=acc.mul_(rescale.unsqueeze(-1)))
            m.copy_(m_new)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The output ``[n, H, C]`` (0 where a row has no in-edge) and the per-row
        log-sum-exp of the scores, which is all backward needs to recompute probabilities."""
        seen = self.l > 0
        out = self.acc / torch.where(seen, self.l, torch.ones_like(self.l)).unsqueeze(-1)
        lse = torch.where(seen, self.m + torch.log(torch.where(seen, self.l, torch.ones_like(self.l))), 0.0)
        return out, lse


def _pre_scores(block: Block, a_src: torch.Tensor, a_dst: torch.Tensor, a_edge: torch.Tensor | None) -> torch.Tensor:
    """``a_src[u] + a_dst[v] (+ a_edge[e])`` per edge of the block, summed in that order
    (PyG's), so every executor rounds alike."""
    pre = a_src.index_select(0, block.col) + a_dst.index_select(0, block.row)
    return pre if a_edge is None else pre + a_edge


def attention_grads(
    block: Block,
    h: torch.Tensor,
    a_src: torch.Tensor,
    a_dst: torch.Tensor,
    negative_slope: float,
    keep: torch.Tensor | None,
    lse: torch.Tensor,
    d_out: torch.Tensor,
    delta: torch.Tensor,
    a_edge: torch.Tensor | None = None,
    into: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients for one block (inputs as for :meth:`AttentionState.update`) from the
    recomputed probabilities ``P = exp(score - lse[v])``.

    ``delta[v] = sum_c dOut[v] * Out[v]`` is FlashAttention's D: the softmax backward's
    row term, without storing P. Returns (grad of the block's source features, of its
    source scores, of the local destination scores, of the block's edge scores -- None
    without ``a_edge``). With ``into`` (``[num_src, H*C + H]``, the scores' dtype), the
    first two are written into its columns -- the payload a worker sends its peers, with
    no copy -- and returned as views of it. ``into`` may be the block's own payload, ``h``
    and ``a_src`` its columns: each is written only once it has been read for the last time.
    """
    block = block.on(h.device)
    heads = h.shape[1]
    dtype = functools.reduce(torch.promote_types, [t.dtype for t in (a_src, a_dst, a_edge) if t is not None])
    weights = torch.empty((block.num_edges, heads), dtype=dtype, device=h.device)  # with d_w below: two [E, H]
    width = heads * h.shape[2]
    d_h_out = None if into is None else into[:, :width].view(block.num_src, heads, h.shape[2])
    d_src = torch.zeros((block.num_src, heads), dtype=dtype, device=h.device)  # (into's columns may be a_src)
    d_dst = torch.zeros((block.num_dst, heads), dtype=dtype, device=h.device)
    # dP = <dOut[v], h[u]> for the whole block at once: sampled_addmm copies each head's
    # columns of both to contiguous buffers, once per block here rather than once per row
    # range. Each range turns its slice into dScore in place; with edge scores it ends as
    # their gradient (no second [E, H] tensor).
    d_w = edge_dot(block, d_out, h, weights.shape).to(dtype)
    for r0, r1 in block.row_chunks(_chunk_edges(heads)):
        sub, lo, hi = block.rows(r0, r1), int(block.indptr[r0]), int(block.indptr[r1])
        pre = _pre_scores(sub, a_src, a_dst[r0:r1], None if a_edge is None else a_edge[lo:hi])
        score = torch.nn.functional.leaky_relu(pre, negative_slope)
        p = torch.exp(score - lse[r0:r1].index_select(0, sub.row))
        del score
        chunk_keep = None if keep is None else keep[lo:hi]
        weights[lo:hi] = p if chunk_keep is None else p * chunk_keep
        d_score = d_w[lo:hi]
        if chunk_keep is not None:
            d_score.mul_(chunk_keep)
        d_score.sub_(delta[r0:r1].index_select(0, sub.row)).mul_(p)
        del p
        d_pre = torch.where(pre > 0, d_score, d_score * negative_slope)
        add_rows(d_src, sub.col, d_pre)
        d_dst[r0:r1] = add_rows(torch.zeros_like(d_dst[r0:r1]), sub.row, d_pre)
        if a_edge is not None:
            d_score.copy_(d_pre)
    # Without edge scores the dot products are spent: let them go (the last range's views
    # too) before spmm_t makes its [num_src, H, C] buffer, the largest of this backward.
    d_edge, d_w, d_score = (None if a_edge is None else d_w), None, None
    d_h = spmm_t(block, d_out, weights, d_h_out)
    if into is not None:
        d_src = into[:, width:].copy_(d_src)
    return d_h, d_src, d_dst, d_edge


def add_rows(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``out.index_add_(0, index, src)``, the index as int64: for an int32 index (a
    block's) torch's CPU index_add_ takes a row-at-a-time path, 7-13x slower for rows of
    1 to 4 values (torch 2.13; GAT's score gradients spent 15% of its step there). The
    copy is a block's or a row range's index, and the sums are the same, in index order."""
    return out.index_add_(0, index.long(), src)


def row_blocks(t: torch.Tensor):
    """Slices of ``t``'s rows, each of at most :data:`EDGE_CHUNK_ELEMENTS` entries (one row
    at least): what a row-wise product is computed in, so its temporaries stay bounded."""
    step = max(1, EDGE_CHUNK_ELEMENTS // max(1, math.prod(t.shape[1:])))
    return (slice(lo, lo + step) for lo in range(0, t.shape[0], step))


def _chunk_edges(heads: int) -> int:
    """Edges per row range of the attention kernels: EDGE_CHUNK_ELEMENTS scores."""
    return max(1, EDGE_CHUNK_ELEMENTS // max(heads, 1))


# -- Compressed communication ------------------------------------------------------------
#
# Rows crossing workers are quantized to `bits` per value and packed into bytes (the layout
# is the contract the Triton kernels of codegen/quantize_gen.py follow bit for bit):
#
# * per row r: lo[r] = min, scale[r] = (max - min) / (2**bits - 1), both float32; a
#   constant row has scale 0 and every q = 0;
# * q = clamp(floor((x - lo) / scale + 0.5), 0, 2**bits - 1) in float32 (round half up), or
#   + noise instead of + 0.5 for stochastic rounding (noise: float32 uniforms in [0, 1));
# * value j of a row goes to byte j // (8 // bits) at bit (j % (8 // bits)) * bits, lowest
#   bits first; padding bits are 0;
# * x_hat = lo + q * scale, evaluated in float64 (the product is exact there, so the value
#   does not depend on whether a compiler fuses the multiply-add), rounded to float32 and
#   then to the requested dtype (float64 keeps the float64 value).
#
# Inputs must be finite and their row range must fit float32 (max - min not overflowing).

QUANT_BITS = (1, 2, 4, 8)


@dataclass
class Packed:
    """Quantized rows as they cross the wire: ``data`` uint8 ``[n, ceil(width * bits / 8)]``,
    ``lo`` and ``scale`` float32 ``[n]``."""

    data: torch.Tensor
    lo: torch.Tensor
    scale: torch.Tensor
    bits: int
    width: int  # values per row (F), needed to drop the padding on unpack

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: the packed values plus 4 bytes each of ``lo`` and ``scale`` per row."""
        return self.data.numel() * self.data.element_size() + 4 * (self.lo.numel() + self.scale.numel())


def packed_row_bytes(width: int, bits: int) -> int:
    return -(-width * bits // 8)


def pack_prepare(
    x: torch.Tensor, bits: int, noise: torch.Tensor | None = None, lo_scale: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Validate :func:`pack`'s arguments; returns ``x`` as ``[n, F]`` (its own dtype),
    ``noise`` as float32 ``[n, F]`` (or None), and the rows' ``lo`` and ``scale``. Shared by
    the Triton pack, so that both compute ``lo``/``scale`` with the same torch code.
    ``lo_scale``: each row's ``lo`` and ``scale`` (float32 ``[n]``) to use instead of its
    min and max (values outside are clamped)."""
    if bits not in QUANT_BITS or isinstance(bits, bool):
        raise ValueError(f"bits must be one of {QUANT_BITS}, got {bits!r}")
    if not x.is_floating_point():
        raise ValueError(f"pack takes floating point rows, got {x.dtype}")
    x2 = _flat(x)
    n, width = x2.shape
    if noise is not None:
        if noise.numel() != n * width:
            raise ValueError(f"noise must have one value per element of x ({n} x {width}), got shape {tuple(noise.shape)}")
        noise = noise.reshape(n, width).to(torch.float32)
    if width == 0:  # aminmax refuses an empty dimension
        lo = torch.zeros(n, dtype=torch.float32, device=x.device)
        return x2, noise, lo, lo.clone()
    if lo_scale is not None:
        lo, scale = (t.to(torch.float32).reshape(n) for t in lo_scale)
        return x2, noise, lo, scale
    lo, hi = torch.aminmax(x2.to(torch.float32), dim=1)
    return x2, noise, lo, (hi - lo) / (2**bits - 1)


def pack(
    x: torch.Tensor, bits: int, noise: torch.Tensor | None = None, lo_scale: tuple[torch.Tensor, torch.Tensor] | None = None
) -> Packed:
    """Quantize the rows of ``x`` (``[n, F]``, or ``[n, ...]`` seen as ``[n, prod(...)]``) to
    ``bits`` per value and pack them (layout above). ``noise``: uniforms in [0, 1) of
    ``x``'s size for stochastic rounding; None rounds half up. ``lo_scale``: see
    :func:`pack_prepare`."""
    x2, noise, lo, scale = pack_prepare(x, bits, noise, lo_scale)
    n, width = x2.shape
    per = 8 // bits
    nb = packed_row_bytes(width, bits)
    has_range = scale > 0
    # Divide by 1 where the row is constant (q is forced to 0 there) to keep inf/nan out.
    t = (x2.to(torch.float32) - lo[:, None]) / torch.where(has_range, scale, 1.0)[:, None]
    t = t + (0.5 if noise is None else noise)
    q = torch.floor(t).clamp_(0, 2**bits - 1)
    q = torch.where(has_range[:, None], q, 0.0).to(torch.int32)
    q = torch.nn.functional.pad(q, (0, nb * per - width))  # padding values are 0
    shifts = torch.arange(per, device=x.device, dtype=torch.int32) * bits
    data = (q.reshape(n, nb, per) << shifts).sum(dim=2).to(torch.uint8)
    return Packed(data, lo, scale, bits, width)


def unpack(p: Packed, dtype: torch.dtype) -> torch.Tensor:
    """The rows of ``p`` as ``[n, width]`` of ``dtype``: ``lo + q * scale`` (rounding as above)."""
    n, nb = p.data.shape
    per = 8 // p.bits
    shifts = torch.arange(per, device=p.data.device, dtype=torch.int32) * p.bits
    q = (p.data.to(torch.int32)[:, :, None] >> shifts) & (2**p.bits - 1)
    q = q.reshape(n, nb * per)[:, : p.width]
    x_hat = p.lo.double()[:, None] + q.double() * p.scale.double()[:, None]
    return x_hat.to(dtype) if dtype == torch.float64 else x_hat.float().to(dtype)
