"""The traced graph's ``edge_index`` and the rule machinery over it, for any front-end.

While a model or layer is traced, the graph it takes as ``edge_index`` is an
:class:`EdgeIndex` proxy: ``edge_index[0]`` and ``edge_index[1]`` (also ``src, dst =
edge_index``) are :class:`EdgeEnd` markers, the source or destination node of every edge.
A marker only means something where a rule gives it a meaning: plain torch's indexing and
scatter functions given one (:func:`tensor_rule`, the rules in :mod:`.plain`), and a
library's own graph utilities (PyG's, :mod:`.pyg.utils`). Any other use of it (arithmetic,
``index.max()``) is refused at compile time, since on a worker the edges index rows that
live elsewhere. In a model's own forward (:func:`in_forward`, entered around every trace)
the graph argument indexed or unpacked gives the markers too.

Nothing here imports a GNN library: plain-torch message passing compiles in a program that
has none.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import torch
import torch.fx

from sarcompile.errors import CompileError
from sarcompile.ir.lowering import declare, register_trace_context
from sarcompile.ir.ops import edge_subset, gather_dst, gather_src
from sarcompile.ir.vocab import Residency
from sarcompile.compile.source_lines import where_line

__all__ = ["EdgeEnd", "EdgeIndex", "LoopMask", "tensor_rule", "in_forward", "gather", "as_edge_index"]


@dataclass(frozen=True, eq=False)
class EdgeEnd:
    """``edge_index[0]`` (``end="src"``) or ``edge_index[1]`` (``end="dst"``) of the
    traced graph ``graph``: the source or destination of every edge, in the graph's edge
    order. ``graph`` is the traced graph, or a real one while the layer runs on example
    inputs (the rules then run the IR ops eagerly). ``column``: viewed as one column
    (``index.unsqueeze(-1)``, ``index.view(-1, 1)``); ``like``: a column expanded as the
    tensor ``like`` (``expand_as``) or to the sizes ``like`` (``expand``), as
    ``scatter_add_`` takes its index."""

    graph: Any
    end: str
    column: bool = False
    like: Any = None

    def refusal(self) -> CompileError:
        name = "edge_index[0] (the source of every edge)" if self.end == "src" else "edge_index[1] (the destination)"
        return CompileError(
            f"{name} is used as a tensor{where_line()}; on N workers a worker holds only its own nodes' rows, so "
            "indexing or computing with edge_index directly would not match one machine. sarcompile lowers "
            "x[edge_index[i]] and x.index_select(0, edge_index[i]), aggregation into a tensor with one row per node "
            "(index_add_, scatter_add_, scatter_reduce, index_reduce over dim 0), torch.ones_like(edge_index[i]), "
            "edge_index[0] == edge_index[1], and with PyG its scatter/softmax/degree over it, gcn_norm, "
            "get_laplacian and the self-loop utilities; write the rest with those, message arguments (x_j, x_i, "
            "index) or sarcompile's ops"
        )

    def _loops(self, other: Any, loops: bool) -> "LoopMask":
        if not (isinstance(other, EdgeEnd) and _same_graph(other.graph, self.graph) and other.end != self.end
                and not (self.column or other.column)):
            raise self.refusal()
        return LoopMask.of(self.graph, loops)

    def __eq__(self, other: Any) -> "LoopMask":  # type: ignore[override]
        return self._loops(other, True)

    def __ne__(self, other: Any) -> "LoopMask":  # type: ignore[override]
        return self._loops(other, False)

    __hash__ = object.__hash__

    def __fx_create_arg__(self, tracer: torch.fx.Tracer) -> Any:
        raise self.refusal()  # fx asks this when the marker reaches a traced op

    def __getattr__(self, name: str) -> Any:  # index.max(), index.tolist(), ...
        if name.startswith("__"):
            raise AttributeError(name)
        raise self.refusal()

    def _refused(self, *_args: Any, **_kwargs: Any) -> Any:
        raise self.refusal()

    # index + 1, index * 2, index < n, ...: an edge's node id is not the same on every worker
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refused
    __floordiv__ = __mod__ = __lt__ = __le__ = __gt__ = __ge__ = __neg__ = __and__ = __or__ = _refused

    # -- views of the marker that the rules take (the index of scatter_add_) -----------------
    def unsqueeze(self, dim: int) -> "EdgeEnd":
        if self.column or dim not in (1, -1):
            raise self.refusal()
        return replace(self, column=True)

    def view(self, *shape: Any) -> "EdgeEnd":
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if shape == (-1,) and not self.column:
            return self
        if shape == (-1, 1) and not self.column:
            return replace(self, column=True)
        raise self.refusal()

    reshape = view

    def expand_as(self, other: Any) -> "EdgeEnd":
        if not self.column or self.like is not None:
            raise self.refusal()
        return replace(self, like=other)

    def expand(self, *sizes: Any) -> "EdgeEnd":
        sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
        if not self.column or self.like is not None:
            raise self.refusal()
        return replace(self, like=sizes)

    def to(self, *args: Any, **kwargs: Any) -> "EdgeEnd":
        """The same ids (another integer dtype, or a device); a float dtype is refused."""
        dtype = kwargs.get("dtype", next((a for a in args if isinstance(a, torch.dtype)), None))
        if dtype is not None and (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool):
            raise self.refusal()
        return self

    def long(self) -> "EdgeEnd":
        return self

    @classmethod
    def __torch_function__(cls, fn: Callable, types: tuple, args: tuple = (), kwargs: dict | None = None) -> Any:
        """``torch.ones_like(index)``, ``torch.index_add(x, 0, index, m)``, ...: the rule of
        :func:`tensor_rule`, else refused."""
        return _tensor_call(fn, args, kwargs or {})


def _same_graph(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` stand for the same traced graph (the same fx node: a model's
    forward wraps its graph argument anew each time it is indexed)."""
    return a is b or (isinstance(a, torch.fx.Proxy) and isinstance(b, torch.fx.Proxy) and a.node is b.node)


class EdgeIndex(torch.fx.Proxy):
    """The traced graph where a layer or model takes ``edge_index``: an fx Proxy (IR ops
    take it as their graph) that also answers what library code asks an ``edge_index`` tensor.
    ``loops`` says what is known of its self-loops at trace time: ``"one"`` per node (in
    node order, as PyG appends them), ``"none"``, or ``"any"``."""

    loops = "any"
    layout = torch.strided  # an edge list, not a torch sparse matrix (PyG's is_torch_sparse_tensor asks)

    def __getitem__(self, i: Any) -> "EdgeEnd | EdgeIndex":
        if isinstance(i, int) and i in (0, 1, -1, -2):
            return EdgeEnd(self, "src" if i % 2 == 0 else "dst")
        if isinstance(i, tuple) and len(i) == 2 and isinstance(i[0], slice) and i[0] == slice(None) \
                and isinstance(i[1], torch.fx.Proxy):
            return as_edge_index(edge_subset(self, i[1]))  # edge_index[:, mask]: the edges of a mask
        raise CompileError(
            f"edge_index[{i!r}] is not supported: sarcompile lowers edge_index[0] and edge_index[1] (source and "
            "destination) as index arguments (x[edge_index[0]], index_add_, scatter_reduce, a library's graph "
            "utilities), and edge_index[:, mask] (a bool per edge)"
        )

    def __iter__(self) -> Iterator[EdgeEnd]:
        return iter((self[0], self[1]))

    def dim(self) -> int:
        return 2

    def derive(self, method: str, loops: str, *args: Any) -> "EdgeIndex":
        """The graph ``g.<method>(*args)`` (``with_self_loops``, ...), whose loops are ``loops``."""
        derived = EdgeIndex(self.tracer.create_proxy("call_method", method, (self, *args), {}).node, self.tracer)
        derived.loops = loops
        return derived


def as_edge_index(value: Any) -> Any:
    """``value`` as an :class:`EdgeIndex` where it is the traced graph (an fx Proxy)."""
    if isinstance(value, torch.fx.Proxy) and not isinstance(value, EdgeIndex):
        return EdgeIndex(value.node, value.tracer)
    return value


class LoopMask(torch.fx.Proxy):
    """``edge_index[0] == edge_index[1]`` (``loops``) or ``!=``: a per-edge bool tensor of
    ``graph``. Indexing a per-edge tensor with it gives :class:`_LoopRows`, which may only
    be updated in place (``e[mask] -= 1``, ``e[mask] += deg_inv``)."""

    graph: EdgeIndex
    loops: bool

    @classmethod
    def of(cls, graph: EdgeIndex, loops: bool) -> "LoopMask":
        mask = cls(_loop_mask(graph, loops).node, graph.tracer)
        mask.graph, mask.loops = graph, loops
        return mask



@dataclass(frozen=True, eq=False)
class _LoopRows:
    """``e[mask]`` for a :class:`LoopMask`, with at most one pending arithmetic ``op``
    (``e[mask] -= 1`` is ``e[mask] = e[mask] - 1``): written back by ``e[mask] = ...``."""

    e: torch.fx.Proxy
    mask: LoopMask
    op: str | None = None
    value: Any = None

    def refusal(self) -> CompileError:
        return CompileError(
            "e[edge_index[0] == edge_index[1]] (the rows of a per-edge tensor on the self-loops) is supported only "
            "as an in-place update (e[mask] -= 1, e[mask] += per_node_values, e[mask] = value): on N workers its "
            "rows are not one machine's; write torch.where(mask, ..., e) instead"
        )

    def _with(self, op: str, value: Any) -> "_LoopRows":
        if self.op is not None:
            raise self.refusal()
        return _LoopRows(self.e, self.mask, op, value)

    def __add__(self, v: Any) -> "_LoopRows":
        return self._with("add", v)

    def __sub__(self, v: Any) -> "_LoopRows":
        return self._with("sub", v)

    def __mul__(self, v: Any) -> "_LoopRows":
        return self._with("mul", v)

    def __truediv__(self, v: Any) -> "_LoopRows":
        return self._with("div", v)

    def __fx_create_arg__(self, tracer: torch.fx.Tracer) -> Any:
        raise self.refusal()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise self.refusal()


_TENSOR_RULES: dict[str, Callable[..., Any]] = {}  # torch function / Tensor method name -> rule (tensor_rule)


def tensor_rule(*names: str) -> Callable[[Callable], Callable]:
    """Register ``rule(name, *args, **kwargs)`` for the torch functions and Tensor methods
    ``names`` (``index_add_``, ``torch.ones_like``, ...) called with an :class:`EdgeEnd`
    among their arguments (the tensor itself first, for a method): while a model or layer
    is traced, the call gives what the rule returns. A call with no marker is torch's."""

    def register(rule: Callable) -> Callable:
        for name in names:
            _TENSOR_RULES[name] = rule
        return rule

    return register


def _has_end(args: Any) -> bool:
    """Whether an :class:`EdgeEnd` is among ``args`` (a tuple or dict, one level into lists)."""
    values = args.values() if isinstance(args, dict) else args
    return any(isinstance(a, EdgeEnd) or (isinstance(a, (tuple, list)) and _has_end(a)) for a in values)


def _tensor_call(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` with an :class:`EdgeEnd` among the arguments: its rule's answer."""
    name = getattr(fn, "__name__", None)
    rule = _TENSOR_RULES.get(name)
    if rule is None:
        end = next((a for a in (*args, *kwargs.values()) if isinstance(a, EdgeEnd)), None)
        raise (end or EdgeEnd(None, "src")).refusal()
    return rule(name, *args, **kwargs)


@classmethod
def _proxy_torch_function(cls, fn, types, args=(), kwargs=None):
    """fx's ``Proxy.__torch_function__``, except that a call given an :class:`EdgeEnd`
    (``torch.index_select(x, 0, src)``) goes to its rule (fx asks the proxy first)."""
    kwargs = kwargs or {}
    if _has_end(args) or _has_end(kwargs):
        return _tensor_call(fn, args, kwargs)
    return _proxy_torch_function_of_fx.__func__(cls, fn, types, args, kwargs)


def _proxy_method(name: str) -> Callable:
    """The Tensor method ``name`` of a proxy: its rule where an :class:`EdgeEnd` is given."""

    def method(self: torch.fx.Proxy, *args: Any, **kwargs: Any) -> Any:
        if _has_end(args) or _has_end(kwargs):
            return _TENSOR_RULES[name](name, self, *args, **kwargs)
        return self.tracer.create_proxy("call_method", name, (self, *args), kwargs)

    method.__name__ = name
    return method


_MISSING = object()


@contextlib.contextmanager
def _patched(owner: type, attributes: dict[str, Any]) -> Iterator[None]:
    """``owner``'s ``attributes`` set for the duration, each restored afterwards (so nesting works)."""
    saved = {name: vars(owner).get(name, _MISSING) for name in attributes}
    for name, value in attributes.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


@contextlib.contextmanager
def in_forward() -> Iterator[None]:
    """For the duration (any trace, see :func:`sarcompile.ir.lowering.register_trace_context`):
    the graph argument of a model's forward indexed or unpacked (``src, dst = edge_index``)
    gives :class:`EdgeEnd` markers; fx proxies (node tensors) can be indexed by one
    (``x[src]``), given one where a :func:`tensor_rule` takes it (``index_add_``,
    ``torch.index_select``). (A front-end adds its library's own rules in a context of its
    own, as :mod:`.pyg.utils` PyG's aggregation modules over a marker.)"""
    methods = {name: _proxy_method(name) for name in _TENSOR_RULES if hasattr(torch.Tensor, name)}
    with _patched(torch.fx.Proxy, {"__getitem__": _proxy_getitem, "__torch_function__": _proxy_torch_function,
                                   **methods}):
        yield


_proxy_getitem_of_fx = torch.fx.Proxy.__getitem__
_proxy_torch_function_of_fx = vars(torch.fx.Proxy)["__torch_function__"]


def gather(x: torch.fx.Proxy, end: EdgeEnd) -> torch.fx.Proxy:
    """``x[edge_index[0]]`` / ``x[edge_index[1]]``: the rows of a node tensor onto the edges."""
    if end.column:
        raise end.refusal()
    return (gather_src if end.end == "src" else gather_dst)(end.graph, x)


def _proxy_getitem(self: torch.fx.Proxy, i: Any) -> Any:
    if isinstance(i, EdgeEnd):
        return gather(self, i)
    if isinstance(i, LoopMask):
        return _LoopRows(self, i)
    graph = _graph_argument(self)  # a model's forward indexing (or unpacking) its graph argument
    if graph is not None:
        return graph[i]
    return _proxy_getitem_of_fx(self, i)


def _graph_argument(value: Any) -> EdgeIndex | None:
    """``value`` as an :class:`EdgeIndex` where it is the traced graph: inside a library's
    layer (already one), or in the model's forward a graph the call gave (the tracer's
    ``is_graph``); else None."""
    if isinstance(value, EdgeIndex):
        return value
    is_graph = getattr(getattr(value, "tracer", None), "is_graph", None)
    if isinstance(value, torch.fx.Proxy) and is_graph is not None and is_graph(value.node):
        return as_edge_index(value)
    return None


def _examples(p: Any) -> tuple | None:
    """The example values of ``p`` (one per probe) where the tracer computes them
    (:class:`sarcompile.compile.trace.ShapeTracer`), else None."""
    if not isinstance(p, torch.fx.Proxy):
        return None
    value = getattr(p.tracer, "value", None)
    values = value(p.node) if callable(value) else None
    return tuple(values) if values and all(isinstance(v, torch.Tensor) for v in values) else None


# -- run-time helpers (one node each in the program) -------------------------------------------
@torch.fx.wrap
def _edge_axis(e: torch.Tensor, dim: int, what: str) -> torch.Tensor:
    """``e``, after checking that ``dim`` is its edge axis (axis 0)."""
    if e.dim() == 0 or dim % e.dim() != 0:
        raise CompileError(
            f"{what} over dim={dim} of a per-edge tensor of shape {tuple(e.shape)} is not supported: sarcompile "
            "reduces over axis 0 (one row per edge)"
        )
    return e


@torch.fx.wrap
def _in_degree(graph: Any, dtype: torch.dtype | None) -> torch.Tensor:
    """``degree(edge_index[1], dtype=dtype)``: the in-degree of every node (all of a
    node's in-edges live on its worker)."""
    return graph.in_degrees().to(dtype or torch.get_default_dtype())


@torch.fx.wrap
def _ones_per_edge(graph: Any, dtype: torch.dtype | None, fill: Any = 1) -> torch.Tensor:
    """``torch.full((edge_index.size(1),), fill, dtype=dtype)``: a weight of 1 (or ``fill``) for every edge."""
    return torch.full((graph.num_edges,), fill, dtype=dtype or torch.get_default_dtype())


@torch.fx.wrap
def _loop_mask(graph: Any, loops: bool) -> torch.Tensor:
    """``edge_index[0] == edge_index[1]`` (``!=`` unless ``loops``), per edge."""
    return graph.loop_mask if loops else ~graph.loop_mask


for _helper, _residency in ((_edge_axis, "e"), (_in_degree, Residency.NODE), (_ones_per_edge, Residency.EDGE),
                            (_loop_mask, Residency.EDGE)):
    declare(_helper, _residency)


register_trace_context(in_forward)
