"""What a failed trace tells the user: the kind of failure, what to do about it, and where.

:func:`sarcompile.compile.trace.trace` turns any error raised while tracing into a
:class:`~sarcompile.errors.CompileError` whose message is :func:`where` and :func:`failure`
of it. The exceptions here are raised by the tracers (a TorchScript module called, ``len()``
of a row axis, an assignment that is not row-local) for :func:`failure` to recognise.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import torch.fx as fx

from sarcompile.compile.source_lines import source_line, user_file

__all__ = ["AssignError", "LengthUnknown", "TorchScriptCalled", "failure", "user_line", "where"]


_CONTROL_FLOW = ("sarcompile traces forward() once with symbolic tensors, so Python control flow may not depend on "
                 "tensor values or row counts (feature sizes, dim() and the plain Python arguments of the call are "
                 "known when compiling); move such logic into a submodule that stays a leaf or make it static.")


class LengthUnknown(Exception):
    """``len()`` of a traced tensor whose first axis is not known when compiling."""


class AssignError(Exception):
    """An assignment into part of a traced tensor that is not row-local (the message says why
    and how to write it); ``node``: one traced from its line, where the traceback has none."""

    def __init__(self, message: str, node: fx.Node | None = None):
        super().__init__(message)
        self.node = node


class TorchScriptCalled(Exception):
    """A TorchScript module called while tracing (its path is the message)."""


def failure(e: Exception) -> str:
    """What went wrong while tracing, and what the user can do about it, by the kind of
    failure: only Python control flow on a traced value gets the control-flow advice."""
    text = str(e)
    if isinstance(e, fx.proxy.TraceError) and "cannot be iterated" in text:
        return ("a per-node tensor was iterated along its rows (a Python loop over `x`, over torch.split(x, k) or "
                "x.unbind(0), or `*x`), whose row count is not known when compiling and differs between workers; "
                "compute it for all rows at once with tensor operations. A loop over a parameter's rows, or over a "
                f"feature dim (x.unbind(1), torch.split(x, k, dim=1), x.t()), compiles. {_CONTROL_FLOW}")
    if isinstance(e, fx.proxy.TraceError):  # bool() of a traced value: control flow
        return f"{text}. {_CONTROL_FLOW}"
    if isinstance(e, AssignError):
        return text
    if isinstance(e, TypeError) and "does not support item assignment" in text:
        return ("an assignment into part of a traced tensor (`h[:, 0] = v`), which torch.fx cannot record; compute "
                "the new tensor instead, e.g. with torch.where(mask, v, h), torch.cat of its pieces along the feature "
                "dim, or h * keep")
    if isinstance(e, TorchScriptCalled):
        return (f"layer {text!r} is a TorchScript module (torch.jit.script or torch.jit.trace), which torch.fx cannot "
                "trace into, so sarcompile cannot see what it computes; give the model the nn.Module it was "
                "scripted from")
    if isinstance(e, RuntimeError) and "Expected a value of type" in text and "Proxy" in text:
        return ("a TorchScript function (torch.jit.script) was called with a traced tensor; torch.fx cannot trace "
                "into TorchScript, so sarcompile cannot see what it computes. Call the Python function it was "
                "scripted from")
    if isinstance(e, TypeError) and "Proxy'" in text:  # the model's Python asked a traced value for a number
        return (f"a traced tensor (or its shape) was used as a Python number ({e}). sarcompile traces forward() "
                "once with symbolic tensors, whose values and row counts are not known (and differ between "
                "workers); keep the value a tensor (e.g. `x * x.max()` rather than `x * float(x.max())`) and loop "
                "over constants, not over rows.")
    if isinstance(e, LengthUnknown) or (isinstance(e, RuntimeError) and "'len' is not supported" in text):
        return ("len() of a traced tensor, whose first axis is its row count: not known when compiling, and not "
                "the same on every worker. Use x.size(0) where a size is needed (it stays symbolic), x.dim() or "
                "len(x.shape) for the number of axes, or x.size(k) of a feature axis")
    if isinstance(e, KeyError):
        key = e.args[0] if e.args else None
        if isinstance(key, fx.Proxy):
            return (f"a dict or ModuleDict was indexed by a traced value ({key}), whose value is not known when "
                    "compiling; index it by a Python value (a str, int or bool argument of forward is traced as "
                    "its value, and each value compiles a program of its own)")
        return (f"KeyError {text}: forward asked for a key that what it indexes does not hold when traced (a dict "
                "argument holds the keys of the call, a graph's frames the fields set on the graph it is called "
                "with and those forward stored). Check the key against what the model is called with")
    if isinstance(e, AttributeError):
        return (f"AttributeError: {text}. While tracing, forward gets a symbolic tensor for each tensor argument and "
                "sarcompile's graph (a sarcompile Graph, or a DGL-style view of it when DGL is imported) for the "
                "graph; read what else it needs before the call and pass it as an argument")
    return (f"{type(e).__name__}: {text}, raised by forward while sarcompile traced it on example inputs shaped as "
            "the call's; the model raises it eagerly on such inputs too, or it needs a value that tracing does not "
            "know (a tensor's contents): compute that value before the call and pass it as an argument")


def where(tracer: fx.Tracer, error: BaseException) -> str:
    """`` in layer 'conv2' (MyConv), at file.py:12: `if x.sum() > 0:` `` -- the module fx was
    inside and the innermost line of user code in the traceback."""
    stack = list(getattr(tracer, "module_stack", {}).values())  # (path, type) per module entered
    layer = ""
    if stack and stack[-1][0]:
        path, kind = stack[-1]
        layer = f" in layer {path!r} ({getattr(kind, '__name__', kind)})"
    if isinstance(error, AssignError) and error.node is not None:
        line = source_line(error.node)
        return layer + (f", at {line}" if line else "")
    return layer + user_line(error)


def user_line(error: BaseException) -> str:
    """``, at file.py:12: `code` `` for the innermost frame of ``error``'s traceback that is
    the user's (:func:`~sarcompile.compile.source_lines.user_file`), else neither torch's nor
    sarcompile's (a PyG layer's, where only library code ran); empty if there is none."""
    ours = (str(Path(__file__).resolve().parents[1]) + os.sep, str(Path(fx.__file__).resolve().parents[1]) + os.sep)
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(ours)]
    frames = [f for f in frames if user_file(f.filename)] or frames
    if not frames:
        return ""
    f = frames[-1]
    return f", at {Path(f.filename).name}:{f.lineno}: `{(f.line or '').strip()}`"

