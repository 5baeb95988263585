"""What tracing patches in other modules' namespaces, and what fx leaves behind in its own.

While :class:`~sarcompile.compile.sar_tracer.SarTracer` traces, torch's size-taking factories
accept traced sizes (:func:`sized_factory`), and names bound to a library function with a
rule (:func:`sarcompile.ir.lowering.register_function_lowering`) point at its IR-op version;
finding those names is cached here (:func:`bound_originals`, :func:`homes_binding_originals`).
:func:`generated_wraps_dropped` keeps fx's table of wrapped functions from growing with each
program compiled.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable

import torch.fx as fx
from torch.fx import _symbolic_trace

from sarcompile.ir.lowering import function_homes, function_lowerings

__all__ = ["FACTORIES", "bound_originals", "generated_wraps_dropped", "homes_binding_originals", "sized_factory"]

# torch 2.2's functions taking sizes take no traced size (torch.ones(g.num_edges(), 1) and
# torch.reshape(x, x.shape + (1,)) raise a TypeError); while tracing, a call given a traced
# value is recorded as a node, as newer torch records it.
FACTORIES = ("ones", "zeros", "full", "empty", "rand", "randn", "reshape", "arange")


def sized_factory(original: Callable) -> Callable:
    """``original`` (a torch factory in :data:`FACTORIES`), recording a node where it is given a traced value."""

    @functools.wraps(original)
    def factory(*args, **kwargs):
        flat = [b for a in (*args, *kwargs.values()) for b in (a if isinstance(a, (tuple, list)) else (a,))]
        proxy = next((a for a in flat if isinstance(a, fx.Proxy)), None)
        if proxy is None:
            return original(*args, **kwargs)
        return proxy.tracer.create_proxy("call_function", original, args, kwargs)

    return factory


# -- fx's table of wrapped functions -----------------------------------------------------------
@contextlib.contextmanager
def generated_wraps_dropped():
    """Within: what fx's generated code adds to its table of ``torch.fx.wrap``'ed functions
    is dropped again on the way out. Each recompile of a GraphModule calling a wrapped
    function registers it anew, keyed by that code's fresh globals, and fx never removes
    an entry, while every trace patches every entry: tracing got slower with each program
    compiled in a process (a sweep of 150 models spent a third of its time there). A
    module's own ``torch.fx.wrap`` calls (an import within) are kept."""
    table = _symbolic_trace._wrapped_fns_to_patch
    before = set(table)
    try:
        yield
    finally:
        for key in [k for k in table if k not in before and not _module_globals(table[k])]:
            del table[key]


def _module_globals(frame: dict) -> bool:
    """Whether ``frame`` is a loaded module's own globals (not, say, fx's generated code's)."""
    module = sys.modules.get(frame.get("__name__", ""))
    return module is not None and vars(module) is frame


# -- which names to swap -----------------------------------------------------------------------
# A module's names bound to a function with a rule, found by scanning its globals: every
# trace swaps those of each home module (every loaded module of a package such as
# torch_geometric, some 600), so a scan is kept until the module or the rules change size.
# Only modules' own globals are kept (they live as long as the process); any other dict,
# such as the globals of fx's generated code, is scanned each time.
_BOUND: dict[int, tuple[dict, int, int, list[str]]] = {}


def bound_originals(frame: dict, rules: dict[int, tuple[Callable, Callable]]) -> list[str]:
    """The names in ``frame`` bound to a function with a rule, to check and swap."""
    kept = _BOUND.get(id(frame))
    if kept is not None and kept[0] is frame and kept[1] == len(frame) and kept[2] == len(rules):
        return kept[3]
    names = [name for name, value in list(frame.items()) if id(value) in rules]
    if _module_globals(frame):
        _BOUND[id(frame)] = (frame, len(frame), len(rules), names)
    return names


_HOMES_BINDING: dict[str, Any] = {}


def homes_binding_originals() -> list[dict]:
    """The globals of the home modules (:func:`function_homes`) that bind a function with a
    rule: every trace swaps those, and a few of some 600 modules do. Kept while the homes,
    the rules and the homes' sizes stay the same (as :func:`bound_originals` keeps one
    module's names)."""
    homes, rules, kept = function_homes(), function_lowerings(), _HOMES_BINDING
    if kept.get("homes") is not homes:  # (function_homes gives a new list when they change)
        kept.update(homes=homes, frames=[vars(m) for m in homes], sizes=None)
    sizes = (len(rules), sum(map(len, kept["frames"])))
    if kept["sizes"] != sizes:
        kept.update(sizes=sizes, binding=[f for f in kept["frames"] if bound_originals(f, rules)])
    return kept["binding"]
