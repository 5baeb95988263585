"""Pass ``kernels``: choose, per op, which kernels run it.

Contract. Expects a lowered (and possibly partitioned) GraphModule. Guarantees every IR
op that takes an ``executor`` keyword (those with generated kernels: ``spmm``,
``attention``) has ``kwargs["executor"]`` set to the user's choice (``auto``, ``torch``
or ``triton``, see :func:`sarcompile.codegen.kernels_for`), so the program's code says
how each op runs. ``auto`` is resolved per call from the tensors' device: a program
compiled once runs with Triton kernels on CUDA tensors and torch kernels on CPU ones.
Values are unchanged.
"""

from __future__ import annotations

import torch.fx as fx

from sarcompile.ir.opdef import definition
from sarcompile.compile.passes.context import CompileOptions

__all__ = ["kernels"]


def kernels(gm: fx.GraphModule, ctx: CompileOptions) -> fx.GraphModule:
    for node in gm.graph.nodes:
        op = definition(node)
        if op is not None and "executor" in op.signature.parameters:
            node.kwargs = {**node.kwargs, "executor": ctx.executor}
    gm.recompile()
    return gm
