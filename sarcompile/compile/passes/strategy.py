"""Pass ``strategy``: decide, per partitioned op, how its backward gets remote inputs.

Contract. Expects the output of the ``sar`` pass. Guarantees every op that exchanges
halo rows has ``kwargs["strategy"]`` in ``direct | remat | stash | oneshot``
(:class:`~sarcompile.ir.vocab.Strategy`) and ``info(node).strategy_reason`` saying why:

* mode ``sar``: ``direct`` when the op's backward does not read remote inputs (the
  definition's :attr:`~sarcompile.ir.opdef.Halo.reads_remote_in_backward`, assuming every
  tensor argument needs a gradient: sum/mean/max aggregation without edge weights, sddmm
  add/sub) -- gradients go straight to their owners and nothing is fetched again;
  ``remat`` otherwise (edge weights, sddmm mul/dot, attention, message functions).
* mode ``stash``: every op keeps its remote blocks for backward.
* mode ``oneshot``: every op fetches all halos at once and keeps them (domain parallel).

Every such op also gets ``kwargs["in_flight"]``: the remote blocks it posts ahead of the
one it computes on, and the gradient pushes it keeps in flight
(``CompileOptions.blocks_in_flight``; ``oneshot`` posts all at once whatever it says).

``CompileOptions.strategies`` overrides the choice by layer path or node name; a key that
names no layer or op, or ``direct`` for an op whose backward reads remote inputs, is
refused with a :class:`~sarcompile.errors.CompileError`. Collective ops (batch norm) keep
``allreduce``. The runtime does what the chosen strategy says.
"""

from __future__ import annotations

import torch.fx as fx

from sarcompile.errors import CompileError
from sarcompile.ir.node_info import info, set_info
from sarcompile.ir.vocab import Exchange, Mode, Strategy
from sarcompile.compile.passes.context import CompileOptions

__all__ = ["choose_strategy", "strategy"]


def choose_strategy(reads_remote: bool, mode: Mode) -> tuple[Strategy, str]:
    """The strategy for one op and the reason, from what its backward reads and the mode."""
    if mode is Mode.STASH:
        return Strategy.STASH, "mode=stash keeps remote blocks for backward"
    if mode is Mode.ONESHOT:
        return Strategy.ONESHOT, "mode=oneshot fetches all halos at once"
    if reads_remote:
        return Strategy.REMAT, "backward reads remote inputs: re-fetch them block by block"
    return Strategy.DIRECT, "backward needs no remote inputs: send gradients to owners"


def strategy(gm: fx.GraphModule, ctx: CompileOptions) -> fx.GraphModule:
    exchanging = [n for n in gm.graph.nodes if info(n).ir_op is not None and info(n).ir_op.kind is Exchange.HALO]
    _check_keys(ctx, exchanging)
    for node in exchanging:
        op, args = info(node).ir_op, info(node).args
        # At compile time every tensor argument that is there may need a gradient.
        wants = frozenset(name for name in op.inputs if args.get(name) is not None)
        reads = op.exchange.reads_remote_in_backward(args, wants)
        chosen, reason = choose_strategy(reads, ctx.mode)
        for key in (info(node).layer, node.name):
            if key in ctx.strategies:
                chosen, reason = ctx.strategies[key], f"set by the user for {key!r}"
                if chosen is Strategy.DIRECT and reads:
                    raise CompileError(
                        f"strategies[{key!r}] = 'direct' for {node.name} ({op.describe(args)}): its backward reads "
                        "remote inputs, which 'direct' never fetches; use 'remat', 'stash' or 'oneshot'"
                    )
        node.kwargs = {**node.kwargs, "strategy": chosen, "in_flight": ctx.blocks_in_flight}
        set_info(node, strategy_reason=reason)
    gm.recompile()
    return gm


def _check_keys(ctx: CompileOptions, exchanging: list[fx.Node]) -> None:
    """Every key of ``strategies`` names a layer or an op that exchanges."""
    known = {n.name for n in exchanging} | {info(n).layer for n in exchanging if info(n).layer}
    unknown = sorted(set(ctx.strategies) - known)
    if unknown:
        raise CompileError(
            f"strategies names {unknown}, which are neither layers nor ops that exchange rows; valid keys: "
            f"{sorted(known)}"
        )
