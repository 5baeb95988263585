"""Partitioned ops: sequential aggregation over a shard's blocks, with explicit saving and
rematerialization in backward. Each is registered as the shard implementation of its IR
op (:mod:`sarcompile.ir.ops`), which calls it on a shard.

Strategies (:class:`~sarcompile.ir.vocab.Strategy`, chosen by :mod:`sarcompile.compile.passes.strategy`):

* ``direct``  -- forward frees each remote block after use; backward sends the gradient of
  remote rows straight to their owners without fetching anything (sum/mean, max via the
  saved winner positions, sddmm add/sub). Refused where backward reads remote inputs.
* ``remat``   -- forward frees each remote block; backward fetches the blocks again, one at
  a time, where its gradient formula reads the remote inputs (edge weights, mul/dot).
* ``stash``   -- forward keeps the remote blocks for backward (no re-fetch, more memory).
* ``oneshot`` -- every halo is fetched at once and kept (classic domain parallelism).

Whether backward reads remote inputs is the op definition's rule
(:attr:`~sarcompile.ir.opdef.Halo.reads_remote_in_backward`), the same the plan uses to
count re-fetched bytes: the runtime does what the plan prints.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Callable

import torch

from sarcompile.ir import ops as ir
from sarcompile.codegen import kernels_for, torch_kernels
from sarcompile.codegen.torch_kernels import add_rows
from sarcompile.errors import CompileError
from sarcompile.graph.graph import Block
from sarcompile.ir.rng import edge_keep
from sarcompile.graph.shard import ShardGraph
from sarcompile.ir.vocab import LinkPolicy, Strategy
from sarcompile.dist.buffers import pool
from sarcompile.dist.collectives import global_max, global_sum
from sarcompile.runtime.columns import Columns
from sarcompile.runtime.rounds import run_rounds
from sarcompile.runtime.link import LinkState, Wire
from sarcompile.runtime.reuse import reused

__all__ = [
    "sar_spmm", "sar_sddmm", "sar_gather_src", "sar_edge_reduce_src", "sar_attention", "sar_message", "sar_edge_max",
    "global_batch_norm",
]


def _lookahead(shard: ShardGraph, strategy: Strategy, in_flight: int) -> int:
    """Blocks a forward posts ahead of the one it computes on: ``oneshot`` posts them all."""
    return max(shard.world_size - 1, 1) if strategy is Strategy.ONESHOT else in_flight


def _refetch(op, strategy: Strategy, args: dict, needs_grad: dict[str, bool]) -> bool:
    """Whether backward fetches the remote inputs again: where the op's definition says
    backward reads them and the strategy did not keep them (``direct`` is refused there)."""
    wants = frozenset(name for name, wanted in needs_grad.items() if wanted)
    reads = op.definition.exchange.reads_remote_in_backward(args, wants)
    if reads and strategy is Strategy.DIRECT:
        raise CompileError(
            f"{op.definition.describe(args)} with strategy='direct': its backward reads remote inputs, which "
            "'direct' never fetches; use 'remat', 'stash' or 'oneshot'"
        )
    return reads and strategy.refetches


def _offsets(shard: ShardGraph) -> list[int]:
    """Start of each block's source rows in the (virtual) concatenation of all halos."""
    out, acc = [], 0
    for b in shard.blocks:
        out.append(acc)
        acc += b.num_src
    return out


def _edge_slice(t: torch.Tensor | None, shard: ShardGraph, q: int) -> torch.Tensor | None:
    return None if t is None else t[shard.edge_ptr[q] : shard.edge_ptr[q + 1]]


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


def _bcast(deg: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return deg.clamp(min=1).to(like.device, like.dtype).reshape(-1, *([1] * (like.dim() - 1)))


class _SarSpmm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, shard: ShardGraph, reduce: str, strategy: Strategy, in_flight: int, executor: str, link,
                iteration: int, into=None):
        K = ctx.K = kernels_for(executor, x.device, f"spmm({reduce})")
        ctx.link, ctx.iteration, ctx.in_flight = link, iteration, in_flight
        wants = {"x": ctx.needs_input_grad[0], "edge_weight": weight is not None and ctx.needs_input_grad[1]}
        ctx.refetch = _refetch(ir.spmm, strategy, {"reduce": reduce}, wants)
        tail = tuple(x.shape[1:])
        kept: dict[int, torch.Tensor] = {}
        acc: dict[str, torch.Tensor] = {}
        state = K.MaxState(shard.num_nodes, tail, x.dtype, x.device) if reduce == "max" else None
        offsets = _offsets(shard)
        # Added into a buffer that holds more than sums: the mean's 1/deg goes on the edges
        mean_weights = _mean_weights(shard, x, K) if into is not None and reduce == "mean" else None
        if into is not None:
            acc["out"] = into

        def visit(q: int, xb: torch.Tensor) -> None:
            if strategy.keeps_blocks:
                kept[q] = xb
            block = shard.blocks[q].on(x.device)
            if wants["x"] and state is None:  # (backward's weights: the mean's made for it, or the given ones)
                K.prepare_transpose(block, weighted=weight is not None)
            w = _edge_slice(weight, shard, q) if mean_weights is None else mean_weights(block)
            if state is not None:
                state.update(block, xb, offsets[q])
            else:  # the local block comes first: its sums are the buffer, unless given one
                acc["out"] = K.spmm(block, xb, w, into=acc.get("out"), ordered=mean_weights is not None)

        run_rounds(shard, visit, fetch=x, lookahead=_lookahead(shard, strategy, in_flight), what=f"spmm({reduce})",
                   link=link, iteration=iteration, visit_keeps=strategy.keeps_blocks)
        # x itself only for the edge weights' gradient (<g[v], x[u]>); the rest needs its shape
        keep_x = x if wants["edge_weight"] else None
        if state is not None:
            out = state.result()
            ctx.save_for_backward(keep_x, weight, state.pos)
        else:
            out = acc["out"]
            if reduce == "mean" and into is None:
                out.div_(_bcast(shard.in_degrees(), out))
            ctx.save_for_backward(keep_x, weight)
        if into is not None:
            ctx.mark_dirty(into)
        ctx.shard, ctx.reduce, ctx.kept = shard, reduce, kept
        return out

    @staticmethod
    def backward(ctx, g):
        shard, reduce, K = ctx.shard, ctx.reduce, ctx.K
        x, weight, *pos = ctx.saved_tensors
        want_x, want_w = ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1]
        g_into = g if ctx.needs_input_grad[9] else None  # d(into + sums)/d(into): g as it is
        gw = torch.zeros_like(weight) if want_w else None
        # The mean's 1/deg: as the edges' weights where there are none (no [n, F] copy of g)
        per_edge = reduce == "mean" and weight is None
        if reduce == "mean" and not per_edge:
            g = g / _bcast(shard.in_degrees(), g)
        mean_weights = _mean_weights(shard, g, K, transposed=True) if per_edge else None
        offsets = _offsets(shard)
        kept = ctx.kept

        def grad_x(q: int) -> torch.Tensor:
            block = shard.blocks[q].on(g.device)
            if reduce == "max":
                return K.max_grad(pos[0], g, offsets[q], block.num_src)
            # A remote block's rows are pushed to their owner, then the buffer goes back to the pool.
            out = None if q == shard.rank else pool.take((block.num_src, *g.shape[1:]), g.dtype, g.device)
            if per_edge:
                return K.spmm_t(block, g, mean_weights(block), out, ordered=True)
            return K.spmm_t(block, g, _edge_slice(weight, shard, q), out)

        def visit(q: int, xb: torch.Tensor | None):
            if want_w:
                xb = x if q == shard.rank else kept.get(q, xb)
                lo, hi = shard.edge_ptr[q], shard.edge_ptr[q + 1]
                gw[lo:hi] = K.edge_dot(shard.blocks[q], g, xb, weight.shape)
            return grad_x(q) if want_x and q != shard.rank else None

        gx = None
        if want_x or want_w:
            # The local block's gradient is the buffer the peers' pushes add into (no zeroed
            # copy), made once the first remote block is on its way.
            gx = run_rounds(
                shard,
                visit,
                fetch=x.detach() if ctx.refetch else None,
                push_into=(lambda: grad_x(shard.rank)) if want_x else None,
                phase="backward",
                what=f"spmm({reduce}) backward",
                link=ctx.link,
                iteration=ctx.iteration,
                lookahead=ctx.in_flight,
            )
        ctx.kept = None
        return gx, gw, None, None, None, None, None, None, None, g_into


class _SarSddmm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, shard: ShardGraph, op: str, strategy: Strategy, in_flight: int, link, iteration: int):
        ctx.link, ctx.iteration, ctx.in_flight = link, iteration, in_flight
        ctx.refetch = _refetch(ir.sddmm, strategy, {"op": op}, {"a": ctx.needs_input_grad[0], "b": ctx.needs_input_grad[1]})
        kept: dict[int, torch.Tensor] = {}
        pieces: dict[int, torch.Tensor] = {}

        def visit(q: int, ab: torch.Tensor) -> None:
            if strategy.keeps_blocks:
                kept[q] = ab
            pieces[q] = torch_kernels.sddmm(shard.blocks[q], ab, b, op)

        run_rounds(shard, visit, fetch=a, lookahead=_lookahead(shard, strategy, in_flight), what=f"sddmm({op})",
                   link=link, iteration=iteration, visit_keeps=strategy.keeps_blocks)
        # Only mul and dot read the inputs in backward (each the other's); the rest needs shapes.
        product = op in ("mul", "dot")
        ctx.save_for_backward(a if product and ctx.needs_input_grad[1] else None,
                              b if product and ctx.needs_input_grad[0] else None)
        ctx.like = [None if t is None else (t.new_empty((0,)), t.shape) for t in (a, b)]
        ctx.shard, ctx.op, ctx.kept = shard, op, kept
        return pieces[0] if shard.world_size == 1 else torch.cat([pieces[q] for q in range(shard.world_size)])

    @staticmethod
    def backward(ctx, g):
        shard, op = ctx.shard, ctx.op
        a, b = ctx.saved_tensors
        want_a, want_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        (like_a, shape_a), like_b = ctx.like
        ga = like_a.new_zeros(shape_a) if want_a else None
        gb = like_b[0].new_zeros(like_b[1]) if want_b else None
        kept = ctx.kept

        def visit(q: int, ab: torch.Tensor | None):
            ab = a if q == shard.rank else kept.get(q, ab)
            ga_q, gb_q = torch_kernels.sddmm_grads(shard.blocks[q], _edge_slice(g, shard, q), ab, b, op, want_a, want_b)
            if gb_q is not None:
                gb.add_(gb_q)
            return ga_q

        if want_a or want_b:
            run_rounds(
                shard,
                visit,
                fetch=a.detach() if ctx.refetch else None,
                push_into=ga,
                phase="backward",
                what=f"sddmm({op}) backward",
                link=ctx.link,
                iteration=ctx.iteration,
                lookahead=ctx.in_flight,
            )
        ctx.kept = None
        return ga, gb, None, None, None, None, None, None


def _link(shard: ShardGraph, policy: LinkPolicy | None) -> tuple[LinkState | None, int]:
    """The site's state and this training iteration's number, or (None, 0) for exact
    SAR: no reduction asked for, one worker, or not training (autograd off)."""
    if policy is None or policy.exact or shard.world_size == 1 or not torch.is_grad_enabled():
        return None, 0
    state = shard.links.get(policy.site)
    if state is None or state.policy != policy:
        state = shard.links[policy.site] = LinkState(policy, Wire(policy, shard.rank))
    state.iteration += 1
    return state, state.iteration


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
        ctx, h, a_src, a_dst, a_edge, shard: ShardGraph, negative_slope: float, p: float, salt, strategy: Strategy,
        in_flight: int, executor: str, link, iteration: int,
    ):
        K = ctx.K = kernels_for(executor, h.device, "attention")
        ctx.link, ctx.iteration, ctx.in_flight = link, iteration, in_flight
        wants = dict(zip(("h", "a_src", "a_dst", "a_edge"), ctx.needs_input_grad))
        ctx.refetch = _refetch(ir.attention, strategy, {}, wants)
        n, heads, channels = h.shape
        payload = _payload(shard, h, a_src)
        state = K.AttentionState(shard.num_nodes, heads, channels, h.dtype, h.device)
        kept: dict[int, torch.Tensor] = {}

        def visit(q: int, block_payload: torch.Tensor | None) -> None:
            if strategy.keeps_blocks and q != shard.rank:
                kept[q] = block_payload
            block = shard.blocks[q]
            if wants["h"]:
                K.prepare_transpose(block.on(h.device), weighted=True)
            hb, ab = (h, a_src) if q == shard.rank else _split_payload(block_payload, heads, channels)
            keep = _keep(shard, q, heads, p, salt, h.dtype, h.device)
            state.update(block, hb, ab, a_dst, negative_slope, keep, _edge_slice(a_edge, shard, q))

        run_rounds(shard, visit, fetch=payload, lookahead=_lookahead(shard, strategy, in_flight), what="attention",
                   link=link, iteration=iteration, visit_keeps=strategy.keeps_blocks)
        del payload  # only the peers needed it: backward keeps h and a_src, which their producers keep too
        out, lse = state.result()
        ctx.save_for_backward(h, a_src, a_dst, a_edge, lse, salt)
        # The output only for backward's row term delta; held by reference, not saved, so
        # backward lets it go once delta is made, before the gradients' [n, H, C] buffers
        # (a detached alias: no cycle through the output's grad_fn; same version counter).
        ctx.out, ctx.out_version = out.detach(), out._version
        ctx.shard, ctx.negative_slope, ctx.p, ctx.kept = shard, negative_slope, p, kept
        ctx.heads, ctx.channels = heads, channels
        return out

    @staticmethod
    def backward(ctx, d_out):
        h, a_src, a_dst, a_edge, lse, salt = ctx.saved_tensors
        shard, heads, channels, K = ctx.shard, ctx.heads, ctx.channels, ctx.K
        delta = _row_term(ctx, d_out)
        d_a_dst = torch.zeros_like(a_dst)
        d_a_edge = None if a_edge is None or not ctx.needs_input_grad[3] else torch.zeros_like(a_edge)
        kept = ctx.kept

        def block_grads(q: int, hb: torch.Tensor, ab: torch.Tensor, into: torch.Tensor | None = None):
            """The gradients of the block's source rows of ``h`` and ``a_src`` (written
            into ``into``'s columns when given); the destination and edge scores'
            gradients are added here."""
            block = shard.blocks[q]
            keep = _keep(shard, q, heads, ctx.p, salt, h.dtype, h.device)
            d_h, d_src, d_dst, d_edge = K.attention_grads(
                block, hb, ab, a_dst, ctx.negative_slope, keep, lse, d_out, delta, _edge_slice(a_edge, shard, q), into
            )
            d_a_dst.add_(d_dst)
            if d_a_edge is not None:  # the blocks' edge ranges cover the shard's edges once
                d_a_edge[shard.edge_ptr[q] : shard.edge_ptr[q + 1]] = d_edge
            return d_h, d_src

        def pushed_grads(q: int, payload: torch.Tensor, fetched: bool) -> torch.Tensor:
            """A remote block's source gradients as the payload pushed to the rows' owner:
            written straight into a buffer where features and scores share a dtype -- the
            block's own when it was ``fetched`` for this backward alone (it has the
            gradients' shape), else one of the pool's -- which goes back to the pool once sent."""
            hb, ab = _split_payload(payload, heads, channels)
            if d_out.dtype != d_a_dst.dtype:
                d_h, d_src = block_grads(q, hb, ab)
                return torch.cat([d_h.reshape(d_h.shape[0], heads * channels), d_src], 1)
            shape = (shard.blocks[q].num_src, heads * channels + heads)
            into = payload if fetched and payload.dtype == d_out.dtype else pool.take(shape, d_out.dtype, d_out.device)
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
            return *block_grads(shard.rank, h, a_src), d_a_dst, d_a_edge, None, None, None, None, None, None, None, None, None

        def visit(q: int, block_payload: torch.Tensor | None) -> torch.Tensor | None:
            if q == shard.rank:
                return None
            fetched = q not in kept and ctx.link is None  # (a link's cache keeps its blocks)
            return pushed_grads(q, kept.get(q, block_payload), fetched)

        # The local block's gradients are what the peers' pushes add into (no zeroed copy),
        # made once the first remote block is on its way.
        d_payload = run_rounds(
            shard,
            visit,
            fetch=_payload(shard, h, a_src) if ctx.refetch else None,
            push_into=local_grads,
            phase="backward",
            what="attention backward",
            link=ctx.link,
            iteration=ctx.iteration,
            lookahead=ctx.in_flight,
        )
        ctx.kept = None
        if isinstance(d_payload, Columns):
            d_h, d_a_src = local.pop("d_h"), d_payload.parts[1]
        else:
            d_h, d_a_src = _split_payload(d_payload, heads, channels)
        del d_payload
        return d_h, d_a_src, d_a_dst, d_a_edge, None, None, None, None, None, None, None, None, None


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
    return edge_keep(_edge_slice(shard.edge_ids, shard, q), heads, p, salt, dtype).to(device)


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
    link, iteration = _link(shard, comm)
    return _SarAttention.apply(
        h, a_src, a_dst, a_edge, shard, float(negative_slope), float(dropout), salt, Strategy(strategy), in_flight, executor,
        link, iteration,
    )


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
    link, iteration = _link(shard, comm)
    if into is not None and not _writable_into(into, (shard.num_nodes, *x.shape[1:]), x.dtype):
        return into + _SarSpmm.apply(x, edge_weight, shard, reduce, Strategy(strategy), in_flight, executor, link, iteration, None)
    return _SarSpmm.apply(x, edge_weight, shard, reduce, Strategy(strategy), in_flight, executor, link, iteration, into)


def _writable_into(t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    """Whether spmm may add into ``t`` in place (see :func:`sarcompile.ir.ops.spmm`)."""
    return (isinstance(t, torch.Tensor) and tuple(t.shape) == shape and t.dtype == dtype and t.is_contiguous()
            and t._base is None and not (t.is_leaf and t.requires_grad))


@ir.gather_src.definition.implement
def sar_gather_src(
    shard: ShardGraph, x: torch.Tensor, *, strategy: Strategy = Strategy.REMAT, in_flight: int = 1,
    comm: LinkPolicy | None = None,
) -> torch.Tensor:
    """Partitioned :func:`sarcompile.ir.ops.gather_src`: sddmm's exchange with the source side only."""
    link, iteration = _link(shard, comm)
    return _SarSddmm.apply(x, None, shard, "copy_u", Strategy(strategy), in_flight, link, iteration)


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
    link, iteration = _link(shard, comm)
    return _SarSddmm.apply(a, b, shard, op, Strategy(strategy), in_flight, link, iteration)


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
            return add_rows(flat.new_zeros((block.num_src, flat.shape[1])), block.col, _edge_slice(flat, shard, q))

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


class _GlobalMax(torch.autograd.Function):
    """The largest element over every worker's rows; its gradient split evenly among the
    elements equal to it on all workers (torch's rule for ``max()``). Each worker's loss
    reaches the maximum from its own rows: the gradient arriving is all-reduced first."""

    @staticmethod
    def forward(ctx, e):
        local = e.detach().max() if e.numel() else e.new_tensor(float("-inf"))
        top = global_max(local, phase="edge_max")
        ties = e.detach() == top
        ctx.save_for_backward(ties)
        ctx.count = float(global_sum(ties.sum().double(), phase="edge_max"))
        return top

    @staticmethod
    def backward(ctx, g):
        (ties,) = ctx.saved_tensors
        total = global_sum(g.double(), phase="edge_max").to(g.dtype)
        return ties.to(g.dtype) * (total / ctx.count)


@ir.edge_max.definition.implement
def sar_edge_max(e: torch.Tensor) -> torch.Tensor:
    """Partitioned :func:`sarcompile.ir.ops.edge_max`: two scalars all-reduced."""
    return _GlobalMax.apply(e)


class _GlobalMean(torch.autograd.Function):
    """The mean over every worker's rows (float64 sums and the row count all-reduced);
    backward all-reduces the gradient arriving, each worker's loss having reached the mean
    from its own rows only, and gives every row its share."""

    @staticmethod
    def forward(ctx, x):
        width = math.prod(x.shape[1:])
        sums = global_sum(torch.cat([x.detach().double().reshape(x.shape[0], width).sum(0),
                                     torch.tensor([float(x.shape[0])], dtype=torch.float64, device=x.device)]),
                          phase="node_mean")
        ctx.count = max(float(sums[-1]), 1.0)
        ctx.shape = x.shape
        return (sums[:-1] / ctx.count).reshape(x.shape[1:]).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        total = global_sum(g.double(), phase="node_mean") / ctx.count
        return total.to(g.dtype).expand(ctx.shape).contiguous()


@ir.node_mean.definition.implement
def sar_node_mean(x: torch.Tensor) -> torch.Tensor:
    """Partitioned :func:`sarcompile.ir.ops.node_mean`: one row's sums and the count all-reduced."""
    return _GlobalMean.apply(x)


_NO_EDGE = torch.iinfo(torch.int64).max


class _MaxMessages:
    """Running elementwise max of messages per destination row over blocks, and which edge
    (by global id, the smallest among equals) gave it -- so the winner, and hence the
    gradient, does not depend on how the graph is partitioned."""

    def __init__(self) -> None:
        self.best: torch.Tensor | None = None
        self.edge: torch.Tensor | None = None

    def update(self, row: torch.Tensor, msg: torch.Tensor, edge_ids: torch.Tensor, num_dst: int) -> None:
        shape = (num_dst, *msg.shape[1:])
        if self.best is None:
            self.best = msg.new_full(shape, float("-inf"))
            self.edge = torch.full(shape, _NO_EDGE, dtype=torch.long, device=msg.device)
        idx = row.reshape(-1, *([1] * (msg.dim() - 1))).expand_as(msg)
        block_max = msg.new_full(shape, float("-inf")).scatter_reduce(0, idx, msg, "amax")
        ids = edge_ids.reshape(-1, *([1] * (msg.dim() - 1))).expand_as(msg)
        cand = torch.where(msg == block_max[row], ids, _NO_EDGE)
        block_edge = torch.full(shape, _NO_EDGE, dtype=torch.long, device=msg.device).scatter_reduce(0, idx, cand, "amin")
        take = (block_max > self.best) | ((block_max == self.best) & (block_edge < self.edge))
        self.best = torch.where(take, block_max, self.best)
        self.edge = torch.where(take, block_edge, self.edge)

    def result(self) -> torch.Tensor:
        return torch.where(self.edge == _NO_EDGE, torch.zeros_like(self.best), self.best)


class _SarMessage(torch.autograd.Function):
    """``out[v] = reduce_{u->v} fn(x[u], x[v], e_uv)`` with a user message function.

    Forward computes each block's messages without autograd and reduces them; nothing per
    edge is kept. Backward visits every block again (re-fetched, or kept in stash/oneshot),
    recomputes its messages with autograd on, and back-propagates the output gradient
    through them: source-row gradients go to their owners, destination-row and edge-feature
    gradients stay, and the gradients of ``fn``'s parameters are summed over blocks (each
    worker's share; ``sync_gradients`` adds the workers').
    """

    @staticmethod
    def forward(ctx, x, edge_attr, shard: ShardGraph, fn, reduce: str, strategy: Strategy, in_flight: int, link,
                iteration: int, *params):
        ctx.link, ctx.iteration, ctx.in_flight = link, iteration, in_flight
        wants = {"x": ctx.needs_input_grad[0], "edge_attr": edge_attr is not None and ctx.needs_input_grad[1]}
        ctx.refetch = _refetch(ir.message_passing, strategy, {"reduce": reduce}, wants)
        kept: dict[int, torch.Tensor] = {}
        acc: dict[str, torch.Tensor] = {}
        state = _MaxMessages() if reduce == "max" else None

        def visit(q: int, xb: torch.Tensor) -> None:
            if strategy.keeps_blocks:
                kept[q] = xb
            block = shard.blocks[q].on(x.device)
            with torch.no_grad():
                msg = fn(xb[block.col], x[block.row], _edge_slice(edge_attr, shard, q))
            if state is not None:
                state.update(block.row, msg, _edge_slice(shard.edge_ids, shard, q).to(x.device, torch.long), shard.num_nodes)
            elif "out" not in acc:
                acc["out"] = add_rows(msg.new_zeros((shard.num_nodes, *msg.shape[1:])), block.row, msg)
            else:
                add_rows(acc["out"], block.row, msg)

        run_rounds(shard, visit, fetch=x, lookahead=_lookahead(shard, strategy, in_flight), what=f"message_passing({reduce})",
                   link=link, iteration=iteration, visit_keeps=strategy.keeps_blocks)
        if state is not None:
            out = state.result()
            ctx.save_for_backward(x, edge_attr, state.edge)
        else:
            out = acc["out"]
            if reduce == "mean":
                out = out / _bcast(shard.in_degrees(), out)
            ctx.save_for_backward(x, edge_attr)
        ctx.shard, ctx.fn, ctx.reduce, ctx.kept = shard, fn, reduce, kept
        ctx.num_params = len(params)
        return out

    @staticmethod
    def backward(ctx, g):
        shard, fn, reduce, kept = ctx.shard, ctx.fn, ctx.reduce, ctx.kept
        x, edge_attr, *winner = ctx.saved_tensors
        params = [p for p in fn.parameters() if p.requires_grad]
        want_x = ctx.needs_input_grad[0]
        want_e = edge_attr is not None and ctx.needs_input_grad[1]
        gx = torch.zeros_like(x) if want_x else None
        ge = torch.zeros_like(edge_attr) if want_e else None
        gp = [torch.zeros_like(p) for p in params]
        if reduce == "mean":
            g = g / _bcast(shard.in_degrees(), g)

        def visit(q: int, xb: torch.Tensor | None) -> torch.Tensor | None:
            xb = x if q == shard.rank else kept.get(q, xb)
            block = shard.blocks[q].on(x.device)
            lo, hi = shard.edge_ptr[q], shard.edge_ptr[q + 1]
            x_j = xb.detach()[block.col].requires_grad_(want_x)
            x_i = x.detach()[block.row].requires_grad_(want_x)
            e = None if edge_attr is None else edge_attr.detach()[lo:hi].requires_grad_(want_e)
            with torch.enable_grad():
                msg = fn(x_j, x_i, e)
            g_msg = g[block.row]
            if reduce == "max":
                ids = _edge_slice(shard.edge_ids, shard, q).to(x.device, torch.long).reshape(-1, *([1] * (msg.dim() - 1)))
                g_msg = torch.where(winner[0][block.row] == ids, g_msg, torch.zeros_like(g_msg))
            inputs = [t for t in (x_j, x_i, e) if t is not None and t.requires_grad] + params
            grads = torch.autograd.grad(msg, inputs, g_msg, allow_unused=True) if inputs and msg.requires_grad else ()
            grads = list(grads)
            d_j = d_i = None
            if want_x and grads:
                d_j, d_i = grads.pop(0), grads.pop(0)
            if want_e and grads:
                d_e = grads.pop(0)
                if d_e is not None:
                    ge[lo:hi] = d_e
            for acc, d in zip(gp, grads):
                if d is not None:
                    acc.add_(d)
            if not want_x:
                return None
            if d_i is not None:
                add_rows(gx, block.row, d_i)
            d_src = pool.take((block.num_src, *x.shape[1:]), x.dtype, x.device).zero_()
            return d_src if d_j is None else add_rows(d_src, block.col, d_j)

        run_rounds(
            shard,
            visit,
            fetch=x.detach() if ctx.refetch else None,
            push_into=gx,
            phase="backward",
            what=f"message_passing({reduce}) backward",
            link=ctx.link,
            iteration=ctx.iteration,
            lookahead=ctx.in_flight,
        )
        ctx.kept = None
        return (gx, ge, None, None, None, None, None, None, None, *gp)


@ir.message_passing.definition.implement
def sar_message(
    shard: ShardGraph,
    fn,
    x: torch.Tensor,
    edge_attr: torch.Tensor | None,
    reduce: str,
    *,
    strategy: Strategy = Strategy.REMAT,
    in_flight: int = 1,
    comm: LinkPolicy | None = None,
) -> torch.Tensor:
    """Partitioned :func:`sarcompile.ir.ops.message_passing`; edge features in shard order."""
    params = [p for p in fn.parameters() if p.requires_grad]
    link, iteration = _link(shard, comm)
    return _SarMessage.apply(x, edge_attr, shard, fn, reduce, Strategy(strategy), in_flight, link, iteration, *params)


class _GlobalBatchNorm(torch.autograd.Function):
    """Batch norm whose statistics are sums over every worker's rows.

    Sums are taken in float64 and all-reduced, so the result does not depend on how the
    nodes are split (up to the final rounding to the input's dtype). The variance is
    two-pass (sum of squared deviations from the global mean), as stable as one machine's.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum: float, eps: float):
        xd = x.detach().double()
        first = global_sum(torch.cat([xd.sum(0), xd.new_full((1,), x.shape[0])]), phase="batch_norm")
        count = float(first[-1])
        if count <= 1:
            raise ValueError(f"batch norm in training needs more than 1 node in all, got {int(count)}")
        mean = first[:-1] / count
        var = global_sum(((xd - mean) ** 2).sum(0), phase="batch_norm") / count
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():  # torch keeps the unbiased variance in the running statistics
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_((var * count / (count - 1)).to(running_var.dtype), alpha=momentum)
        y = ((xd - mean) * invstd).to(x.dtype)
        if weight is not None:
            y = y * weight
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.count = count
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd = ctx.saved_tensors
        xhat = (x.double() - mean) * invstd
        g = dy.double()
        if weight is not None:
            g = g * weight.double()
        # dx = invstd * (g - mean(g) - xhat * mean(g * xhat)), the means over all workers' rows
        sums = global_sum(torch.cat([g.sum(0), (g * xhat).sum(0)]), phase="batch_norm")
        c = x.shape[1]
        dx = invstd * (g - sums[:c] / ctx.count - xhat * (sums[c:] / ctx.count))
        # Parameter gradients stay local sums: sync_gradients adds the workers' shares.
        dw = (dy.double() * xhat).sum(0).to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        db = dy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx.to(x.dtype), dw, db, None, None, None, None


@ir.batch_norm.definition.implement
def global_batch_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    momentum: float,
    eps: float,
) -> torch.Tensor:
    """Training-mode batch norm of ``x`` (this worker's rows) with statistics over all workers."""
    return _GlobalBatchNorm.apply(x, weight, bias, running_mean, running_var, momentum, eps)
