"""Tracing a user model into a ``torch.fx`` GraphModule whose graph layers are single nodes: :func:`trace`.

:func:`trace` runs a :class:`ShapeTracer`: the layers-as-leaves tracer
(:class:`~sarcompile.compile.sar_tracer.SarTracer`) that also computes values on example
inputs, so that shapes known when compiling are Python constants while row counts stay
symbolic. What a failed trace reports is :mod:`sarcompile.compile.trace_errors`'s;
assignments into part of a traced tensor are :mod:`sarcompile.compile.assignments`'.
"""

from __future__ import annotations

import builtins
import inspect
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from sarcompile.errors import CompileError, SarcompileError
from sarcompile.ir.lowering import lowering_for
from sarcompile.compile.assignments import assign, check_assignments
from sarcompile.compile.leaves import ArgLayout
from sarcompile.compile.model_state import refuse_state_updates, settled_trace
from sarcompile.compile.sar_tracer import SarTracer
from sarcompile.compile.trace_errors import LengthUnknown, failure, where
from sarcompile.ir.node_info import set_info
from sarcompile.ir.probe import PROBES, ROW_COUNTS, Input, example
from sarcompile.ir.vocab import Residency
from sarcompile.dist.collectives import offline

__all__ = ["ShapeTracer", "UNKNOWN", "trace"]


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
        raise LengthUnknown(f"len({self})")

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
    computed (one per probe), also kept as ``info(node).example``; buffers, the RNG and
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
                set_info(n, example=values)
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
            raise CompileError(f"cannot trace {name}{where(tracer, e)}: {failure(e)}") from None
        finally:  # the GraphModule holds the helper modules now; the user's model must not
            for helper in tracer.helpers:
                delattr(tracer.root, helper)

    graphs = frozenset(n for n, spec in (inputs or {}).items() if spec.residency is Residency.GRAPH and spec.of is None)
    gm = settled_trace(model, name, lambda: ShapeTracer(examples, graph_input, layouts, tables, device,
                                                        constants=constants, graph_leaves=graphs), once)
    refuse_state_updates(gm.graph, name)
    return gm
