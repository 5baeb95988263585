"""Partitioned ops between node rows and edges: :func:`~sarcompile.ir.ops.sddmm` and its
source side alone, :func:`~sarcompile.ir.ops.gather_src` (node rows to edges), and
:func:`~sarcompile.ir.ops.edge_reduce_src` (edges to source rows)."""

from __future__ import annotations

import math

import torch

from sarcompile.codegen import torch_kernels
from sarcompile.codegen.torch_kernels import add_rows
from sarcompile.graph.shard import ShardGraph
from sarcompile.ir import ops as ir
from sarcompile.ir.vocab import LinkPolicy, Strategy
from sarcompile.runtime.ops.halo import HaloRounds, edge_slice
from sarcompile.runtime.rounds import run_rounds

__all__ = ["sar_sddmm", "sar_gather_src", "sar_edge_reduce_src"]


class _SarSddmm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, rounds: HaloRounds, op: str):
        shard = rounds.shard
        pieces: dict[int, torch.Tensor] = {}

        def visit(q: int, ab: torch.Tensor) -> None:
            pieces[q] = torch_kernels.sddmm(shard.blocks[q], ab, b, op)

        rounds.forward(visit, a, op=ir.sddmm, args={"op": op},
                       wants={"a": ctx.needs_input_grad[0], "b": ctx.needs_input_grad[1]})
        # Only mul and dot read the inputs in backward (each the other's); the rest needs shapes.
        product = op in ("mul", "dot")
        ctx.save_for_backward(a if product and ctx.needs_input_grad[1] else None,
                              b if product and ctx.needs_input_grad[0] else None)
        ctx.like = [None if t is None else (t.new_empty((0,)), t.shape) for t in (a, b)]
        ctx.rounds, ctx.op = rounds, op
        return pieces[0] if shard.world_size == 1 else torch.cat([pieces[q] for q in range(shard.world_size)])

    @staticmethod
    def backward(ctx, g):
        rounds, op = ctx.rounds, ctx.op
        shard = rounds.shard
        a, b = ctx.saved_tensors
        want_a, want_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        (like_a, shape_a), like_b = ctx.like
        ga = like_a.new_zeros(shape_a) if want_a else None
        gb = like_b[0].new_zeros(like_b[1]) if want_b else None

        def visit(q: int, ab: torch.Tensor | None):
            ga_q, gb_q = torch_kernels.sddmm_grads(shard.blocks[q], edge_slice(g, shard, q), rounds.block(q, a, ab), b,
                                                   op, want_a, want_b)
            if gb_q is not None:
                gb.add_(gb_q)
            return ga_q

        if want_a or want_b:
            rounds.backward(visit, fetch=lambda: a.detach(), push_into=ga)
        return ga, gb, None, None


@ir.gather_src.definition.implement
def sar_gather_src(
    shard: ShardGraph, x: torch.Tensor, *, strategy: Strategy = Strategy.REMAT, in_flight: int = 1,
    comm: LinkPolicy | None = None,
) -> torch.Tensor:
    """Partitioned :func:`sarcompile.ir.ops.gather_src`: sddmm's exchange with the source side only."""
    return _SarSddmm.apply(x, None, HaloRounds.open(shard, "sddmm(copy_u)", strategy, in_flight, comm), "copy_u")


@ir.sddmm.definition.implement
def sar_sddmm(
    shard: ShardGraph,
    a: torch.Tensor,
    b: torch.Tensor,
    op: str,
    *,
    strategy: Strategy = Strategy.REMAT,
    in_flight: int = 1,
    comm: LinkPolicy | None = None,
) -> torch.Tensor:
    """Partitioned :func:`sarcompile.ir.ops.sddmm`; the result is in shard edge order."""
    return _SarSddmm.apply(a, b, HaloRounds.open(shard, f"sddmm({op})", strategy, in_flight, comm), op)


class _SarEdgeReduceSrc(torch.autograd.Function):
    """``out[u] = sum_{u->v} e_uv`` (mean: over the out-degree) onto source rows.

    Forward: each worker sums its edges' values per source row of every block; the local
    block's sums stay, each remote block's go to the block's owner, which adds them (one
    round per peer, as a halo op's backward pushes gradients; the mean pushes a count
    column along). Backward: ``d e_uv = d out[u]`` (over the count for mean), so every
    worker fetches the halo rows of the output's gradient, as ``gather_src`` does."""

    @staticmethod
    def forward(ctx, e, shard: ShardGraph, reduce: str):
        flat = e.reshape(e.shape[0], math.prod(e.shape[1:]))  # (not -1: a shard may have no edges)
        if reduce == "mean":
            flat = torch.cat([flat, flat.new_ones((flat.shape[0], 1))], 1)
        out = flat.new_zeros((shard.num_src_nodes, flat.shape[1]))

        def visit(q: int, _rows: None) -> torch.Tensor:
            block = shard.blocks[q].on(flat.device)
            return add_rows(flat.new_zeros((block.num_src, flat.shape[1])), block.col, edge_slice(flat, shard, q))

        run_rounds(shard, visit, push_into=out, phase="forward", what=f"edge_reduce_src({reduce})")
        count = None
        if reduce == "mean":
            out, count = out[:, :-1], out[:, -1:].clamp(min=1)
            out = out / count
        ctx.shard, ctx.count, ctx.shape = shard, count, e.shape
        return out.reshape((shard.num_src_nodes, *e.shape[1:]))

    @staticmethod
    def backward(ctx, g):
        shard = ctx.shard
        g = g.reshape(shard.num_src_nodes, math.prod(ctx.shape[1:]))  # (not -1: a shard may have no nodes)
        if ctx.count is not None:
            g = g / ctx.count
        pieces: dict[int, torch.Tensor] = {}

        def visit(q: int, gb: torch.Tensor) -> None:
            pieces[q] = gb[shard.blocks[q].on(gb.device).col]

        run_rounds(shard, visit, fetch=g.contiguous(), what="edge_reduce_src backward", phase="backward")
        ge = torch.cat([pieces[q] for q in range(shard.world_size)]).reshape(ctx.shape)
        ctx.count = None
        return ge, None, None


@ir.edge_reduce_src.definition.implement
def sar_edge_reduce_src(shard: ShardGraph, e: torch.Tensor, reduce: str) -> torch.Tensor:
    """Partitioned :func:`sarcompile.ir.ops.edge_reduce_src`; ``e`` in shard order."""
    return _SarEdgeReduceSrc.apply(e, shard, reduce)
