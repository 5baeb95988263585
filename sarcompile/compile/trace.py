"""Tracing a user model into a ``torch.fx`` GraphModule whose graph layers are single nodes.

Known graph layers are kept as leaves (``call_module``) so the lower pass can rewrite each
one by rule; everything else is traced through. IR ops written directly in user code
become single ``call_function`` nodes by themselves (see :func:`sarcompile.ir.ops.ir_op`).
Library functions with a function rule (:func:`sarcompile.ir.lowering.register_function_lowering`)
are replaced by their IR-op versions while tracing.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import inspect
import itertools
import operator
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.fx import _symbolic_trace
from torch import nn

from sarcompile.errors import CompileError, SarcompileError
from sarcompile.ir.lowering import function_homes, function_lowerings, graph_view, lowering_for, trace_contexts
from sarcompile.graph.hetero import TracedHetero
from sarcompile.compile.leaves import ArgLayout, rebuilt_arguments
from sarcompile.compile.model_state import refuse_state_updates, settled_trace
from sarcompile.compile.source_lines import source_line, user_file, user_frame
from sarcompile.nn import NodeDropout, RandomStream
from sarcompile.ir.probe import PROBES, ROW_COUNTS, Input, example
from sarcompile.ir.vocab import Residency
from sarcompile.runtime.comm import offline

__all__ = ["SarTracer", "ShapeTracer", "UNKNOWN", "generated_wraps_dropped", "trace"]


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
        node.meta["user_frame"] = user_frame(sys._getframe(1))
        return node

    def trace(self, root, concrete_args=None):
        try:
            for name in _FACTORIES:
                original = getattr(torch, name)
                self._swapped.append((vars(torch), name, original))
                setattr(torch, name, _sized_factory(original))
            for frame in _homes_binding_originals():
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
            raise _TorchScript(self.path_of_module(m))
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
            proxy.node.meta["input"] = self.tables[path]
            proxy.node.meta["table"] = path
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
        for name in _bound_originals(frame, rules):
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


# -- shapes are constants ---------------------------------------------------------------------
UNKNOWN = object()  # an example value that is not known: what is computed from it stays symbolic

# The shape queries whose answer becomes a Python constant while tracing (attributes, methods).
_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "device", "layout", "is_sparse", "is_cuda"})
_METHODS = frozenset({"size", "dim", "ndimension", "numel", "nelement", "is_floating_point", "is_complex",
                      "element_size"})
_COUNTS = frozenset({"size", "shape", "numel", "nelement"})  # answers that may be row counts
_KEEP = object()


class _ShapeProxy(fx.Proxy):
    """A traced value whose shape attributes (``x.shape``, ``x.ndim``) are asked of the
    tracer at once, so that they can be constants (fx would record them lazily)."""

    def __getattr__(self, k: str):
        if k in _ATTRIBUTES and isinstance(self.tracer, ShapeTracer) and self.tracer.is_tensor(self.node):
            return self.tracer.create_proxy("call_function", builtins.getattr, (self, k), {})
        return super().__getattr__(k)

    def __len__(self) -> int:
        """``len(x)``: the size of its first axis (or the number of items of a tuple, as
        ``torch.split`` gives) where it is known when compiling (not a row count)."""
        if isinstance(self.tracer, ShapeTracer):
            length = self.tracer.known_length(self.node)
            if length is not None:
                return length
        raise _LengthUnknown(f"len({self})")

    def __setitem__(self, index: Any, value: Any) -> None:
        """``h[mask] = v``, ``h[:, a:b] = v``: see :func:`assign`; while a front-end gives
        torch.fx.Proxy an assignment of its own (PyG's layer traces), that one."""
        setitem = getattr(fx.Proxy, "__setitem__", None)
        if setitem is not None:
            setitem(self, index, value)
        elif isinstance(self.tracer, ShapeTracer) and self.tracer.examples is not None:
            assign(self, index, value)
        else:
            raise TypeError("'Proxy' object does not support item assignment")


# -- assignments into part of a traced tensor ---------------------------------------------------
_VIEW_METHODS = frozenset({"view", "view_as", "reshape", "reshape_as", "transpose", "t", "permute", "unsqueeze",
                           "squeeze", "expand", "expand_as", "narrow", "select", "unbind", "split", "chunk",
                           "flatten", "unflatten", "detach", "movedim", "diagonal", "as_strided", "swapaxes"})
_VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "real"})


def _is_view(node: fx.Node) -> bool:
    """Whether ``node`` may be a view of its first input (shares its storage), so that an
    assignment into one would change the other eagerly. Indexing by a tensor copies."""
    if node.op == "call_method":
        return node.target in _VIEW_METHODS or (node.target == "__getitem__" and not _tensor_index(node.args[1]))
    if node.op == "call_function":
        if node.target is builtins.getattr:
            return node.args[1] in _VIEW_ATTRIBUTES
        if node.target is operator.getitem:
            return not _tensor_index(node.args[1])
        return getattr(node.target, "__name__", None) in _VIEW_METHODS
    return False


def _tensor_index(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, (fx.Node, torch.Tensor)) for i in items)


def assign(h: fx.Proxy, index: Any, value: Any) -> None:
    """``h[index] = value`` as eager computes it, where that is row-local: ``h`` becomes the
    new tensor (its proxy is rebound to the node computing it, as the tensor eagerly is the
    same object after the assignment). ``index`` is a boolean mask of ``h``'s leading dims
    (``h[mask] = 0``, ``h[h < 0] = 0``; the value a number, a tensor broadcasting to the
    dims after the mask's, or ``other[mask]``), lowered to ``masked_fill`` / ``torch.where``;
    or all rows and a position along one feature dim (``h[:, 0] = v``, ``h[..., a:b] = v``),
    lowered to ``torch.cat`` of the pieces. Refused (an :class:`_Assignment` saying how to
    write it) where ``h`` is an input or parameter (the caller's tensor would change), a view
    of another value or viewed by one (the view would see the change), where rows are picked
    by position, or where the value has one row per selected row."""
    tracer: ShapeTracer = h.tracer
    node = h.node
    if node.op in ("placeholder", "get_attr"):
        raise _Assignment("an assignment into part of a forward argument or a parameter, which would change the "
                          "caller's tensor (or the model's); assign into a copy (`x = x.clone()` first) or compute "
                          "the new tensor: torch.where(mask, v, x)")
    shape = _example_shape(tracer, node)
    if isinstance(index, fx.Proxy):
        new = _masked(tracer, h, shape, index, value)
    else:
        new = _columns(tracer, h, shape, index, value)
    tracer.assignments.append((node, new.node))
    h.node = new.node


def check_assignments(graph: fx.Graph, assignments: Sequence[tuple[fx.Node, fx.Node]]) -> None:
    """After the trace: refuse an assignment (``(h before, h after)``, see :func:`assign`)
    whose tensor shares its storage with another that is read after it (a view of ``h``
    taken before, or the tensor ``h`` is a view of, or another view of that), which eagerly
    sees the change and the program would not; or where ``h`` is a view of an input or a
    parameter (the caller's tensor would change)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    for before, after in assignments:
        root = before
        while _is_view(root) and isinstance(root.args[0], fx.Node):
            root = root.args[0]
        if root.op in ("placeholder", "get_attr"):
            raise _Assignment("an assignment into part of a view of a forward argument or a parameter (a slice or "
                              "reshape of it), which would change the caller's tensor (or the model's); assign into "
                              "a copy (`.clone()` first) or compute the new tensor with torch.where(mask, v, h)",
                              after)
        family, todo = set(), [root]
        while todo:
            n = todo.pop()
            if n not in family:
                family.add(n)
                todo.extend(u for u in n.users if _is_view(u))
        if any(order[u] > order[after] for n in family for u in n.users):
            raise _Assignment("an assignment into part of a tensor that shares its storage with another read after "
                              "it (a slice, view, reshape or transpose of it taken before the assignment, or the "
                              "tensor it is a view of): eagerly that one sees the change, a traced program cannot; "
                              "assign before taking views, into a copy (`.clone()`), or compute the new tensor with "
                              "torch.where(mask, v, h)", after)


_POSITION = ("an assignment into rows picked by position (`h[0] = v`, `h[:k] = v`, `h[idx] = v`): each worker holds "
             "its own rows, so positions differ between workers; assign by a boolean mask of the rows "
             "(`h[mask] = v`) or compute the new tensor with torch.where(mask, v, h)")


def _example_shape(tracer: ShapeTracer, node: fx.Node) -> torch.Size | None:
    """``node``'s shape on the first probe, if its examples are tensors of one number of dims."""
    values = tracer.value(node)
    if not values or not all(isinstance(v, torch.Tensor) for v in values) or len({v.dim() for v in values}) != 1:
        return None
    return values[0].shape


def _masked(tracer: ShapeTracer, h: fx.Proxy, shape: torch.Size | None, mask: fx.Proxy, value: Any) -> fx.Proxy:
    """``h[mask] = value`` for a boolean ``mask`` of ``h``'s leading dims."""
    masks, hs = tracer.value(mask.node), tracer.value(h.node)
    if shape is None or not masks or not all(isinstance(m, torch.Tensor) for m in masks):
        raise _Assignment("an assignment into part of a traced tensor whose shape or index is not known when "
                          "compiling; compute the new tensor instead, e.g. with torch.where(mask, v, h)")
    if any(m.dtype != torch.bool for m in masks):
        raise _Assignment(_POSITION)
    if any(m.dim() > x.dim() or m.shape != x.shape[:m.dim()] for m, x in zip(masks, hs)):
        raise _Assignment("an assignment `h[mask] = v` whose mask is not shaped as h's leading dims; give a "
                          "boolean mask of h's rows (or of h's shape), or use torch.where(mask, v, h)")
    rest = len(shape) - masks[0].dim()
    given = mask.node
    for _ in range(rest):
        mask = mask.unsqueeze(-1)
    if isinstance(value, fx.Proxy) and value.node.target is operator.getitem and value.node.args[1] is given:
        tracer.unused_reads.append(value.node)  # (h[mask] alone picks rows: gone unless used elsewhere)
        return torch.where(mask, tracer.proxy(value.node.args[0]).type_as(h), h)  # h[mask] = other[mask]
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        return h.masked_fill(mask, value)
    if isinstance(value, (fx.Proxy, torch.Tensor)):
        values = tracer.value(value.node) or () if isinstance(value, fx.Proxy) else (value,)
        dims = {v.dim() for v in values if isinstance(v, torch.Tensor)}
        if len(dims) != 1 or dims.pop() > rest:
            raise _Assignment("an assignment `h[mask] = v` whose value has one row per row selected (such as "
                              "`h[mask] = f(h[mask])`), how many differs between workers; compute it for all rows "
                              "and select: h = torch.where(mask.unsqueeze(-1), f(h), h)")
        return torch.where(mask, value.type_as(h), h)
    return h.masked_fill(mask, value)


def _columns(tracer: ShapeTracer, h: fx.Proxy, shape: torch.Size | None, index: Any, value: Any) -> fx.Proxy:
    """``h[:, a:b] = value`` (or ``h[:, k]``, ``h[..., k]``): all rows, a position along one
    feature dim, the pieces beside it kept."""
    items = list(index) if isinstance(index, tuple) else [index]
    if shape is None:
        raise _Assignment("an assignment into part of a traced tensor whose shape is not known when compiling; "
                          "compute the new tensor instead, with torch.cat of its pieces along the feature dim")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at:at + 1] = [slice(None)] * (len(shape) - len(items) + 1)
    whole = slice(None)
    picked = [d for d, i in enumerate(items) if not (isinstance(i, slice) and i == whole)]
    if not picked or picked[0] == 0 or len(picked) > 1 or len(items) > len(shape) \
            or any(isinstance(i, (fx.Proxy, torch.Tensor)) for i in items):
        raise _Assignment(_POSITION if not picked or picked[0] == 0 else
                          "an assignment into part of a traced tensor along more than one feature dim, or by a "
                          "tensor index; compute the new tensor instead, with torch.cat of its pieces along the "
                          "feature dim or torch.where")
    d, at = picked[0], items[picked[0]]
    size = shape[d]
    if isinstance(at, int):
        a = at % size if -size <= at < size else None
        if a is None:
            raise IndexError(f"index {at} is out of bounds for dimension {d} with size {size}")
        b = a + 1
    elif isinstance(at, slice) and at.step in (None, 1):
        a, b, _ = at.indices(size)
        b = max(a, b)
    else:
        raise _Assignment("an assignment into a strided slice of a traced tensor; compute the new tensor instead, "
                          "with torch.cat of its pieces along the feature dim or torch.where")

    def part(lo: int, hi: int) -> fx.Proxy:
        return h[(whole,) * d + (slice(lo, hi),)]

    piece = part(a, b)
    if isinstance(value, fx.Proxy):
        value = value.type_as(h).expand_as(h[tuple(items)] if isinstance(at, int) else piece)
        value = value.unsqueeze(d) if isinstance(at, int) else value
    else:
        value = torch.full_like(piece, value)
    return torch.cat([part(0, a), value, part(b, size)], dim=d)


class ShapeTracer(SarTracer):
    """:class:`SarTracer` that also computes values on example inputs while it traces, so
    that the code traced may branch on shapes known when compiling: ``dim()``, ``ndim``,
    ``dtype`` and the sizes of feature axes (``if x.size(-1) < k``, ``len(x.size())``) are
    Python constants. Branches on values stay refused (a tensor is never a constant).

    ``examples``: one list per probe (:data:`sarcompile.ir.probe.PROBES`), with a value per
    placeholder in order (:data:`UNKNOWN` where none is known); None traces as
    :class:`SarTracer` does. A size is a constant only if it is the same on every probe,
    is not one of the probes' row counts and is not the first axis of a value computed
    from the inputs: a row count differs between workers, so it stays symbolic
    (``x.size(0)``, the first entry of ``x.shape``). Where computing an example fails,
    what depends on it stays symbolic. A value is computed when it is asked for: by a shape
    query, a reshape's ``-1``, or as an argument of a layer left as a leaf (which the lower
    pass traces on it), at the end of the trace; with ``every_value``, every one. Most of a
    layer's body is never asked for (a compile took 7-12% less). ``values`` holds those
    computed (one per probe), also kept as ``node.meta["example"]``; buffers, the RNG and
    gradients are as before."""

    def __init__(self, examples: Sequence[Sequence[Any]] | None, graph_input: int | str | None = None,
                 layouts: tuple[ArgLayout, ...] = (), tables: Mapping[str, Input] | None = None,
                 device: torch.device = torch.device("cpu"), every_value: bool = False,
                 constants: Mapping[str, Any] | None = None, graph_leaves: frozenset[str] = frozenset()):
        super().__init__(graph_input, layouts, tables, constants, graph_leaves)
        self.device = device  # where the examples live
        self.examples = None if examples is None else [list(e) for e in examples]
        self.values: dict[fx.Node, tuple] = {}
        self.derived: set[fx.Node] = set()  # nodes computed from the inputs
        self.every_value = every_value
        self._pending: dict[fx.Node, tuple[int, Any, Any]] = {}  # value not computed yet: (order, kind, target)
        self._order = itertools.count()
        self._placeholders = 0
        self._computing = False  # while a value is computed, modules and attributes are the real ones
        self.unused_reads: list[fx.Node] = []  # dropped after the trace where nothing uses them (see assign)
        self.assignments: list[tuple[fx.Node, fx.Node]] = []  # checked after the trace (see assign)

    def trace(self, root, concrete_args=None):
        module = root if isinstance(root, nn.Module) else None
        saved = {} if module is None else {k: v.clone() for k, v in module.named_buffers()}
        try:
            graph = super().trace(root, concrete_args)
            for node in reversed(self.unused_reads):
                if not node.users:
                    graph.erase_node(node)
            check_assignments(graph, self.assignments)
            return graph
        finally:  # in-place updates the examples made (running statistics, step counters)
            with torch.no_grad():
                for k, v in module.named_buffers() if module is not None else ():
                    if k in saved:
                        v.copy_(saved[k])

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _ShapeProxy(node, self)

    def create_node(self, kind, target, args, kwargs, *rest, **more) -> fx.Node:
        if kind == "output" and self.examples is not None:
            self._output()
        return super().create_node(kind, target, args, kwargs, *rest, **more)

    def is_tensor(self, node: fx.Node) -> bool:
        return all(isinstance(v, torch.Tensor) for v in self.value(node) or (None,))

    def known_length(self, node: fx.Node) -> int | None:
        """How many items iterating ``node`` gives (its first axis, or a tuple's items),
        where that is known when compiling; else None. A value computed from parameters
        and buffers only has its real shape; one computed from the inputs has a known
        length only where it is the same on every probe and is not a row count (a loop
        over a per-node value's rows is not row-local)."""
        values = self.value(node)
        if not values:
            return None
        lengths = set()
        for v in values:
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                lengths.add(v.size(0))
            elif isinstance(v, (tuple, list)):
                lengths.add(len(v))
            else:
                return None
        if len(lengths) != 1:
            return None
        (length,) = lengths
        return length if node not in self.derived or length not in ROW_COUNTS else None

    def iter(self, obj: fx.Proxy):
        """``for w in weight``, ``enumerate(torch.split(weight, 1))``: one item per index
        where the length is known (:meth:`known_length`), as fx unpacks ``a, b = x``."""
        length = self.known_length(obj.node) if self.examples is not None else None
        if length is None:
            return super().iter(obj)
        return iter([obj[i] for i in range(length)])

    def create_proxy(self, kind, target, args, kwargs, *rest, **more):
        if kind == "call_method" and target in ("view", "reshape"):
            args = self._explicit_sizes(args)
        proxy = super().create_proxy(kind, target, args, kwargs, *rest, **more)
        if self.examples is None or kind == "output" or not isinstance(proxy, fx.Proxy):
            return proxy
        node = proxy.node
        if kind == "placeholder" or any(n in self.derived for n in _row_sources(node)):
            self.derived.add(node)
        self._pending[node] = (next(self._order), kind, target)
        if kind != "placeholder" and not _shape_query(kind, target, node):
            # Computed when asked for (a shape query, a layer's arguments, see _output):
            # most values of a layer's body are never asked for.
            return proxy
        values = self.value(node)
        if values is None:
            return proxy
        constant = self._constant(kind, target, node, values)
        if constant is _KEEP:
            return proxy
        self.graph.erase_node(node)
        return constant

    def _explicit_sizes(self, args: tuple) -> tuple:
        """``x.view(..., -1, ...)`` of a value with rows, with the -1 spelled out: as
        ``x.size(0)`` where it stands for the rows (first, with the other sizes covering
        ``x``'s other axes), as the number it is on every example elsewhere. The same, but
        also on a worker holding no rows of ``x``'s kind, where torch cannot tell what -1
        stands for (DGL's layers reshape this way)."""
        x, sizes = args[0], args[1:]
        if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
            sizes = tuple(sizes[0])
        at = [i for i, d in enumerate(sizes) if isinstance(d, int) and d == -1]
        examples = self.value(x.node) if isinstance(x, fx.Proxy) and x.node in self.derived else None
        if len(at) != 1 or not examples or not all(isinstance(v, torch.Tensor) and v.numel() for v in examples):
            return args
        known = [[d if isinstance(d, int) else (self.value(getattr(d, "node", None)) or (None,) * len(examples))[p]
                  for d in sizes] for p in range(len(examples))]
        if any(not isinstance(d, int) for sizes_p in known for d in sizes_p):
            return args
        try:
            shapes = [v.reshape(*sizes_p).shape for v, sizes_p in zip(examples, known)]
        except RuntimeError:
            return args
        i = at[0]
        if i == 0 and all(s[0] == v.shape[0] for s, v in zip(shapes, examples)):
            explicit = self.create_proxy("call_method", "size", (x, 0), {})
        elif i > 0 and len({s[i] for s in shapes}) == 1:
            explicit = shapes[0][i]
        else:
            return args
        return (x, *sizes[:i], explicit, *sizes[i + 1:])

    # -- example values ----------------------------------------------------------------------
    def getattr(self, attr, attr_val, parameter_proxy_cache):
        return attr_val if self._computing else super().getattr(attr, attr_val, parameter_proxy_cache)

    def call_module(self, m, forward, args, kwargs):
        return forward(*args, **kwargs) if self._computing else super().call_module(m, forward, args, kwargs)

    def value(self, node: fx.Node | None) -> tuple | None:
        """``node``'s example values (one per probe), computed now if they were put off
        (with what they are computed from, in the order traced), or None where not known."""
        if node is None or node in self.values or node not in self._pending:
            return self.values.get(node)
        todo, stack = set(), [node]
        while stack:
            n = stack.pop()
            if n in self._pending and n not in todo:
                todo.add(n)
                stack.extend(n.all_input_nodes)
        for n in sorted(todo, key=lambda n: self._pending[n][0]):  # inputs before their users
            _, kind, target = self._pending.pop(n)
            values = self._compute(kind, target, n)
            if values is not None:
                self.values[n] = values
                n.meta["example"] = values
        return self.values.get(node)

    def _output(self) -> None:
        """At the end of the trace (still inside it, with its functions swapped): the values
        the lower pass reads (the arguments of layers left as leaves), or every value."""
        for node in list(self._pending) if self.every_value else [
                a for n in self.graph.nodes if n.op == "call_module" for a in n.all_input_nodes]:
            self.value(node)

    def _compute(self, kind, target, node) -> tuple | None:
        """``node``'s value on every probe, or None where one is not known."""
        if kind == "placeholder" and str(target).startswith("table__"):  # a node table: rows of its type
            path = next(p for p in self.tables if "table__" + p.replace(".", "_") == target)
            return tuple(example(self.tables[path], probe, self.device) for probe in PROBES)
        if kind == "placeholder":
            i, self._placeholders = self._placeholders, self._placeholders + 1
            values = tuple(e[i] if i < len(e) else UNKNOWN for e in self.examples)
            return None if any(v is UNKNOWN for v in values) else values
        self._computing = True
        try:
            if kind == "get_attr":
                return (self._attribute(node.target),) * len(self.examples)
            for n in node.all_input_nodes:  # fx adds tensor constants and modules as get_attr nodes itself
                if n not in self.values and n.op == "get_attr":
                    self.values[n] = (self._attribute(n.target),) * len(self.examples)
            if any(n not in self.values for n in node.all_input_nodes):
                return None
            with torch.no_grad(), torch.random.fork_rng(devices=[]), offline():
                return tuple(self._run(kind, target, node, p) for p in range(len(self.examples)))
        except Exception:  # noqa: BLE001 - no example here: what depends on it stays symbolic
            return None
        finally:
            self._computing = False

    def _run(self, kind, target, node, probe: int) -> Any:
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: self.values[n][probe])
        if kind == "call_module":
            module = self.root.get_submodule(target)
            module = lowering_for(module) or module  # a layer with a rule runs as it will: on a graph
            saved = [(b, b.clone()) for b in module.buffers()]
            try:
                return module(*args, **kwargs)
            finally:
                for b, v in saved:
                    b.copy_(v)
        if kind == "call_method":
            return getattr(args[0], target)(*args[1:], **kwargs)
        return target(*args, **kwargs)

    def _attribute(self, path: str) -> Any:
        value = self.root
        for part in path.split("."):
            value = getattr(value, part)
        return value

    # -- constants -------------------------------------------------------------------------
    def _constant(self, kind, target, node, values: tuple) -> Any:
        """The answer of a shape query (``x.dim()``, ``x.size(-1)``, ``x.shape``) as a
        constant, or ``_KEEP`` to keep it symbolic."""
        if kind == "call_method" and target in _METHODS:
            query = target
        elif kind == "call_function" and target is builtins.getattr and node.args[1] in _ATTRIBUTES:
            query = node.args[1]
        else:
            return _KEEP
        base = node.args[0]
        if not isinstance(base, fx.Node) or not self.is_tensor(base):
            return _KEEP
        if isinstance(values[0], torch.Size):  # x.size() / x.shape: each size on its own
            sizes = tuple(self.create_proxy("call_method", "size", (self.proxy(base), d), {})
                          for d in range(len(values[0])))
            return torch.Size(sizes) if all(isinstance(s, int) for s in sizes) else sizes
        if any(v != values[0] for v in values[1:]):
            return _KEEP
        if query in _COUNTS:
            if not isinstance(values[0], int) or values[0] in ROW_COUNTS:
                return _KEEP
            if query == "size" and base in self.derived:
                dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
                ndim = self.values[base][0].dim()
                if not isinstance(dim, int) or dim % max(ndim, 1) == 0:
                    return _KEEP
            elif query != "size" and base in self.derived and self.values[base][0].dim() > 0:
                return _KEEP  # numel of a value with rows
        return values[0]


def _shape_query(kind, target, node: fx.Node) -> bool:
    """Whether the node asks a shape (``x.size(1)``, ``x.ndim``): its answer may be a constant."""
    return (kind == "call_method" and target in _METHODS) or (
        kind == "call_function" and target is builtins.getattr and len(node.args) > 1 and node.args[1] in _ATTRIBUTES)


def _row_sources(node: fx.Node) -> list[fx.Node]:
    """The inputs of ``node`` its rows may come from: all, except the tensor that only gives
    a dtype and a device (``x.to(other)``, ``other.new_zeros(3, 1)``)."""
    if node.op == "call_method" and node.target in ("to", "type_as"):
        return [a for a in node.args[:1] if isinstance(a, fx.Node)]
    if node.op == "call_method" and str(node.target).startswith("new_"):
        found: list[fx.Node] = []
        fx.node.map_arg((node.args[1:], node.kwargs), found.append)
        return found
    return node.all_input_nodes


def examples_for(names: Sequence[str], inputs: Mapping[str, Input], device: torch.device) -> list[list[Any]]:
    """Per probe, an example value for each of the program's inputs ``names`` (:data:`UNKNOWN`
    where ``inputs`` says nothing)."""
    return [[example(inputs[n], probe, device) if n in inputs else UNKNOWN for n in names] for probe in PROBES]
# torch 2.2's functions taking sizes take no traced size (torch.ones(g.num_edges(), 1) and
# torch.reshape(x, x.shape + (1,)) raise a TypeError); while tracing, a call given a traced
# value is recorded as a node, as newer torch records it.
_FACTORIES = ("ones", "zeros", "full", "empty", "rand", "randn", "reshape", "arange")


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
    model: nn.Module,
    graph_input: int | str | None = None,
    constants: Mapping[str, Any] | None = None,
    inputs: Mapping[str, Input] | None = None,
    layouts: tuple[ArgLayout, ...] = (),
    tables: Mapping[str, Input] | None = None,
    module_class: type[fx.GraphModule] = fx.GraphModule,
) -> fx.GraphModule:
    """Symbolically trace ``model``; failures become a :class:`CompileError` that says why,
    naming the layer being traced and the user's line that failed. ``graph_input``: see
    :class:`SarTracer`; ``constants``: forward's plain Python arguments (by name), traced
    as these values (see :class:`SarTracer`); ``inputs``: what is known of each input of the call (by name), from
    which the tracer computes example values, so shapes are constants (see
    :class:`ShapeTracer`); ``layouts``: for a call with dicts or a typed graph, how its
    arguments become the program's inputs (:mod:`sarcompile.compile.leaves`), which ``inputs``
    then name; ``tables``: the node tables among the model's parameters (by name, see
    :mod:`sarcompile.graph.tables`), each traced as an input after the call's; ``module_class``:
    the GraphModule class to return (the compiler's defers code generation)."""
    root = lowering_for(model)  # a model that is one layer: trace what it lowers to
    root = _with_own_forward(model if root is None else root)
    names = inspect.signature(root.forward).parameters
    constants = {name: v for name, v in (constants or {}).items() if name in names}
    examples = None
    tensor = next(iter(model.parameters()), None)
    device = tensor.device if tensor is not None else torch.device("cpu")
    if inputs:
        names = [leaf for layout in layouts for leaf in layout.leaf_names()] if layouts else list(names)
        examples = examples_for(names, inputs, device)
    name = type(model).__name__

    def once(tracer: ShapeTracer) -> fx.GraphModule:
        try:
            graph = tracer.trace(root)  # (it sets tracer.root)
            return module_class(tracer.root, graph, name)
        except SarcompileError:
            raise
        except Exception as e:  # TraceError, or the model's own error: say where, why and what to do
            raise CompileError(f"cannot trace {name}{_where(tracer, e)}: {_failure(e)}") from None
        finally:  # the GraphModule holds the helper modules now; the user's model must not
            for helper in tracer.helpers:
                delattr(tracer.root, helper)

    graphs = frozenset(n for n, spec in (inputs or {}).items() if spec.residency is Residency.GRAPH and spec.of is None)
    gm = settled_trace(model, name, lambda: ShapeTracer(examples, graph_input, layouts, tables, device,
                                                        constants=constants, graph_leaves=graphs), once)
    refuse_state_updates(gm.graph, name)
    return gm


_CONTROL_FLOW = ("sarcompile traces forward() once with symbolic tensors, so Python control flow may not depend on "
                 "tensor values or row counts (feature sizes, dim() and the plain Python arguments of the call are "
                 "known when compiling); move such logic into a submodule that stays a leaf or make it static.")


class _LengthUnknown(Exception):
    """``len()`` of a traced tensor whose first axis is not known when compiling."""


class _Assignment(Exception):
    """An assignment into part of a traced tensor that is not row-local (the message says why
    and how to write it); ``node``: one traced from its line, where the traceback has none."""

    def __init__(self, message: str, node: fx.Node | None = None):
        super().__init__(message)
        self.node = node


class _TorchScript(Exception):
    """A TorchScript module called while tracing (its path is the message)."""


def _failure(e: Exception) -> str:
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
    if isinstance(e, _Assignment):
        return text
    if isinstance(e, TypeError) and "does not support item assignment" in text:
        return ("an assignment into part of a traced tensor (`h[:, 0] = v`), which torch.fx cannot record; compute "
                "the new tensor instead, e.g. with torch.where(mask, v, h), torch.cat of its pieces along the feature "
                "dim, or h * keep")
    if isinstance(e, _TorchScript):
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
    if isinstance(e, _LengthUnknown) or (isinstance(e, RuntimeError) and "'len' is not supported" in text):
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


def _where(tracer: fx.Tracer, error: BaseException) -> str:
    """`` in layer 'conv2' (MyConv), at file.py:12: `if x.sum() > 0:` `` -- the module fx was
    inside and the innermost line of user code in the traceback."""
    stack = list(getattr(tracer, "module_stack", {}).values())  # (path, type) per module entered
    layer = ""
    if stack and stack[-1][0]:
        path, kind = stack[-1]
        layer = f" in layer {path!r} ({getattr(kind, '__name__', kind)})"
    if isinstance(error, _Assignment) and error.node is not None:
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


def _bound_originals(frame: dict, rules: dict[int, tuple[Callable, Callable]]) -> list[str]:
    """The names in ``frame`` bound to a function with a rule, to check and swap."""
    kept = _BOUND.get(id(frame))
    if kept is not None and kept[0] is frame and kept[1] == len(frame) and kept[2] == len(rules):
        return kept[3]
    names = [name for name, value in list(frame.items()) if id(value) in rules]
    if _module_globals(frame):
        _BOUND[id(frame)] = (frame, len(frame), len(rules), names)
    return names


_HOMES_BINDING: dict[str, Any] = {}


def _homes_binding_originals() -> list[dict]:
    """The globals of the home modules (:func:`function_homes`) that bind a function with a
    rule: every trace swaps those, and a few of some 600 modules do. Kept while the homes,
    the rules and the homes' sizes stay the same (as :func:`_bound_originals` keeps one
    module's names)."""
    homes, rules, kept = function_homes(), function_lowerings(), _HOMES_BINDING
    if kept.get("homes") is not homes:  # (function_homes gives a new list when they change)
        kept.update(homes=homes, frames=[vars(m) for m in homes], sizes=None)
    sizes = (len(rules), sum(map(len, kept["frames"])))
    if kept["sizes"] != sizes:
        kept.update(sizes=sizes, binding=[f for f in kept["frames"] if _bound_originals(f, rules)])
    return kept["binding"]
