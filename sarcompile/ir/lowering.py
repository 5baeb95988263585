"""The lowering rules: which layer modules the compiler rewrites into IR ops, and how.

A rule maps a layer to an equivalent module written with IR ops, with the layer's call
signature, sharing the layer's parameters. ``sarcompile.nn`` layers are written with IR
ops already, so their rule returns the layer itself; front-ends (PyG, DGL) register rules
for their layers when imported. The tracer keeps every layer with a rule as a leaf
(:mod:`sarcompile.compile.trace`) and the lower pass inlines what the rule gives
(:mod:`sarcompile.compile.passes.lower`).

A function rule maps a library function a layer calls (DGL's ``edge_softmax``) to one
written with IR ops, taking the same arguments: while tracing, the tracer calls the
replacement wherever the traced code calls the original (see :mod:`sarcompile.compile.trace`).
"""

from __future__ import annotations

from types import ModuleType
import sys
from typing import Any, Callable, ContextManager

from torch import nn

__all__ = ["register_lowering", "lowering_for", "has_lowering", "declare", "declared_helpers", "register_function_lowering", "function_lowerings", "function_homes",
           "register_trace_context", "trace_contexts"]

_RULES: dict[type, Callable[[nn.Module], nn.Module]] = {}
_FUNCTIONS: dict[int, tuple[Callable, Callable]] = {}  # id(original) -> (original, replacement)
_HOMES: list[ModuleType | str] = []  # modules whose attributes are swapped too
_HOMES_FOUND: dict[str, Any] = {}  # function_homes' last answer, and the sizes it was found for
_DECLARED: dict[Callable, Any] = {}  # row-local helpers -> their output residency (see declare)
_CONTEXTS: list[Callable[[], ContextManager]] = []  # entered around every trace (see register_trace_context)
_GRAPH_VIEWS: list[tuple[Callable[[Any, Any], Any], Callable[[Any, Any], Any]]] = []  # see register_graph_view


def register_lowering(layer_type: type, rule: Callable[[nn.Module], nn.Module]) -> None:
    """Lower every ``layer_type`` module ``m`` to ``rule(m)``, a module written with IR ops."""
    _RULES[layer_type] = rule


def lowering_for(m: nn.Module) -> nn.Module | None:
    """What ``m`` lowers to (the rule of its nearest class that has one), or None."""
    for t in type(m).__mro__:
        if t in _RULES:
            return _RULES[t](m)
    return None


def has_lowering(m: nn.Module) -> bool:
    """Whether ``m`` is a layer with a rule (without running the rule)."""
    return any(t in _RULES for t in type(m).__mro__)


def declare(fn: Callable, output: Any) -> Callable:
    """Declare ``fn`` (a front-end's ``torch.fx.wrap`` helper, one node in the program)
    row-local, for the residency pass: it may take the graph and per-row values, and its
    result has residency ``output`` (a :class:`~sarcompile.ir.vocab.Residency`), or that of
    its argument named ``output``. Returns ``fn``."""
    _DECLARED[fn] = output
    return fn


def declared_helpers() -> dict[Callable, Any]:
    """The helpers front-ends declared row-local, with their output residency."""
    return _DECLARED


def register_function_lowering(
    original: Callable, replacement: Callable, homes: tuple[ModuleType | str, ...] = ()
) -> None:
    """While tracing, call ``replacement`` (same arguments, written with IR ops, falling
    back to ``original`` where a call is not on the traced graph) where the traced code
    calls ``original``: by a name it imported, or as an attribute of one of ``homes``
    (modules, or package names standing for every module of the package: where library
    code and users reach it, ``dgl.ops.edge_softmax``, ``"torch_geometric"``)."""
    _FUNCTIONS[id(original)] = (original, replacement)
    _HOMES.extend(h for h in homes if h not in _HOMES)


def function_lowerings() -> dict[int, tuple[Callable, Callable]]:
    """The function rules, by ``id`` of the original (module globals hold unhashable values)."""
    return _FUNCTIONS


def function_homes() -> list[ModuleType]:
    """The modules named by the function rules as where the originals are reached (a
    package's modules as loaded now)."""
    key = (len(sys.modules), len(_HOMES))  # every trace asks; imports and rules change the answer
    if _HOMES_FOUND.get("key") != key:
        loaded = list(sys.modules.items())
        out: list[ModuleType] = []
        for home in _HOMES:
            if isinstance(home, str):
                out.extend(m for name, m in loaded if m is not None and (name == home or name.startswith(home + ".")))
            else:
                out.append(home)
        _HOMES_FOUND.update(key=key, modules=out)
    return _HOMES_FOUND["modules"]


def register_trace_context(context: Callable[[], ContextManager]) -> None:
    """Enter ``context()`` around every trace of a model or layer: a front-end's rules for
    what its library's code does with traced values outside any layer (PyG's, indexing
    and scattering over ``edge_index`` in a model's own forward)."""
    if context not in _CONTEXTS:
        _CONTEXTS.append(context)


def trace_contexts() -> tuple[Callable[[], ContextManager], ...]:
    """The contexts registered with :func:`register_trace_context`, in order."""
    return tuple(_CONTEXTS)


def register_graph_view(
    call_values: Callable[[Any, Any], Any], argument: Callable[[Any, Any], Any]
) -> None:
    """How a library's code reads a graph input while it is traced (DGL's: a DGL graph with
    frames), registered by that library's front-end as it registers its rules, so the tracer
    imports no front-end. ``call_values(tracer, value)``: ``value`` (a call's arguments) with
    each graph in it as the library reads it; ``argument(tracer, node)``: the graph
    placeholder ``node`` as an argument of one of the library's lowered functions."""
    _GRAPH_VIEWS[:] = [(call_values, argument)]


def graph_view() -> tuple[Callable[[Any, Any], Any], Callable[[Any, Any], Any]] | None:
    """The graph view registered with :func:`register_graph_view`, if a front-end did."""
    return _GRAPH_VIEWS[0] if _GRAPH_VIEWS else None
