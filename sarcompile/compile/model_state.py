"""Refusing a forward that changes the model's own state.

A compiled program is what one trace of ``forward`` saw. Where ``forward`` changes the
model's state -- a parameter or buffer updated in place (``self.calls.add_(1)``, a running
average), a tensor attribute given a new tensor (``self.b = self.b + 1``), a plain
attribute given a new value (``self.k += 1``) -- the trace runs the change once, or not at
all (an in-place update whose result nothing reads is dead code to fx), and every later
call would compute with the state as it was when traced: wrong numbers, silently. So such a
``forward`` is refused when it is traced, naming the attribute and the line. A plain
attribute that ``forward`` sets to the same value on every call (DGL's ``RelGraphConv``
sets ``self.presorted`` from its argument, PyG's ``FastRGCNConv`` ``self.fuse = False``)
changes only once: the model is traced again, and a second change is refused.

Layers whose state sarcompile updates itself (batch norm's running statistics) stay leaves
of the trace and are not traced into. Private attributes (``_alpha``, which PyG's
attention layers keep for inspection) and traced values kept on the model are left alone:
they do not feed later calls' numbers.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.fx as fx
from torch import nn
from torch.overrides import TorchFunctionMode

from sarcompile.errors import CompileError
from sarcompile.compile.source_lines import called_by_sarcompile, calling_line, source_line

__all__ = ["refuse_state_updates", "settled_trace"]

_PLAIN = (bool, int, float, complex, str, bytes, type(None))
# Ops that return a view of their first argument: an in-place update through one changes it.
_VIEWS = {"view", "view_as", "reshape", "reshape_as", "t", "transpose", "permute", "select", "narrow", "squeeze",
          "unsqueeze", "expand", "expand_as", "flatten", "unflatten", "detach", "__getitem__", "data"}
_IN_PLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                       operator.imod, operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor,
                       operator.ilshift, operator.irshift, operator.setitem}
# The same updates as Tensor methods (``Tensor.__iadd__``), as a torch function mode sees them.
_IN_PLACE_DUNDERS = {f"__{op.__name__}__" for op in _IN_PLACE_OPERATORS}
_FIX = ("A compiled program is what one trace of forward saw: later calls would compute with the state as "
        "it was then. Update the model's state outside forward (between steps, e.g. after optimizer.step()), "
        "or keep the value in an input of the call")


def _plain(value: Any) -> bool:
    return isinstance(value, _PLAIN) or (isinstance(value, tuple) and all(_plain(v) for v in value))


def _snapshot(model: nn.Module) -> dict[tuple[nn.Module, str], Any]:
    """Each module's parameters, buffers and public tensor attributes (the objects) and public
    plain attributes (their values)."""
    state: dict[tuple[nn.Module, str], Any] = {}
    for m in model.modules():
        for name, t in [*m._parameters.items(), *m._buffers.items()]:
            state[(m, name)] = t
        for name, v in vars(m).items():
            if not name.startswith("_") and name != "training" and (_plain(v) or isinstance(v, torch.Tensor)):
                state[(m, name)] = v
    return state


def _changes(model: nn.Module, before: dict[tuple[nn.Module, str], Any]) -> dict[tuple[nn.Module, str], Any]:
    """What the modules of ``before`` hold now where it differs (modules added since, such as
    the tracer's helpers, are not the model's state)."""
    known = {m for m, _ in before}
    after = {k: v for k, v in _snapshot(model).items() if k[0] in known}
    def same(a: Any, b: Any) -> bool:
        return a is b if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) else a == b
    return {k: v for k, v in after.items() if k not in before or not same(before[k], v)}


def _put_back(before: dict[tuple[nn.Module, str], Any]) -> None:
    for (module, name), value in before.items():
        if name in module._parameters:
            module._parameters[name] = value
        elif name in module._buffers:
            module._buffers[name] = value
        else:
            setattr(module, name, value)


def _real_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The buffers and plain tensor attributes of ``model``'s modules, by path: what fx hands
    the traced code as the tensors themselves."""
    for path, m in model.named_modules(remove_duplicate=False):
        for name, t in [*m._buffers.items(), *((k, v) for k, v in vars(m).items() if isinstance(v, torch.Tensor))]:
            if t is not None:
                yield (f"{path}.{name}" if path else name), t


class _InPlaceGuard(TorchFunctionMode):
    """Refuses an in-place update of one of ``model``'s buffers or tensor attributes (or a
    view of one) made by the code being traced: fx hands them over as the tensors
    themselves, so such an update runs once, on the real tensor, and the program never sees it. Updates sarcompile makes
    itself (putting buffers back after the trace) or while the tracer computes example
    values (``computing()``: a leaf layer's running statistics) are the tracer's own, undone
    after the trace."""

    def __init__(self, model: nn.Module, what: str, computing: Callable[[], bool]):
        super().__init__()
        self.names = {id(t): name for name, t in _real_tensors(model)}
        self.what, self.computing = what, computing

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        in_place = name in _IN_PLACE_DUNDERS or (name.endswith("_") and not name.startswith("_")) or \
            kwargs.get("inplace") is True
        if in_place and args and isinstance(args[0], torch.Tensor) and not (self.computing() or called_by_sarcompile()):
            target = args[0] if args[0]._base is None else args[0]._base
            if id(target) in self.names:
                line = calling_line()
                raise CompileError(
                    f"{self.what}'s forward updates '{self.names[id(target)]}' in place (`{name}`)"
                    f"{', at ' + line if line else ''}: it changes the model's state. {_FIX}."
                )
        return func(*args, **kwargs)


@dataclass
class StateWatch:
    """What :func:`state_kept` saw: ``settled`` is false where the trace gave public plain
    attributes new values (and nothing else), which forward may set alike on every call
    (``self.presorted = presorted``): trace again, passing this watch, and a second change is
    refused. ``before``: the model's state before the trace."""

    before: dict[tuple[nn.Module, str], Any]
    settled: bool = True


@contextlib.contextmanager
def state_kept(model: nn.Module, what: str, computing: Callable[[], bool], first: StateWatch | None = None
               ) -> Iterator[StateWatch]:
    """Around a trace of ``model`` (``what`` names it): refuse with a :class:`CompileError`
    an in-place update of one of its parameters or buffers (see :class:`_InPlaceGuard`), a
    trace that gave one of them a new tensor, and a trace again after ``first`` (an earlier
    trace's watch) that gave a public plain attribute a new value once more. Tracing may
    leave them changed (fx computes with a buffer it reads as a plain tensor): they are put
    back as they were before the first trace."""
    watch = StateWatch(_snapshot(model))
    # fx traces parameters as nodes (refuse_state_updates sees their updates) but hands user
    # code buffers and tensor attributes themselves: only a model with those needs the guard,
    # and its cost (a Python call per torch function while tracing).
    guarded = any(True for _ in _real_tensors(model))
    with _InPlaceGuard(model, what, computing) if guarded else contextlib.nullcontext():
        yield watch
    changes = _changes(model, watch.before)
    if not changes:
        return
    if first is None and not any(isinstance(v, torch.Tensor) or isinstance(watch.before.get(k), torch.Tensor)
                                 for k, v in changes.items()):
        watch.settled = False
        return
    original = watch.before if first is None else first.before
    names = {m: path for path, m in model.named_modules()}
    said = []
    for (module, name), value in changes.items():
        where = f"'{names[module]}.{name}'" if names.get(module) else f"'{name}'"
        steps = [original.get((module, name)), *([] if first is None else [watch.before.get((module, name))]), value]
        said.append(where if isinstance(value, torch.Tensor) else f"{where} ({' -> '.join(map(repr, steps))})")
    _put_back(original)
    raise CompileError(f"{what}'s forward assigns {', '.join(said)}: it changes the model's state. {_FIX}.")


R = TypeVar("R")


def settled_trace(model: nn.Module, what: str, new_tracer: Callable[[], Any], run: Callable[[Any], R]) -> R:
    """``run(new_tracer())`` with ``model``'s state kept (:func:`state_kept`; the tracer's
    ``_computing`` says when it computes example values), once more with a fresh tracer
    where the trace set plain attributes: forward may set them alike on every call, and a
    second change is refused."""
    first = None
    while True:
        tracer = new_tracer()
        with state_kept(model, what, lambda: tracer._computing, first) as first:
            result = run(tracer)
        if first.settled:
            return result


def _base_attribute(node: Any) -> fx.Node | None:
    """The ``get_attr`` node (a parameter or buffer) ``node`` is, or is a view of."""
    while isinstance(node, fx.Node):
        if node.op == "get_attr":
            return node
        view = (node.op == "call_method" and node.target in _VIEWS) or (
            node.op == "call_function" and node.target in (operator.getitem, getattr) and
            (node.target is operator.getitem or node.args[1] == "data"))
        if not view or not node.args:
            return None
        node = node.args[0]
    return None


def _in_place(node: fx.Node) -> str | None:
    """The name of the in-place update ``node`` makes to its first argument, or None."""
    name = getattr(node.target, "__name__", str(node.target))
    if node.op == "call_method" and name.endswith("_") and not name.startswith("_"):
        return name
    if node.op == "call_function" and (node.target in _IN_PLACE_OPERATORS or name.endswith("_") and
                                       not name.startswith("_") or node.kwargs.get("inplace") is True):
        return name
    return None


def refuse_state_updates(graph: fx.Graph, what: str) -> None:
    """Refuse a traced ``graph`` (of ``what``) that updates a parameter in place (fx traces
    parameters as ``get_attr`` nodes, so the update is a node: one whose result nothing
    reads is dead code to fx, and would be dropped)."""
    for node in graph.nodes:
        op = _in_place(node) if node.op in ("call_method", "call_function") else None
        base = _base_attribute(node.args[0]) if op and node.args else None
        if base is not None:
            line = source_line(node)
            raise CompileError(
                f"{what}'s forward updates '{base.target}' in place (`{op}`){', at ' + line if line else ''}: it "
                f"changes the model's state. {_FIX}."
            )
