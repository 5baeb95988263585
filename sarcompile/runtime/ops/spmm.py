"""Partitioned aggregation (:func:`sarcompile.ir.ops.spmm`): each block's rows summed,
averaged or maxed into the destination rows, with its backward's rounds."""

from __future__ import annotations

from types import ModuleType
from typing import Callable

import torch

from sarcompile.codegen import kernels_for
from sarcompile.graph.graph import Block
from sarcompile.graph.shard import ShardGraph
from sarcompile.ir import ops as ir
from sarcompile.ir.vocab import LinkPolicy, Strategy
from sarcompile.runtime.ops.halo import HaloRounds, edge_slice, offsets, per_row
from sarcompile.runtime.reuse import reused

__all__ = ["sar_spmm"]


def _mean_weights(shard: ShardGraph, like: torch.Tensor, kernels: ModuleType,
                  transposed: bool = False) -> Callable[[Block], torch.Tensor]:
    """The mean's ``1/deg`` as a block's edge weights, in ``like``'s dtype and on its
    device, in the order ``kernels``' product (``transposed``: its transpose's) takes them
    (``ordered``): made once per shard, block, dtype and order and kept (an element per
    edge; spreading and permuting them anew on every call took 7% of an RGCN epoch). Kept
    by the shard, not the block: a graph with self-loops shares its remote blocks with the
    graph without, whose degrees differ."""
    cache = shard.__dict__.setdefault("_mean_weights", {})

    def weights(block: Block) -> torch.Tensor:
        key = (id(block), like.dtype, like.device, kernels.__name__, transposed)
        if key not in cache:
            inv_deg = 1.0 / shard.in_degrees()[: block.num_dst].clamp(min=1).to(like.device, like.dtype)
            cache[key] = (block, kernels.dst_weights(block, inv_deg, transposed))  # (the block too: its id stays its own)
        return cache[key][1]

    return weights


class _SarSpmm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, rounds: HaloRounds, reduce: str, executor: str, into=None):
        shard = rounds.shard
        K = ctx.K = kernels_for(executor, x.device, f"spmm({reduce})")
        wants = {"x": ctx.needs_input_grad[0], "edge_weight": weight is not None and ctx.needs_input_grad[1]}
        tail = tuple(x.shape[1:])
        acc: dict[str, torch.Tensor] = {}
        state = K.MaxState(shard.num_nodes, tail, x.dtype, x.device) if reduce == "max" else None
        starts = offsets(shard)
        # Added into a buffer that holds more than sums: the mean's 1/deg goes on the edges
        mean_weights = _mean_weights(shard, x, K) if into is not None and reduce == "mean" else None
        if into is not None:
            acc["out"] = into

        def visit(q: int, xb: torch.Tensor) -> None:
            block = shard.blocks[q].on(x.device)
            if wants["x"] and state is None:  # (backward's weights: the mean's made for it, or the given ones)
                K.prepare_transpose(block, weighted=weight is not None)
            w = edge_slice(weight, shard, q) if mean_weights is None else mean_weights(block)
            if state is not None:
                state.update(block, xb, starts[q])
            else:  # the local block comes first: its sums are the buffer, unless given one
                acc["out"] = K.spmm(block, xb, w, into=acc.get("out"), ordered=mean_weights is not None)

        rounds.forward(visit, x, op=ir.spmm, args={"reduce": reduce}, wants=wants)
        # x itself only for the edge weights' gradient (<g[v], x[u]>); the rest needs its shape
        keep_x = x if wants["edge_weight"] else None
        if state is not None:
            out = state.result()
            ctx.save_for_backward(keep_x, weight, state.pos)
        else:
            out = acc["out"]
            if reduce == "mean" and into is None:
                out.div_(per_row(shard.in_degrees(), out))
            ctx.save_for_backward(keep_x, weight)
        if into is not None:
            ctx.mark_dirty(into)
        ctx.rounds, ctx.reduce = rounds, reduce
        return out

    @staticmethod
    def backward(ctx, g):
        rounds, reduce, K = ctx.rounds, ctx.reduce, ctx.K
        shard = rounds.shard
        x, weight, *pos = ctx.saved_tensors
        want_x, want_w = ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1]
        g_into = g if ctx.needs_input_grad[5] else None  # d(into + sums)/d(into): g as it is
        gw = torch.zeros_like(weight) if want_w else None
        # The mean's 1/deg: as the edges' weights where there are none (no [n, F] copy of g)
        per_edge = reduce == "mean" and weight is None
        if reduce == "mean" and not per_edge:
            g = g / per_row(shard.in_degrees(), g)
        mean_weights = _mean_weights(shard, g, K, transposed=True) if per_edge else None
        starts = offsets(shard)

        def grad_x(q: int) -> torch.Tensor:
            block = shard.blocks[q].on(g.device)
            if reduce == "max":
                return K.max_grad(pos[0], g, starts[q], block.num_src)
            # A remote block's rows are pushed to their owner straight from this buffer.
            out = None if q == shard.rank else g.new_empty((block.num_src, *g.shape[1:]))
            if per_edge:
                return K.spmm_t(block, g, mean_weights(block), out, ordered=True)
            return K.spmm_t(block, g, edge_slice(weight, shard, q), out)

        def visit(q: int, xb: torch.Tensor | None):
            if want_w:
                lo, hi = shard.edge_ptr[q], shard.edge_ptr[q + 1]
                gw[lo:hi] = K.edge_dot(shard.blocks[q], g, rounds.block(q, x, xb), weight.shape)
            return grad_x(q) if want_x and q != shard.rank else None

        gx = None
        if want_x or want_w:
            # The local block's gradient is the buffer the peers' pushes add into (no zeroed
            # copy), made once the first remote block is on its way.
            local = (lambda: grad_x(shard.rank)) if want_x else None
            gx = rounds.backward(visit, fetch=lambda: x.detach(), push_into=local)
        return gx, gw, None, None, None, g_into


@ir.spmm.definition.implement
def sar_spmm(
    shard: ShardGraph,
    x: torch.Tensor,
    reduce: str,
    edge_weight: torch.Tensor | None = None,
    *,
    strategy: Strategy = Strategy.REMAT,
    in_flight: int = 1,
    executor: str = "auto",
    comm: LinkPolicy | None = None,
    into: torch.Tensor | None = None,
    reuse: bool = False,
) -> torch.Tensor:
    """Partitioned :func:`sarcompile.ir.ops.spmm`; edge weights in shard order."""
    if reuse and into is None and edge_weight is None:
        return reused(shard, ("spmm", reduce, executor), (x,),
                      lambda kept: sar_spmm(shard, x, reduce, strategy=strategy, in_flight=in_flight,
                                            executor=executor, comm=None if kept else comm))
    rounds = HaloRounds.open(shard, f"spmm({reduce})", strategy, in_flight, comm)
    if into is not None and not _writable_into(into, (shard.num_nodes, *x.shape[1:]), x.dtype):
        return into + _SarSpmm.apply(x, edge_weight, rounds, reduce, executor, None)
    return _SarSpmm.apply(x, edge_weight, rounds, reduce, executor, into)


def _writable_into(t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    """Whether spmm may add into ``t`` in place (see :func:`sarcompile.ir.ops.spmm`)."""
    return (isinstance(t, torch.Tensor) and tuple(t.shape) == shape and t.dtype == dtype and t.is_contiguous()
            and t._base is None and not (t.is_leaf and t.requires_grad))
