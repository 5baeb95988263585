"""Tracing a user model into a ``torch.fx`` GraphModule whose graph layers are single nodes.

Known graph layers are kept as leaves (``call_module``) so the lower pass can rewrite each
one by rule; everything else is traced through. IR ops written directly in user code
become single ``call_function`` nodes by themselves (see :func:`sarcompile.ops.ir_op`).
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import torch.fx as fx
from torch import nn

from .errors import CompileError
from .passes.lower import lowering_for

__all__ = ["SarTracer", "trace"]


class SarTracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        from .nn import NodeDropout, RandomStream

        try:
            lowered = lowering_for(m)
        except CompileError as e:  # a rule refused the layer: say which one
            raise CompileError(f"layer {qualname!r}: {e}") from None
        # Dropout modules keep their step counters: they must run, not be traced through.
        if lowered is not None or isinstance(m, (NodeDropout, RandomStream)):
            return True
        return super().is_leaf_module(m, qualname)

    def create_arg(self, a):
        # A submodule passed to an IR op (message_passing's message function) becomes a
        # get_attr node, so the op receives the module itself when the program runs.
        if isinstance(a, nn.Module):
            return self.create_node("get_attr", self.path_of_module(a), (), {})
        return super().create_arg(a)


def _with_own_forward(model: nn.Module) -> nn.Module:
    """``model``, or where it has a ``forward`` of its own (an instance attribute, as
    ``torch_geometric.nn.Sequential`` generates) a shallow view of it whose class has that
    forward: fx traces ``type(root).forward``. The view shares the model's submodules,
    parameters and buffers, so the traced program refers to the model's own."""
    own = vars(model).get("forward")
    if own is None or getattr(own, "__self__", None) is not model:
        return model
    view_type = type(type(model).__name__, (type(model),), {"forward": own.__func__})
    view = object.__new__(view_type)
    view.__dict__.update({k: v for k, v in vars(model).items() if k != "forward"})
    return view


def trace(model: nn.Module) -> fx.GraphModule:
    """Symbolically trace ``model``; failures become a :class:`CompileError` that says why,
    naming the layer being traced and the user's line that failed."""
    tracer = SarTracer()
    root = lowering_for(model)  # a model that is one layer: trace what it lowers to
    try:
        graph = tracer.trace(_with_own_forward(model if root is None else root))
    except fx.proxy.TraceError as e:
        raise CompileError(
            f"cannot trace {type(model).__name__}{_where(tracer, e)}: {e}. sarcompile traces forward() "
            "once with symbolic tensors, so Python control flow may not depend on tensor values; "
            "move such logic into a submodule that stays a leaf or make it static."
        ) from None
    return fx.GraphModule(tracer.root, graph, type(model).__name__)


def _where(tracer: fx.Tracer, error: BaseException) -> str:
    """`` in layer 'conv2' (MyConv), at file.py:12: `if x.sum() > 0:` `` -- the module fx was
    inside and the innermost line of user code in the traceback."""
    stack = list(getattr(tracer, "module_stack", {}).values())  # (path, type) per module entered
    layer = ""
    if stack and stack[-1][0]:
        path, kind = stack[-1]
        layer = f" in layer {path!r} ({getattr(kind, '__name__', kind)})"
    return layer + user_line(error)


def user_line(error: BaseException) -> str:
    """``, at file.py:12: `code` `` for the innermost frame of ``error``'s traceback that is
    neither torch's nor sarcompile's (empty if there is none)."""
    ours = (str(Path(__file__).resolve().parent) + os.sep, str(Path(fx.__file__).resolve().parents[1]) + os.sep)
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(ours)]
    if not frames:
        return ""
    f = frames[-1]
    return f", at {Path(f.filename).name}:{f.lineno}: `{(f.line or '').strip()}`"
