"""Partitioned fused graph attention (:func:`sarcompile.ir.ops.attention`): an online
softmax over each block's scores in forward, the probabilities recomputed block by block
in backward."""

from __future__ import annotations

import math

import torch

from sarcompile.codegen import kernels_for, torch_kernels
from sarcompile.graph.shard import ShardGraph
from sarcompile.ir import ops as ir
from sarcompile.ir.rng import edge_keep
from sarcompile.ir.vocab import LinkPolicy, Strategy
from sarcompile.runtime.columns import Columns
from sarcompile.runtime.ops.halo import HaloRounds, edge_slice

__all__ = ["sar_attention"]


class _SarAttention(torch.autograd.Function):
    """``out[v] = sum_u softmax_u(leaky_relu(a_src[u] + a_dst[v] [+ a_edge[e]])) * drop * h[u]``
    per head.

    Forward makes one pass over the blocks with an online softmax and keeps per-node
    statistics only (the output and the log-sum-exp of the scores). Backward visits every
    block once more -- re-fetched in ``sar`` mode, kept in ``stash``/``oneshot`` --
    recomputes the probabilities and sends the gradients of the remote ``h`` and
    ``a_src`` rows to their owners. Each round moves ``h`` and ``a_src`` as one tensor.
    The per-edge scores ``a_edge`` (shard order) never travel: every edge lives on its
    destination's worker, so each block reads its own slice and its gradient stays here.
    """

    @staticmethod
    def forward(
        ctx, h, a_src, a_dst, a_edge, rounds: HaloRounds, negative_slope: float, p: float, salt, executor: str,
    ):
        shard = rounds.shard
        K = ctx.K = kernels_for(executor, h.device, "attention")
        wants = dict(zip(("h", "a_src", "a_dst", "a_edge"), ctx.needs_input_grad))
        n, heads, channels = h.shape
        payload = _payload(shard, h, a_src)
        state = K.AttentionState(shard.num_nodes, heads, channels, h.dtype, h.device)

        def visit(q: int, block_payload: torch.Tensor | None) -> None:
            block = shard.blocks[q]
            if wants["h"]:
                K.prepare_transpose(block.on(h.device), weighted=True)
            hb, ab = (h, a_src) if q == shard.rank else _split_payload(block_payload, heads, channels)
            keep = _keep(shard, q, heads, p, salt, h.dtype, h.device)
            state.update(block, hb, ab, a_dst, negative_slope, keep, edge_slice(a_edge, shard, q))

        rounds.forward(visit, payload, op=ir.attention, args={}, wants=wants)
        del payload  # only the peers needed it: backward keeps h and a_src, which their producers keep too
        out, lse = state.result()
        ctx.save_for_backward(h, a_src, a_dst, a_edge, lse, salt)
        # The output only for backward's row term delta; held by reference, not saved, so
        # backward lets it go once delta is made, before the gradients' [n, H, C] buffers
        # (a detached alias: no cycle through the output's grad_fn; same version counter).
        ctx.out, ctx.out_version = out.detach(), out._version
        ctx.rounds, ctx.negative_slope, ctx.p = rounds, negative_slope, p
        ctx.heads, ctx.channels = heads, channels
        return out

    @staticmethod
    def backward(ctx, d_out):
        h, a_src, a_dst, a_edge, lse, salt = ctx.saved_tensors
        rounds, heads, channels, K = ctx.rounds, ctx.heads, ctx.channels, ctx.K
        shard = rounds.shard
        delta = _row_term(ctx, d_out)
        d_a_dst = torch.zeros_like(a_dst)
        d_a_edge = None if a_edge is None or not ctx.needs_input_grad[3] else torch.zeros_like(a_edge)

        def block_grads(q: int, hb: torch.Tensor, ab: torch.Tensor, into: torch.Tensor | None = None):
            """The gradients of the block's source rows of ``h`` and ``a_src`` (written
            into ``into``'s columns when given); the destination and edge scores'
            gradients are added here."""
            block = shard.blocks[q]
            keep = _keep(shard, q, heads, ctx.p, salt, h.dtype, h.device)
            d_h, d_src, d_dst, d_edge = K.attention_grads(
                block, hb, ab, a_dst, ctx.negative_slope, keep, lse, d_out, delta, edge_slice(a_edge, shard, q), into
            )
            d_a_dst.add_(d_dst)
            if d_a_edge is not None:  # the blocks' edge ranges cover the shard's edges once
                d_a_edge[shard.edge_ptr[q] : shard.edge_ptr[q + 1]] = d_edge
            return d_h, d_src

        def pushed_grads(q: int, payload: torch.Tensor, fetched: bool) -> torch.Tensor:
            """A remote block's source gradients as the payload pushed to the rows' owner:
            written straight into a buffer where features and scores share a dtype -- the
            block's own when it was ``fetched`` for this backward alone (it has the
            gradients' shape), else a new one."""
            hb, ab = _split_payload(payload, heads, channels)
            if d_out.dtype != d_a_dst.dtype:
                d_h, d_src = block_grads(q, hb, ab)
                return torch.cat([d_h.reshape(d_h.shape[0], heads * channels), d_src], 1)
            shape = (shard.blocks[q].num_src, heads * channels + heads)
            into = payload if fetched and payload.dtype == d_out.dtype else d_out.new_empty(shape)
            block_grads(q, hb, ab, into)
            return into

        local: dict[str, torch.Tensor] = {}

        def local_grads() -> Columns | torch.Tensor:
            """The local block's gradients, which the peers' pushes add into: ``h``'s and
            ``a_src``'s as tensors of their own, not columns of one payload, so that
            autograd adds the head scores' gradients of ``h`` into ``h``'s in place (into
            a view of a payload it would make one more ``[n, H, C]`` sum)."""
            d_h, d_src = block_grads(shard.rank, h, a_src)
            flat = d_h.view(d_h.shape[0], heads * channels)
            if d_h.dtype != d_src.dtype:
                return torch.cat([flat, d_src], 1)
            local["d_h"] = d_h  # returned as it is: a view of it would share its storage
            return Columns((flat, d_src))

        if shard.world_size == 1:
            return *block_grads(shard.rank, h, a_src), d_a_dst, d_a_edge, None, None, None, None, None

        def visit(q: int, block_payload: torch.Tensor | None) -> torch.Tensor | None:
            if q == shard.rank:
                return None
            fetched = q not in rounds.kept and rounds.link is None  # (a link's cache keeps its blocks)
            return pushed_grads(q, rounds.kept.get(q, block_payload), fetched)

        # The local block's gradients are what the peers' pushes add into (no zeroed copy),
        # made once the first remote block is on its way.
        d_payload = rounds.backward(visit, fetch=lambda: _payload(shard, h, a_src), push_into=local_grads)
        if isinstance(d_payload, Columns):
            d_h, d_a_src = local.pop("d_h"), d_payload.parts[1]
        else:
            d_h, d_a_src = _split_payload(d_payload, heads, channels)
        del d_payload
        return d_h, d_a_src, d_a_dst, d_a_edge, None, None, None, None, None


def _row_term(ctx, d_out: torch.Tensor) -> torch.Tensor:
    """``delta[v, k] = sum_c dOut[v, k, c] * Out[v, k, c]`` a bounded block of rows at a
    time (no ``[n, H, C]`` product), after which the forward's output is let go."""
    out = ctx.out
    if out is None:
        raise RuntimeError(
            "sarcompile's attention backward ran twice for one forward (retain_graph=True): it lets its "
            "output go after the first backward. Run the forward again for a second backward."
        )
    if out._version != ctx.out_version:
        raise RuntimeError(
            "the output of sarcompile's attention was modified in place after the forward, and its backward "
            "reads it: write the change out of place (y = out + 1, not out += 1)."
        )
    ctx.out = None
    delta = out.new_empty(out.shape[:2])
    for r in torch_kernels.row_blocks(out):
        delta[r] = (d_out[r] * out[r]).sum(-1)
    return delta


def _payload(shard: ShardGraph, h: torch.Tensor, a_src: torch.Tensor) -> Columns | None:
    """``h`` and ``a_src`` side by side, the rows one round sends; None on one worker."""
    if shard.world_size == 1:
        return None
    dtype = torch.promote_types(h.dtype, a_src.dtype)
    return Columns((h.reshape(h.shape[0], math.prod(h.shape[1:])).to(dtype), a_src.to(dtype)))  # (not -1: no rows is fine)


def _split_payload(payload: torch.Tensor, heads: int, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = heads * channels
    return payload[:, :width].reshape(payload.shape[0], heads, channels), payload[:, width:]


def _keep(shard: ShardGraph, q: int, heads: int, p: float, salt, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    if p == 0.0:
        return None
    return edge_keep(edge_slice(shard.edge_ids, shard, q), heads, p, salt, dtype).to(device)


@ir.attention.definition.implement
def sar_attention(
    shard: ShardGraph,
    h: torch.Tensor,
    a_src: torch.Tensor,
    a_dst: torch.Tensor,
    negative_slope: float,
    dropout: float,
    salt: torch.Tensor,
    a_edge: torch.Tensor | None = None,
    *,
    strategy: Strategy = Strategy.REMAT,
    in_flight: int = 1,
    executor: str = "auto",
    comm: LinkPolicy | None = None,
) -> torch.Tensor:
    """Partitioned fused attention; ``h [n, H, C]``, ``a_src``/``a_dst`` ``[n, H]``,
    ``a_edge [E, H]`` in shard order or None."""
    rounds = HaloRounds.open(shard, "attention", strategy, in_flight, comm)
    return _SarAttention.apply(h, a_src, a_dst, a_edge, rounds, float(negative_slope), float(dropout), salt, executor)
