"""Partitioned message passing with a user message function
(:func:`sarcompile.ir.ops.message_passing`): messages made block by block and reduced, made
again with autograd on in backward."""

from __future__ import annotations

import torch

from sarcompile.codegen.torch_kernels import add_rows
from sarcompile.graph.shard import ShardGraph
from sarcompile.ir import ops as ir
from sarcompile.ir.vocab import LinkPolicy, Strategy
from sarcompile.runtime.ops.halo import HaloRounds, edge_slice, per_row

__all__ = ["sar_message"]


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
    def forward(ctx, x, edge_attr, rounds: HaloRounds, fn, reduce: str, *params):
        shard = rounds.shard
        wants = {"x": ctx.needs_input_grad[0], "edge_attr": edge_attr is not None and ctx.needs_input_grad[1]}
        acc: dict[str, torch.Tensor] = {}
        state = _MaxMessages() if reduce == "max" else None

        def visit(q: int, xb: torch.Tensor) -> None:
            block = shard.blocks[q].on(x.device)
            with torch.no_grad():
                msg = fn(xb[block.col], x[block.row], edge_slice(edge_attr, shard, q))
            if state is not None:
                state.update(block.row, msg, edge_slice(shard.edge_ids, shard, q).to(x.device, torch.long), shard.num_nodes)
            elif "out" not in acc:
                acc["out"] = add_rows(msg.new_zeros((shard.num_nodes, *msg.shape[1:])), block.row, msg)
            else:
                add_rows(acc["out"], block.row, msg)

        rounds.forward(visit, x, op=ir.message_passing, args={"reduce": reduce}, wants=wants)
        if state is not None:
            out = state.result()
            ctx.save_for_backward(x, edge_attr, state.edge)
        else:
            out = acc["out"]
            if reduce == "mean":
                out = out / per_row(shard.in_degrees(), out)
            ctx.save_for_backward(x, edge_attr)
        ctx.rounds, ctx.fn, ctx.reduce = rounds, fn, reduce
        ctx.num_params = len(params)
        return out

    @staticmethod
    def backward(ctx, g):
        rounds, fn, reduce = ctx.rounds, ctx.fn, ctx.reduce
        shard = rounds.shard
        x, edge_attr, *winner = ctx.saved_tensors
        params = [p for p in fn.parameters() if p.requires_grad]
        want_x = ctx.needs_input_grad[0]
        want_e = edge_attr is not None and ctx.needs_input_grad[1]
        gx = torch.zeros_like(x) if want_x else None
        ge = torch.zeros_like(edge_attr) if want_e else None
        gp = [torch.zeros_like(p) for p in params]
        if reduce == "mean":
            g = g / per_row(shard.in_degrees(), g)

        def visit(q: int, xb: torch.Tensor | None) -> torch.Tensor | None:
            xb = rounds.block(q, x, xb)
            block = shard.blocks[q].on(x.device)
            lo, hi = shard.edge_ptr[q], shard.edge_ptr[q + 1]
            x_j = xb.detach()[block.col].requires_grad_(want_x)
            x_i = x.detach()[block.row].requires_grad_(want_x)
            e = None if edge_attr is None else edge_attr.detach()[lo:hi].requires_grad_(want_e)
            with torch.enable_grad():
                msg = fn(x_j, x_i, e)
            g_msg = g[block.row]
            if reduce == "max":
                ids = edge_slice(shard.edge_ids, shard, q).to(x.device, torch.long).reshape(-1, *([1] * (msg.dim() - 1)))
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
            d_src = x.new_zeros((block.num_src, *x.shape[1:]))
            return d_src if d_j is None else add_rows(d_src, block.col, d_j)

        rounds.backward(visit, fetch=lambda: x.detach(), push_into=gx)
        return (gx, ge, None, None, None, *gp)


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
    rounds = HaloRounds.open(shard, f"message_passing({reduce})", strategy, in_flight, comm)
    return _SarMessage.apply(x, edge_attr, rounds, fn, reduce, *params)
