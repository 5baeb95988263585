"""Pass ``sar``: IR ops on the global graph -> sequential-aggregation ops on a shard.

Contract. Expects a lowered (and fused) GraphModule, IR ops as ``call_function`` nodes.
Guarantees that every IR op whose definition exchanges halo rows (``spmm``, ``sddmm``,
``attention``, ``message_passing``) has its arguments normalised (all by position,
defaults filled) and a ``strategy`` keyword (``remat`` until the strategy pass decides);
on a worker's shard the op then runs as a sequential aggregation over blocks. Collective
ops (``batch_norm``) get ``strategy=Strategy.ALLREDUCE``: their statistics are summed over
all workers; ops that reduce onto source rows (``edge_reduce_src``) get
``strategy=Strategy.PUSH``. Ops that need no communication (``edge_softmax``, ``edge_dropout``) are left
as they are. Each rewritten node records ``info(node).ir_op`` (the
:class:`~sarcompile.ir.opdef.OpDef`) and ``info(node).args`` (its bound arguments). Modules whose result would silently differ on a shard (torch's batch
norm, over the local nodes only) are rejected with a :class:`CompileError`.
"""

from __future__ import annotations

import inspect

import torch.fx as fx
from torch import nn

from sarcompile.errors import CompileError
from sarcompile.ir.node_info import set_info
from sarcompile.ir.opdef import PASS_KEYWORDS, definition
from sarcompile.ir.vocab import Exchange, Strategy
from sarcompile.compile.passes.context import CompileOptions

__all__ = ["sar"]

# Layers that reduce over the node dimension: on a worker they would see only its nodes.
_NODE_REDUCING = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)


# The strategy each kind of exchanging op starts with (the strategy pass decides halo ops').
_FIRST_STRATEGY = {Exchange.HALO: Strategy.REMAT, Exchange.ALLREDUCE: Strategy.ALLREDUCE, Exchange.PUSH: Strategy.PUSH}


def sar(gm: fx.GraphModule, ctx: CompileOptions) -> fx.GraphModule:
    for node in gm.graph.nodes:
        if node.op == "call_module" and isinstance(gm.get_submodule(node.target), _NODE_REDUCING):
            kind = type(gm.get_submodule(node.target)).__name__
            raise CompileError(
                f"layer {node.target!r} ({kind}) normalises over the nodes it sees, which on a worker "
                "are only its own, so N workers would not match one machine. Use sc.nn.BatchNorm "
                "(statistics across all workers, same parameters and state_dict keys) or LayerNorm."
            )
        op = definition(node)
        if op is None or op.kind is Exchange.NONE:
            continue
        args = op.bind(node.args, node.kwargs)
        for keyword in PASS_KEYWORDS:  # set by this pass and those after it
            args.pop(keyword, None)
        params = op.signature.parameters
        keyword = {k: v for k, v in args.items() if params[k].kind is inspect.Parameter.KEYWORD_ONLY}
        node.args = tuple(v for k, v in args.items() if k not in keyword)
        node.kwargs = {**{k: v for k, v in keyword.items() if v is not params[k].default},
                       "strategy": _FIRST_STRATEGY[op.kind]}
        set_info(node, ir_op=op, args=args)
    gm.graph.lint()
    gm.recompile()
    return gm
