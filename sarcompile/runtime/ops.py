"""Partitioned ops: sequential aggregation over a shard's blocks, with explicit saving and
rematerialization in backward. The partition pass rewrites the IR ops into these.

Strategies (chosen by :mod:`sarcompile.passes.strategy`):

* ``direct``  -- forward frees each remote block after use; backward sends the gradient of
  remote rows straight to their owners without fetching anything (sum/mean, max via the
  saved winner positions, sddmm add/sub).
* ``remat``   -- forward frees each remote block; backward fetches the blocks again, one at
  a time, because its gradient formula reads the remote inputs (edge weights, mul/dot).

Whatever the label, the runtime stays exact: an op whose backward reads remote inputs
that were not kept fetches them again, so ``direct`` on such an op behaves as ``remat``.
* ``stash``   -- forward keeps the remote blocks for backward (no re-fetch, more memory).
* ``oneshot`` -- every halo is fetched at once and kept (classic domain parallelism).
"""

from __future__ import annotations

import torch

from ..codegen import torch_kernels as K
from .comm import run_rounds
from .shard import ShardGraph

__all__ = ["STRATEGIES", "sar_spmm", "sar_sddmm"]

STRATEGIES = ("direct", "remat", "stash", "oneshot")


def _lookahead(shard: ShardGraph, strategy: str) -> int:
    return max(shard.world_size - 1, 1) if strategy == "oneshot" else 1


def _keeps_blocks(strategy: str) -> bool:
    return strategy in ("stash", "oneshot")


def _offsets(shard: ShardGraph) -> list[int]:
    """Start of each block's source rows in the (virtual) concatenation of all halos."""
    out, acc = [], 0
    for b in shard.blocks:
        out.append(acc)
        acc += b.num_src
    return out


def _edge_slice(t: torch.Tensor | None, shard: ShardGraph, q: int) -> torch.Tensor | None:
    return None if t is None else t[shard.edge_ptr[q] : shard.edge_ptr[q + 1]]


def _bcast(deg: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return deg.clamp(min=1).to(like.dtype).reshape(-1, *([1] * (like.dim() - 1)))


class _SarSpmm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, shard: ShardGraph, reduce: str, strategy: str):
        tail = tuple(x.shape[1:])
        kept: dict[int, torch.Tensor] = {}
        out = x.new_zeros((shard.num_nodes, *tail))
        state = K.MaxState(shard.num_nodes, tail, x.dtype) if reduce == "max" else None
        offsets = _offsets(shard)

        def visit(q: int, xb: torch.Tensor) -> None:
            if _keeps_blocks(strategy):
                kept[q] = xb
            if state is not None:
                state.update(shard.blocks[q], xb, offsets[q])
            else:
                out.add_(K.spmm(shard.blocks[q], xb, _edge_slice(weight, shard, q)))

        run_rounds(shard, visit, fetch=x, lookahead=_lookahead(shard, strategy), what=f"spmm({reduce})")
        if state is not None:
            out = state.result()
            ctx.save_for_backward(x, weight, state.pos)
        else:
            if reduce == "mean":
                out = out / _bcast(shard.in_degrees(), out)
            ctx.save_for_backward(x, weight)
        ctx.shard, ctx.reduce, ctx.strategy, ctx.kept = shard, reduce, strategy, kept
        return out

    @staticmethod
    def backward(ctx, g):
        shard, reduce, strategy = ctx.shard, ctx.reduce, ctx.strategy
        x, weight, *pos = ctx.saved_tensors
        want_x, want_w = ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1]
        gx = torch.zeros_like(x) if want_x else None
        gw = torch.zeros_like(weight) if want_w else None
        if reduce == "mean":
            g = g / _bcast(shard.in_degrees(), g)
        offsets = _offsets(shard)
        kept = ctx.kept

        def visit(q: int, xb: torch.Tensor | None):
            block = shard.blocks[q]
            if want_w:
                xb = x if q == shard.rank else kept.get(q, xb)
                lo, hi = shard.edge_ptr[q], shard.edge_ptr[q + 1]
                gw[lo:hi] = K.edge_dot(block, g, xb, weight.shape)
            if not want_x:
                return None
            if reduce == "max":
                return K.max_grad(pos[0], g, offsets[q], block.num_src)
            return K.spmm_t(block, g, _edge_slice(weight, shard, q))

        refetch = want_w and not _keeps_blocks(strategy)
        if want_x or want_w:
            run_rounds(
                shard,
                visit,
                fetch=x.detach() if refetch else None,
                push_into=gx,
                phase="backward",
                what=f"spmm({reduce}) backward",
            )
        ctx.kept = None
        return gx, gw, None, None, None


class _SarSddmm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, shard: ShardGraph, op: str, strategy: str):
        kept: dict[int, torch.Tensor] = {}
        pieces: dict[int, torch.Tensor] = {}

        def visit(q: int, ab: torch.Tensor) -> None:
            if _keeps_blocks(strategy):
                kept[q] = ab
            pieces[q] = K.sddmm(shard.blocks[q], ab, b, op)

        run_rounds(shard, visit, fetch=a, lookahead=_lookahead(shard, strategy), what=f"sddmm({op})")
        ctx.save_for_backward(a, b)
        ctx.shard, ctx.op, ctx.strategy, ctx.kept = shard, op, strategy, kept
        return torch.cat([pieces[q] for q in range(shard.world_size)])

    @staticmethod
    def backward(ctx, g):
        shard, op = ctx.shard, ctx.op
        a, b = ctx.saved_tensors
        want_a, want_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        ga = torch.zeros_like(a) if want_a else None
        gb = torch.zeros_like(b) if want_b else None
        reads_a = want_b and op in ("mul", "dot")
        kept = ctx.kept

        def visit(q: int, ab: torch.Tensor | None):
            ab = a if q == shard.rank else kept.get(q, ab)
            ga_q, gb_q = K.sddmm_grads(shard.blocks[q], _edge_slice(g, shard, q), ab, b, op, want_a, want_b)
            if gb_q is not None:
                gb.add_(gb_q)
            return ga_q

        refetch = reads_a and not _keeps_blocks(ctx.strategy)
        if want_a or want_b:
            run_rounds(
                shard,
                visit,
                fetch=a.detach() if refetch else None,
                push_into=ga,
                phase="backward",
                what=f"sddmm({op}) backward",
            )
        ctx.kept = None
        return ga, gb, None, None, None


def sar_spmm(
    shard: ShardGraph, x: torch.Tensor, reduce: str, edge_weight: torch.Tensor | None = None, *, strategy: str = "direct"
) -> torch.Tensor:
    """Partitioned :func:`sarcompile.ops.spmm`; edge weights in shard order."""
    return _SarSpmm.apply(x, edge_weight, shard, reduce, strategy)


def sar_sddmm(shard: ShardGraph, a: torch.Tensor, b: torch.Tensor, op: str, *, strategy: str = "direct") -> torch.Tensor:
    """Partitioned :func:`sarcompile.ops.sddmm`; the result is in shard edge order."""
    return _SarSddmm.apply(a, b, shard, op, strategy)
