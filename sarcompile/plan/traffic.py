"""The bytes each exchanging op moves, by its definition: per worker, per direction and per round.

Communication is derived from the partition's halo sizes and the width of each op's rows, so
it is exact: it equals what the runtime's byte counters record. :func:`halo_traffic` and
:func:`push_traffic` fill in an op's row of the plan and return what the memory estimate
needs of its rounds (:class:`~sarcompile.plan.memory.Exchange`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from sarcompile.ir.node_info import info
from sarcompile.ir.opdef import OpDef
from sarcompile.runtime.link import Wire
from sarcompile.plan.memory import Exchange
from sarcompile.plan.plan import OpPlan
from sarcompile.plan.sizes import WorkerStats

__all__ = ["halo_traffic", "push_traffic"]


def halo_traffic(row: OpPlan, node: fx.Node, op: OpDef, args: dict[str, Any], workers: list[WorkerStats],
                  link_cache: list[int]) -> Exchange:
    """Fill in the traffic of an op that exchanges halo rows, by its definition: which rows
    it sends, whether backward pushes gradients and reads the remote rows again, as the
    runtime decides it. Returns what the memory estimate needs of it."""
    n, strategy = len(workers), row.strategy
    wants = _wants(op, args)
    width = op.exchange.row_bytes(args)
    pushes = op.exchange.pushes_gradients(args, wants)
    refetch = strategy.refetches and op.exchange.reads_remote_in_backward(args, wants)
    wire_row = width
    row.reused = bool(node.kwargs.get("reuse")) and not wants
    policy = None if row.reused else info(node).comm  # (a kept result is made exactly, once)
    if policy is not None:  # bytes of a step that exchanges; stale caches stay for backward
        sent = args[op.exchange.sends[0]]
        wire_row = Wire(policy, 0).wire_bytes(1, width // sent.element_size(), sent.dtype) if policy.bits else width
        cached = bool(policy.staleness > 1 or policy.bounded)
        refetch = refetch and not cached
        row.comm = policy.describe()
        for r, w in enumerate(workers):
            link_cache[r] += sum(w.halo) * width if cached else 0
    recv = [sum(w.halo) * wire_row for w in workers]
    sent_rows = [sum(workers[p].halo[r] for p in range(n)) * wire_row for r in range(n)]
    blocks, sends = _round_bytes(workers, width)
    row.row_bytes = wire_row
    row.forward_bytes = recv
    if row.reused:  # (the first step's exchange still sizes the estimate)
        row.forward_bytes = [0] * n
        row.reason += "; the input is the call's and needs no grad: received in the first step only, then reused"
    row.backward_bytes = [(sent_rows[r] if pushes else 0) + (recv[r] if refetch else 0) for r in range(n)]
    row.round_bytes = [max(b, default=0) for b in blocks]
    over_block = refetch and policy is None and op.exchange.grads_over_block
    return Exchange(blocks, sends, strategy.keeps_blocks, (True, False), (refetch, pushes), width,
                     op.temporaries(args, width), workers, node.kwargs.get("in_flight", 1), over_block)


def _round_bytes(workers: list[WorkerStats], width: int) -> tuple[list[list[int]], list[list[int]]]:
    """Per worker, in round order k = 1..N-1: the block received (from q = r-k) and the
    rows sent (to p = r+k), in bytes."""
    n = len(workers)
    blocks = [[workers[r].halo[(r - k) % n] * width for k in range(1, n)] for r in range(n)]
    sends = [[workers[(r + k) % n].halo[r] * width for k in range(1, n)] for r in range(n)]
    return blocks, sends


def push_traffic(row: OpPlan, op: OpDef, args: dict[str, Any], workers: list[WorkerStats]) -> Exchange:
    """An op that reduces onto source rows: forward, each worker receives the partial
    results for its rows that its peers hold (the rows it would send in a halo fetch);
    backward, the halo rows of the gradient, as a halo op's forward. As
    :func:`halo_traffic`, returns what the memory estimate needs."""
    n, width = len(workers), op.exchange.row_bytes(args)
    halo = [sum(w.halo) * width for w in workers]
    owned = [sum(workers[p].halo[r] for p in range(n)) * width for r in range(n)]
    blocks, sends = _round_bytes(workers, width)
    row.row_bytes, row.forward_bytes, row.backward_bytes = width, owned, halo
    row.round_bytes = [max(b, default=0) for b in blocks]
    row.reason = "partial results for other workers' rows go to their owners"
    # Forward sends partial results for the halo rows (a push); backward fetches them.
    return Exchange(blocks, sends, False, (False, True), (True, False), width, op.temporaries(args, width), workers)


def _wants(op: OpDef, args: dict[str, Any]) -> frozenset[str]:
    """The op's row arguments that need a gradient in the probe run."""
    return frozenset(name for name in op.inputs if isinstance(args.get(name), torch.Tensor) and args[name].requires_grad)

