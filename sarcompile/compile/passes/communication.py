"""Pass ``communication``: opt-in stale or compressed exchange, per partitioned op.

Contract. Expects the output of the strategy pass. With exact options (``staleness=1``,
``bounded_staleness=None``, ``compress=None``: the default) it changes nothing. Otherwise
it gives every op that exchanges halo rows (not batch norm's all-reduce) and that belongs
to a layer in ``compress_layers`` (every layer when None) a keyword ``comm``: the
:class:`~sarcompile.ir.vocab.LinkPolicy` of that *site*, a typed value numbered in program
order, and records the policy in ``info(node).comm``. Values are unchanged on one
machine; on workers they become approximate by design (see :mod:`sarcompile.runtime.link`).

Some ops are known to suffer (staleness and 1-bit features wreck attention: a 4-layer GAT
on Reddit fell from 86.6% to 23.8% accuracy with pipelined stale features): an op whose
definition carries an ``approximate_warning`` and gets a reduced link is reported in
``info(node).comm_warning`` and with a warning naming ``compress_layers`` as the way to leave
it exact.
"""

from __future__ import annotations

import warnings

from torch import fx

from sarcompile.ir.node_info import info, set_info
from sarcompile.ir.vocab import Exchange, LinkPolicy
from sarcompile.compile.passes.context import CompileOptions

__all__ = ["communication"]


def communication(gm: fx.GraphModule, ctx: CompileOptions) -> fx.GraphModule:
    if ctx.exact:
        return gm
    site = 0
    for node in gm.graph.nodes:
        op = info(node).ir_op
        if op is None or op.kind is not Exchange.HALO:
            continue
        layer = info(node).layer or ""
        if ctx.compress_layers is not None and not any(_within(layer, c) for c in ctx.compress_layers):
            continue
        policy = LinkPolicy(
            site,
            node.name,
            staleness=ctx.staleness,
            bounded=ctx.bounded_staleness or 0,
            bits=ctx.compress.bits if ctx.compress else 0,
            error_feedback=ctx.error_feedback,
        )
        site += 1
        node.kwargs = {**node.kwargs, "comm": policy}
        set_info(node, comm=policy)
        if op.approximate_warning:
            msg = (
                f"{node.name} (layer {layer or '-'}): {op.approximate_warning}; keep it exact with "
                "compress_layers=[...] listing only the other layers"
            )
            set_info(node, comm_warning=msg)
            warnings.warn(msg, stacklevel=2)
    gm.recompile()
    return gm


def _within(layer: str, prefix: str) -> bool:
    """``conv1`` covers ``conv1`` and ``conv1.lin``, not ``conv10``."""
    return layer == prefix or layer.startswith(prefix + ".")
