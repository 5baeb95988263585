"""Pass ``strategy``: decide, per partitioned op, how its backward gets remote inputs.

Contract. Expects the output of the partition pass. Guarantees every partitioned op has
``kwargs["strategy"]`` in ``direct | remat | stash | oneshot`` and ``meta["strategy_reason"]``
saying why:

* mode ``sar``: ``direct`` when the op's backward does not read remote inputs (sum/mean/max
  aggregation without edge weights, sddmm add/sub) -- gradients go straight to their
  owners and nothing is fetched again; ``remat`` otherwise (edge weights, sddmm mul/dot).
* mode ``stash``: every op keeps its remote blocks for backward.
* mode ``oneshot``: every op fetches all halos at once and keeps them (domain parallel).

``CompileOptions.strategies`` overrides the choice by layer path or node name. Collective
ops (batch norm) keep ``allreduce``.
"""

from __future__ import annotations

import torch.fx as fx

from .context import CompileOptions

__all__ = ["choose_strategy", "strategy"]


def choose_strategy(reads_remote: bool, mode: str) -> tuple[str, str]:
    """The strategy for one op and the reason, from what its backward reads and the mode."""
    if mode == "stash":
        return "stash", "mode=stash keeps remote blocks for backward"
    if mode == "oneshot":
        return "oneshot", "mode=oneshot fetches all halos at once"
    if reads_remote:
        return "remat", "backward reads remote inputs: re-fetch them block by block"
    return "direct", "backward needs no remote inputs: send gradients to owners"


def strategy(gm: fx.GraphModule, ctx: CompileOptions) -> fx.GraphModule:
    for node in gm.graph.nodes:
        op = node.meta.get("ir_op")
        if op is None or op.collective:  # an all-reduce has nothing to choose
            continue
        chosen, reason = choose_strategy(op.reads_remote_in_backward(node.meta["args"]), ctx.mode)
        for key in (node.meta.get("layer"), node.name):
            if key in ctx.strategies:
                chosen, reason = ctx.strategies[key], f"set by the user for {key!r}"
        node.kwargs = {**node.kwargs, "strategy": chosen}
        node.meta["strategy_reason"] = reason
    gm.recompile()
    return gm
