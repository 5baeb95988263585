"""Tracing a user model into a ``torch.fx`` GraphModule whose graph layers are single nodes.

Known graph layers are kept as leaves (``call_module``) so the lower pass can rewrite each
one by rule; everything else is traced through. IR ops written directly in user code
become single ``call_function`` nodes by themselves (see :func:`sarcompile.ops.ir_op`).
Library functions with a function rule (:func:`sarcompile.lowering.register_function_lowering`)
are replaced by their IR-op versions while tracing.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
import torch.fx as fx
from torch import nn

from .errors import CompileError, SarcompileError
from .lowering import function_homes, function_lowerings, lowering_for
from .nn import NodeDropout, RandomStream

__all__ = ["SarTracer", "trace"]


class SarTracer(fx.Tracer):
    """fx's tracer, with sarcompile's layers as leaves. With ``graph_input`` (the position
    after ``self``, or the name, of the graph argument) and DGL imported, the graph is
    traced as a :class:`~sarcompile.frontends.dgl_graph.GraphProxy`, so code calling
    ``g.update_all`` becomes IR ops."""

    def __init__(self, graph_input: int | str | None = None):
        super().__init__()
        self.record_stack_traces = True  # the residency pass names the user's line it refuses
        self.graph_input = graph_input
        self.helpers: list[str] = []  # modules added to the root while tracing, see add_helper_module
        self._swapped: list[tuple[dict, str, Any]] = []  # (module globals, name, original), see _swap_functions

    def trace(self, root, concrete_args=None):
        try:
            for name in _FACTORIES:
                original = getattr(torch, name)
                self._swapped.append((vars(torch), name, original))
                setattr(torch, name, _sized_factory(original))
            for home in function_homes():
                self._swap_in(vars(home))
            self._swap_functions(getattr(root, "forward", root))
            return super().trace(root, concrete_args)
        finally:
            for frame, name, original in reversed(self._swapped):
                frame[name] = original
            self._swapped.clear()

    def call_module(self, m, forward, args, kwargs):
        self._swap_functions(getattr(m, "forward", None))
        return super().call_module(m, forward, args, kwargs)

    def _swap_functions(self, fn: Any) -> None:
        """Point the names that ``fn``'s module binds to a function with a rule at its
        replacement, until the trace ends: how fx itself wraps functions (``autowrap``),
        but calling the IR-op version rather than recording the library's function."""
        frame = getattr(fn, "__globals__", None)
        if frame:
            self._swap_in(frame)

    def _swap_in(self, frame: dict) -> None:
        rules = function_lowerings()
        if not rules:
            return
        for name, value in list(frame.items()):
            rule = rules.get(id(value))
            if rule is not None and rule[0] is value:
                self._swapped.append((frame, name, value))
                frame[name] = rule[1]

    def add_helper_module(self, module: nn.Module) -> nn.Module:
        """Attach ``module`` (e.g. a DGL builtin message function) to the root, so an IR op
        can take it as an argument; :func:`trace` detaches it from the user's model again."""
        name = f"_sc_helper_{len(self.helpers)}"
        self.root.add_module(name, module)
        self.helpers.append(name)
        if getattr(self, "submodule_paths", None) is not None:  # fx's cache of module paths
            self.submodule_paths[module] = name
        return module

    def path_of_module(self, mod: nn.Module) -> str:
        """A module made inside forward (DGL's ``EdgeWeightNorm("both")(g, w)``) is not
        reachable from the root: attach it as a helper, if it holds no state (one made with
        parameters draws them anew each call, which a compiled program cannot repeat)."""
        try:
            return super().path_of_module(mod)
        except NameError:
            if any(True for _ in itertools.chain(mod.parameters(), mod.buffers())):
                raise CompileError(
                    f"{type(mod).__name__} is not a submodule of the model traced (made inside forward?) and has "
                    "parameters or buffers of its own, which each call would make anew; make it in __init__"
                ) from None
            self.add_helper_module(mod)
            return super().path_of_module(mod)

    def create_args_for_root(self, root_fn, is_module, concrete_args=None):
        fn, args = super().create_args_for_root(root_fn, is_module, concrete_args)
        if self.graph_input is None or "dgl" not in sys.modules:
            return fn, args
        from .frontends.dgl_graph import GraphProxy

        args = list(args)
        first = 1 if is_module else 0
        for i in range(first, len(args)):
            a = args[i]
            if isinstance(a, fx.Proxy) and self.graph_input in (i - first, a.node.target):
                args[i] = GraphProxy(a.node, self)
        return fn, args

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
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


# torch 2.2's functions taking sizes take no traced size (torch.ones(g.num_edges(), 1) and
# torch.reshape(x, x.shape + (1,)) raise a TypeError); while tracing, a call given a traced
# value is recorded as a node, as newer torch records it.
_FACTORIES = ("ones", "zeros", "full", "empty", "reshape")


def _sized_factory(original: Callable) -> Callable:
    @functools.wraps(original)
    def factory(*args, **kwargs):
        flat = [b for a in (*args, *kwargs.values()) for b in (a if isinstance(a, (tuple, list)) else (a,))]
        proxy = next((a for a in flat if isinstance(a, fx.Proxy)), None)
        if proxy is None:
            return original(*args, **kwargs)
        return proxy.tracer.create_proxy("call_function", original, args, kwargs)

    return factory


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


def trace(
    model: nn.Module, graph_input: int | str | None = None, none_inputs: frozenset[str] = frozenset()
) -> fx.GraphModule:
    """Symbolically trace ``model``; failures become a :class:`CompileError` that says why,
    naming the layer being traced and the user's line that failed. ``graph_input``: see
    :class:`SarTracer`; ``none_inputs``: forward's optional inputs that are None, traced
    as constants."""
    tracer = SarTracer(graph_input)
    root = lowering_for(model)  # a model that is one layer: trace what it lowers to
    root = _with_own_forward(model if root is None else root)
    names = inspect.signature(root.forward).parameters
    constants = {name: None for name in none_inputs if name in names}
    try:
        graph = tracer.trace(root, concrete_args=constants or None)
        return fx.GraphModule(tracer.root, graph, type(model).__name__)
    except SarcompileError:
        raise
    except Exception as e:  # TraceError, or e.g. torch.ones(1, proxy) on older torch: say where and why
        if isinstance(e, TypeError) and "'Proxy'" in str(e):  # the model's Python asked a traced value for a number
            raise CompileError(
                f"cannot trace {type(model).__name__}{_where(tracer, e)}: a traced tensor (or its shape) was used as "
                f"a Python number ({e}). sarcompile traces forward() once with symbolic tensors, whose values and "
                "row counts are not known (and differ between workers); keep the value a tensor (e.g. `x * x.max()` "
                "rather than `x * float(x.max())`) and loop over constants, not over rows."
            ) from None
        raise CompileError(
            f"cannot trace {type(model).__name__}{_where(tracer, e)}: {e}. sarcompile traces forward() "
            "once with symbolic tensors, so Python control flow may not depend on tensor values; "
            "move such logic into a submodule that stays a leaf or make it static."
        ) from None
    finally:  # the GraphModule holds the helper modules now; the user's model must not
        for name in tracer.helpers:
            delattr(tracer.root, name)


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
