"""The fx tracer that keeps graph layers as single nodes: :class:`SarTracer`.

Known graph layers are kept as leaves (``call_module``) so the lower pass can rewrite each
one by rule; everything else is traced through. IR ops written directly in user code
become single ``call_function`` nodes by themselves (see :func:`sarcompile.ir.ops.ir_op`).
Library functions with a function rule (:func:`sarcompile.ir.lowering.register_function_lowering`)
are replaced by their IR-op versions while tracing (:mod:`sarcompile.compile.function_swaps`).
Graphs are traced as the front-end's graph view, node tables as inputs, and a call with dicts
or a typed graph as one placeholder per leaf. :class:`~sarcompile.compile.trace.ShapeTracer`
adds example values on top.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import sys
from collections.abc import Mapping
from typing import Any, Callable

import torch
import torch.fx as fx
from torch import nn

from sarcompile.errors import CompileError
from sarcompile.ir.lowering import function_lowerings, graph_view, lowering_for, trace_contexts
from sarcompile.graph.hetero import TracedHetero
from sarcompile.compile.function_swaps import FACTORIES, bound_originals, homes_binding_originals, sized_factory
from sarcompile.compile.leaves import ArgLayout, rebuilt_arguments
from sarcompile.compile.source_lines import user_frame
from sarcompile.compile.trace_errors import TorchScriptCalled
from sarcompile.nn import NodeDropout, RandomStream
from sarcompile.ir.node_info import set_info
from sarcompile.ir.probe import Input

__all__ = ["SarTracer"]


class SarTracer(fx.Tracer):
    """fx's tracer, with sarcompile's layers as leaves. With ``graph_input`` (the position
    after ``self``, or the name, of the graph argument) and DGL imported, the graph is
    traced as the DGL front-end's :class:`~sarcompile.frontends.dgl.graph.GraphProxy` (its
    graph view, :func:`~sarcompile.ir.lowering.register_graph_view`), so code calling
    ``g.update_all`` becomes IR ops. ``constants``: forward's arguments (by name) that it
    is traced with as values, not proxies (plain Python arguments, see
    :func:`~sarcompile.compile.leaves.is_plain`); each keeps its placeholder, unused, so the
    program takes the same arguments as forward. ``graph_leaves``: in a call traced leaf
    by leaf (``layouts``), the leaves that are one-type graphs, traced as DGL graphs too;
    a graph the model keeps (``self.g``, an ``attr`` layout) is set on its module while
    tracing, so forward reads the program's input there."""

    def __init__(self, graph_input: int | str | None = None, layouts: tuple[ArgLayout, ...] = (),
                 tables: Mapping[str, Input] | None = None, constants: Mapping[str, Any] | None = None,
                 graph_leaves: frozenset[str] = frozenset()):
        super().__init__()
        self.graph_input = graph_input
        self.graph_leaves = graph_leaves
        self.constants = dict(constants or {})
        self.layouts = layouts  # a call with dicts or a typed graph: one placeholder per leaf
        self.tables = dict(tables or {})  # node tables (parameter name -> its input): inputs, not get_attr
        self._table_proxies: dict[str, fx.Proxy] = {}
        self.helpers: list[str] = []  # modules added to the root while tracing, see add_helper_module
        self._swapped: list[tuple[dict, str, Any]] = []  # (module globals, name, original), see _swap_functions

    def create_node(self, *args, **kwargs) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        # Where in the user's code the node comes from, for the residency pass to name the
        # line it refuses. fx's own record_stack_traces would symbolize a whole stack per
        # node, and its first use imports torch._dynamo: a second on every fresh compile.
        set_info(node, user_frame=user_frame(sys._getframe(1)))
        return node

    def trace(self, root, concrete_args=None):
        try:
            for name in FACTORIES:
                original = getattr(torch, name)
                self._swapped.append((vars(torch), name, original))
                setattr(torch, name, sized_factory(original))
            for frame in homes_binding_originals():
                self._swap_in(frame)
            self._swap_functions(getattr(root, "forward", root))
            for cls in type(root).__mro__ if isinstance(root, nn.Module) else ():  # a layer's message() etc.
                if cls.__module__ in sys.modules:
                    self._swap_in(vars(sys.modules[cls.__module__]))
            with contextlib.ExitStack() as contexts:  # the front-ends' (see register_trace_context)
                for context in trace_contexts():
                    contexts.enter_context(context())
                return super().trace(root, concrete_args)
        finally:
            for frame, name, original in reversed(self._swapped):
                frame[name] = original
            self._swapped.clear()

    def call_module(self, m, forward, args, kwargs):
        if isinstance(m, torch.jit.ScriptModule):
            raise TorchScriptCalled(self.path_of_module(m))
        self._swap_functions(getattr(m, "forward", None))
        if any(isinstance(v, (dict, TracedHetero)) for v in (*args, *kwargs.values())):
            # A layer over dicts or a typed graph (PyG's HGTConv(x_dict, edge_index_dict)) cannot be
            # one node (a node's arguments are values, not a typed graph): what it lowers to is
            # traced in its place, referring to the layer's own parameters.
            lowered = lowering_for(m)
            if lowered is not None and lowered is not m:
                paths = getattr(self, "submodule_paths", None) or {}
                for sub in lowered.children():  # its own state (HANConv's dropout stream), for the program to call
                    if sub not in paths and sub is not m:
                        self.add_helper_module(sub)
                self._swap_functions(lowered.forward)
                return lowered.forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        if isinstance(attr_val, nn.Parameter) and self.tables:
            path = next((n for n, p in self.root.named_parameters() if p is attr_val), None)
            if path in self.tables:
                return self.table_proxy(path)
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def table_proxy(self, path: str) -> fx.Proxy:
        """The program input standing for node table ``path`` (see :mod:`sarcompile.graph.tables`):
        a placeholder after the call's, so a worker passes its own rows of the table."""
        if path not in self._table_proxies:
            first = next((n for n in self.graph.nodes if n.op != "placeholder"), None)
            # (inserting_before(None) would insert at the start, before the call's inputs)
            with self.graph.inserting_before(first) if first is not None else contextlib.nullcontext():
                proxy = self.create_proxy("placeholder", "table__" + path.replace(".", "_"), (), {})
            set_info(proxy.node, input=self.tables[path], table=path)
            self._table_proxies[path] = proxy
        return self._table_proxies[path]

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
        for name in bound_originals(frame, rules):
            value = frame.get(name)
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
        if self.layouts:  # one placeholder per leaf; forward gets its dicts and typed graph back
            params = list(inspect.signature(root_fn).parameters.values())[1 if is_module else 0:]
            args, kwargs, attributes = rebuilt_arguments(params, self.layouts,
                                                         lambda name: self.create_proxy("placeholder", name, (), {}))
            view = graph_view()
            if view is not None:  # DGL code reads a graph as a DGL graph (frames, update_all)
                args, kwargs, attributes = view[0](self, (args, kwargs, attributes))
            for path, value in attributes.items():  # until the trace ends, as _swap_functions does
                owner, _, name = path.rpartition(".")
                frame = vars(self.root.get_submodule(owner))
                self._swapped.append((frame, name, frame[name]))
                frame[name] = value
            return _with_keywords(root_fn, kwargs), ([self.root] if is_module else []) + args
        fn, args = super().create_args_for_root(root_fn, is_module, concrete_args)
        view = graph_view() if self.graph_input is not None else None
        args = list(args)
        first = 1 if is_module else 0
        for i in range(first, len(args)):
            a = args[i]
            if not isinstance(a, fx.Proxy):
                continue
            if a.node.target in self.constants:
                args[i] = self.constants[a.node.target]
            elif view is not None and self.is_graph(a.node):
                args[i] = view[1](self, a.node)
        return fn, args

    def is_graph(self, node: fx.Node) -> bool:
        """Whether ``node`` is a placeholder of a graph the call gave: a graph leaf of a call
        traced leaf by leaf, else the graph argument (``graph_input``, by name or position)."""
        if node.op != "placeholder":
            return False
        if self.layouts:
            return node.target in self.graph_leaves
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        return self.graph_input in (node.target, placeholders.index(node))

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if isinstance(m, nn.Embedding) and f"{qualname}.weight" in self.tables:
            return False  # traced through, so its lookup reads the table's input
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


def _with_keywords(fn: Callable, kwargs: dict[str, Any]) -> Callable:
    """``fn`` called with ``kwargs`` too (fx calls the root with positional arguments only);
    a function, with ``fn``'s annotations, as fx reads them."""
    if not kwargs:
        return fn

    @functools.wraps(fn)
    def call(*args):
        return fn(*args, **kwargs)

    return call
