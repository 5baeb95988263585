"""Tracing a user model into a ``torch.fx`` GraphModule whose graph layers are single nodes.

Known graph layers are kept as leaves (``call_module``) so the lower pass can rewrite each
one by rule; everything else is traced through. IR ops written directly in user code
become single ``call_function`` nodes by themselves (see :func:`sarcompile.ops.ir_op`).
"""

from __future__ import annotations

import torch.fx as fx
from torch import nn

from .errors import CompileError
from .passes.lower import lowering_for

__all__ = ["SarTracer", "trace"]


class SarTracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        from .nn import NodeDropout, RandomStream

        # Dropout modules keep their step counters: they must run, not be traced through.
        if lowering_for(m) is not None or isinstance(m, (NodeDropout, RandomStream)):
            return True
        return super().is_leaf_module(m, qualname)


def trace(model: nn.Module) -> fx.GraphModule:
    """Symbolically trace ``model``; failures become a :class:`CompileError` that says why."""
    tracer = SarTracer()
    try:
        graph = tracer.trace(model)
    except fx.proxy.TraceError as e:
        raise CompileError(
            f"cannot trace {type(model).__name__}: {e}. sarcompile traces forward() once with "
            "symbolic tensors, so Python control flow may not depend on tensor values; "
            "move such logic into a submodule that stays a leaf or make it static."
        ) from None
    return fx.GraphModule(tracer.root, graph, type(model).__name__)
