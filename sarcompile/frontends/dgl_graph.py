"""A stand-in for a ``DGLGraph`` while a model is traced, so user code that calls
``g.update_all`` / ``g.apply_edges`` becomes IR ops.

DGL user code stores tensors in the graph's frames and runs message passing on them::

    with g.local_scope():
        g.ndata["h"] = x
        g.edata["w"] = w
        g.update_all(fn.u_mul_e("h", "w", "m"), fn.sum("m", "h"))
        return g.ndata["h"]

When the compiled model is traced, the graph argument is a :class:`GraphProxy`: an fx
proxy of the graph input (so IR ops and lowered DGL layers receive the graph) with the
frames as plain dicts of traced values. ``update_all`` lowers to

* ``spmm`` for ``copy_u`` with ``sum``/``mean``/``max``;
* ``message_passing`` (per-block messages, recomputed in backward) for every other
  builtin message (``u_mul_e``, ``u_add_v``, ``copy_e``, ...) and for a user message
  function ``def message(edges): return {"m": ...}`` reading ``edges.src`` /
  ``edges.dst`` (one node field) and ``edges.data`` (at most one edge field).

``apply_edges`` with a builtin ``u_<op>_v`` / ``v_<op>_u`` lowers to ``sddmm``; any other
builtin (``u_add_e``, ``e_mul_v``, ...) and a user function ``def f(edges): return {...}``
compute on per-edge rows: ``edges.src[f]`` / ``edges.dst[f]`` are the field gathered onto
the edges (by ``sddmm``, read only when used), ``edges.data`` the edge frame.

The counts DGL code reads (``g.num_edges()``, ``g.num_nodes()``, ...) are the graph's row
counts, so ``torch.ones(g.num_edges())`` is a per-edge tensor; ``g.out_degrees()`` and
``g.device`` are answered by row-local helpers. Reduce functions must be
DGL's builtins ``sum``, ``mean`` or ``max``: a mailbox function (``nodes.mailbox``, which
DGL buckets by degree) is refused with a :class:`~sarcompile.CompileError`, as is what is
not listed here.
"""

from __future__ import annotations

import builtins
import contextlib
import operator
from typing import Any, Callable

import torch
import torch.fx as fx
from torch import nn

from ..errors import CompileError
from ..lowering import declare
from ..ops import message_passing, sddmm, spmm
from .dgl import check_in_edges, graph_device, out_degrees, reduce_edges

__all__ = ["GraphProxy"]

_SRC, _DST, _EDGE = 0, 1, 2  # dgl.function.TargetCode
_REDUCES = {"sum": "sum", "mean": "mean", "max": "max"}
_SDDMM = ("add", "sub", "mul", "dot")
_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}


class _BuiltinMessage(nn.Module):
    """A DGL builtin message ``lhs op rhs`` as ``fn(x_j, x_i, e)``."""

    def __init__(self, op: str, lhs: int, rhs: int | None):
        super().__init__()
        self.op, self.lhs, self.rhs = op, lhs, rhs

    def forward(self, x_j, x_i, e):
        side = {_SRC: x_j, _DST: x_i, _EDGE: e}
        if self.rhs is None:  # copy
            return side[self.lhs]
        return binary(self.op, side[self.lhs], side[self.rhs])


def binary(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a op b`` for two per-edge tensors as DGL's builtins broadcast them: the feature
    dims (all but the row axis) numpy-style, so ``h [E, F] * w [E]`` is ``h * w[:, None]``."""
    while a.dim() < b.dim():
        a = a.unsqueeze(1)
    while b.dim() < a.dim():
        b = b.unsqueeze(1)
    if op == "dot":
        return (a * b).sum(-1, keepdim=True)
    return _BINARY[op](a, b)


torch.fx.wrap("binary")  # one node: its loops run on the real shapes
declare(binary, "a")  # row-local: the rows of a (and b, the same rows)


class _Edges:
    """What a DGL message function receives: ``src``, ``dst`` and ``data`` by field."""

    def __init__(self, src: dict, dst: dict, data: dict):
        self.src, self.dst, self.data = src, dst, data


class _UserMessage(nn.Module):
    """A user's DGL message function as ``fn(x_j, x_i, e)``: one node field, one edge field."""

    def __init__(self, func: Callable, node_field: str | None, edge_field: str | None, out_field: str):
        super().__init__()
        self.func, self.node_field, self.edge_field, self.out_field = func, node_field, edge_field, out_field

    def forward(self, x_j, x_i, e):
        src = {} if self.node_field is None else {self.node_field: x_j}
        dst = {} if self.node_field is None else {self.node_field: x_i}
        data = {} if self.edge_field is None else {self.edge_field: e}
        return self.func(_Edges(src, dst, data))[self.out_field]


class _Gathered(dict):
    """``edges.src`` / ``edges.dst`` of an edge function: a node field, gathered onto the
    edges when first read."""

    def __init__(self, graph: "GraphProxy", end: int):
        super().__init__()
        self.graph, self.end = graph, end

    def __missing__(self, key):
        self[key] = self.graph._rows(self.end, key)
        return self[key]


def _src_rows(g, x):
    """``x[u]`` for every edge u->v (remote sources arrive through sddmm's halo exchange)."""
    return sddmm(g, x, torch.zeros_like(x), "add")  # x[u] + 0 is x[u] exactly


def _dst_rows(g, x):
    """``x[v]`` for every edge u->v."""
    return sddmm(g, torch.zeros_like(x), x, "add")


class _Reads(dict):
    """A frame that remembers which fields were read."""

    def __init__(self, values: dict, read: set):
        super().__init__(values)
        self.read = read

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


class GraphProxy(fx.Proxy):
    """The graph input of a traced DGL-style model: an fx proxy with DGL's frames."""

    def __init__(self, node: fx.Node, tracer: fx.Tracer):
        super().__init__(node, tracer)
        self._frames: list[tuple[dict, dict]] = [({}, {})]
        self._origin: GraphProxy | None = None  # after remove_self_loop(): the graph it came from

    # -- frames (a homogeneous graph: every node is a source and a destination) ----------
    @property
    def ndata(self) -> dict:
        return self._frames[-1][0]

    srcdata = dstdata = ndata

    # What DGL's layers ask of the graph before they compute (expand_as_pair, asserts):
    # known when compiling, since sarcompile graphs are whole and homogeneous.
    is_block = False
    is_homogeneous = True
    batch_size = 1

    @property
    def edata(self) -> dict:
        return self._frames[-1][1]

    # -- self-loops: sarcompile's graphs have none removed, or exactly one per node --------
    def remove_self_loop(self, etype=None) -> "GraphProxy":
        return self._derived("remove_self_loops", self, loop_free=True)

    def add_self_loop(self, edge_feat_names=None, fill_data=1.0, etype=None) -> "GraphProxy":
        """One self-loop per node, after ``remove_self_loop()`` (DGL appends them last, as
        ``with_self_loops`` does). On a graph that may have self-loops DGL adds a second one,
        which sarcompile's graphs do not express: refused."""
        if self._origin is None:
            raise CompileError(
                "g.add_self_loop() on a graph that may have self-loops gives those nodes two, which sarcompile does "
                "not compile: call g.remove_self_loop() first, or add the loops before sc.Graph.from_dgl"
            )
        return self._derived("with_self_loops", self._origin, loop_free=False)

    def _derived(self, method: str, base: "GraphProxy", loop_free: bool) -> "GraphProxy":
        if self.edata:
            raise CompileError(f"g.{method}() with edge fields set ({sorted(self.edata)}) is not supported; set "
                               "them on the graph it returns")
        node = self.tracer.create_proxy("call_method", method, (base,), {}).node
        graph = GraphProxy(node, self.tracer)
        graph._frames = [(dict(self.ndata), {})]
        graph._origin = base if loop_free else None
        return graph

    def local_var(self) -> "GraphProxy":
        """The same graph with frames of its own: writes to it are not seen here, as in DGL."""
        view = GraphProxy(self.node, self.tracer)
        view._frames = [(dict(self.ndata), dict(self.edata))]
        view._origin = self._origin
        return view

    @contextlib.contextmanager
    def local_scope(self):
        """Writes inside the block are dropped at its end, as in DGL."""
        self._frames.append((dict(self.ndata), dict(self.edata)))
        try:
            yield self
        finally:
            self._frames.pop()

    # -- sizes and degrees: row counts and per-node values --------------------------------
    def num_edges(self, etype=None):
        """This graph's edge count (a worker's own edges): a row count, so
        ``torch.ones(g.num_edges())`` has one row per edge."""
        return self.tracer.create_proxy("call_function", builtins.getattr, (self, "num_edges"), {})

    def num_nodes(self, ntype=None):
        """The node count (a worker's own nodes): a row count."""
        return self.tracer.create_proxy("call_function", builtins.getattr, (self, "num_nodes"), {})

    # a homogeneous graph: every node is a source and a destination
    number_of_edges = num_edges
    number_of_nodes = num_src_nodes = num_dst_nodes = number_of_src_nodes = number_of_dst_nodes = num_nodes

    def in_degrees(self, v=None, etype=None):
        """The in-degree of every node; ``(g.in_degrees() == 0).any()`` in an ``if`` becomes
        the check DGL's layers make with it (see :class:`_InDegrees`)."""
        if v is not None:
            raise CompileError("g.in_degrees(v) of some nodes is not supported; use g.in_degrees() of all")
        return _InDegrees(self.tracer.create_proxy("call_method", "in_degrees", (self,), {}).node, self.tracer, self)

    def out_degrees(self, u=None, etype=None):
        if u is not None:
            raise CompileError("g.out_degrees(u) of some nodes is not supported; use g.out_degrees() of all")
        return self.tracer.create_proxy("call_function", out_degrees, (self,), {})

    @property
    def device(self):
        return self.tracer.create_proxy("call_function", graph_device, (self,), {})

    # -- message passing -------------------------------------------------------------------
    def update_all(self, message_func, reduce_func, apply_node_func=None) -> None:
        msg_field, reduce = _reduce_of(reduce_func)
        if getattr(message_func, "target", None) == _SRC and type(message_func).__name__ == "CopyMessageFunction":
            out = spmm(self, self._node(message_func.in_field), reduce)
            _check_field(message_func.out_field, msg_field)
        else:
            lowered = self._message(message_func, msg_field)
            out = self._reduce_edges(message_func, msg_field, reduce) if lowered is None else message_passing(
                self, *lowered, reduce)
        if apply_node_func is not None:
            raise CompileError("update_all(..., apply_node_func) is not supported yet; apply it to g.ndata after")
        self.ndata[reduce_func.out_field] = out

    def apply_edges(self, func, edges="__ALL__", etype=None) -> None:
        """A value per edge: ``sddmm`` for ``u_<op>_v`` / ``v_<op>_u``, else computed on the
        end nodes' rows gathered onto the edges (see the module docstring)."""
        if not (isinstance(edges, str) and edges == "__ALL__"):  # dgl.base.ALL
            raise CompileError("apply_edges(func, edges) on some edges is not supported; apply it to all edges")
        kind = type(func).__name__
        ends = (getattr(func, "lhs", None), getattr(func, "rhs", None))
        if kind == "BinaryMessageFunction" and set(ends) == {_SRC, _DST} and func.binary_op in _SDDMM:
            swap = ends[0] == _DST  # v_<op>_u: b[v] op a[u]
            u, v = (func.rhs_field, func.lhs_field) if swap else (func.lhs_field, func.rhs_field)
            value = sddmm(self, self._node(u), self._node(v), func.binary_op)
            if swap and func.binary_op == "sub":
                value = -value  # b - a == -(a - b) exactly: IEEE rounding is symmetric
            self.edata[func.out_field] = value.unsqueeze(-1) if func.binary_op == "dot" else value
        elif kind in ("BinaryMessageFunction", "CopyMessageFunction"):
            binary = kind == "BinaryMessageFunction"
            ends = [(func.lhs, func.lhs_field), (func.rhs, func.rhs_field)] if binary else [(func.target, func.in_field)]
            rows = {end: self._rows(end, f) for end, f in ends}
            msg = _BuiltinMessage(func.binary_op, func.lhs, func.rhs) if binary else _BuiltinMessage("copy", func.target, None)
            self.edata[func.out_field] = msg(rows.get(_SRC), rows.get(_DST), rows.get(_EDGE))
        elif callable(func) and not hasattr(func, "out_field"):
            out = func(_Edges(_Gathered(self, _SRC), _Gathered(self, _DST), self.edata))
            if not isinstance(out, dict):
                raise CompileError(f"the edge function {_describe(func)} must return a dict of edge fields")
            self.edata.update(out)
        else:
            raise CompileError(f"apply_edges({_describe(func)}) is not supported yet")

    # -- helpers ---------------------------------------------------------------------------
    def _node(self, field: str):
        if field not in self.ndata:
            raise CompileError(f"g.ndata has no field {field!r} here (it has {sorted(self.ndata)})")
        return self.ndata[field]

    def _edge(self, field: str):
        if field not in self.edata:
            raise CompileError(f"g.edata has no field {field!r} here (it has {sorted(self.edata)})")
        return self.edata[field]

    def _rows(self, end: int, field: str):
        """A field as one row per edge: the source's or destination's row, or the edge's."""
        if end == _EDGE:
            return self._edge(field)
        return (_src_rows if end == _SRC else _dst_rows)(self, self._node(field))

    def _message(self, func, msg_field: str) -> tuple[nn.Module, Any, Any] | None:
        """(message module, node tensor, edge tensor or None) for ``message_passing``; None
        for a user function reading more than one node or edge field."""
        kind = type(func).__name__
        if kind == "CopyMessageFunction":  # copy_e (copy_u took the spmm path)
            _check_field(func.out_field, msg_field)
            if func.target != _EDGE:
                raise CompileError(f"{_describe(func)} is not supported yet; use copy_u or copy_e")
            fn = _BuiltinMessage("copy", _EDGE, None)
            return self._register(fn), self._any_node(), self._edge(func.in_field)
        if kind == "BinaryMessageFunction":
            _check_field(func.out_field, msg_field)
            fields = {side: f for side, f in ((func.lhs, func.lhs_field), (func.rhs, func.rhs_field))}
            nodes = {f for side, f in fields.items() if side in (_SRC, _DST)}
            if len(nodes) > 1 or func.binary_op not in (*_BINARY, "dot"):
                raise CompileError(
                    f"{_describe(func)} is not supported yet: sarcompile lowers builtin messages that read one node "
                    "field (u and/or v) and at most one edge field"
                )
            x = self._node(nodes.pop()) if nodes else self._any_node()
            e = self._edge(fields[_EDGE]) if _EDGE in fields else None
            return self._register(_BuiltinMessage(func.binary_op, func.lhs, func.rhs)), x, e
        if callable(func) and not hasattr(func, "out_field"):
            return self._user_message(func, msg_field)
        raise CompileError(f"message function {_describe(func)} is not supported yet")

    def _user_message(self, func: Callable, msg_field: str) -> tuple[nn.Module, Any, Any] | None:
        """Find which fields a user message function reads by running it once on the whole
        frames (the nodes it adds to the traced graph are removed again)."""
        node_reads, edge_reads = set(), set()
        graph = self.tracer.graph
        before = set(graph.nodes)
        edges = _Edges(_Reads(self.ndata, node_reads), _Reads(self.ndata, node_reads), _Reads(self.edata, edge_reads))
        try:
            out = func(edges)
        except CompileError:
            raise
        except Exception as e:
            raise CompileError(
                f"the message function {getattr(func, '__name__', func)!r} failed when traced ({type(e).__name__}: "
                f"{e}); sarcompile supports message functions that compute with edges.src / edges.dst / "
                "edges.data tensors"
            ) from None
        added = [n for n in graph.nodes if n not in before]
        for node in reversed(added):
            graph.erase_node(node)
        if not isinstance(out, dict) or msg_field not in out:
            raise CompileError(f"the message function must return a dict with the field {msg_field!r} the reduce reads")
        # Several fields, or the layer's own modules and parameters (RelGraphConv's linear_r, which a
        # separate message module could not reach nor lower): computed on the edges (_reduce_edges).
        if len(node_reads) > 1 or len(edge_reads) > 1 or any(n.op in ("call_module", "get_attr") for n in added):
            return None
        node_field = next(iter(node_reads), None)
        edge_field = next(iter(edge_reads), None)
        fn = self._register(_UserMessage(func, node_field, edge_field, msg_field))
        x = self._node(node_field) if node_field else self._any_node()
        return fn, x, (self._edge(edge_field) if edge_field else None)

    def _reduce_edges(self, func: Callable, msg_field: str, reduce: str):
        """A message function reading several node or edge fields: its messages computed on
        per-edge rows (``E x F``, where message_passing keeps one block at a time), then
        reduced into their destinations."""
        if reduce == "max":
            raise CompileError(
                "update_all(message, dgl.function.max) with a message function reading several node or edge "
                "fields is not supported yet: use sum or mean, or put what it reads in one node and one edge tensor"
            )
        out = func(_Edges(_Gathered(self, _SRC), _Gathered(self, _DST), self.edata))
        if not isinstance(out, dict) or msg_field not in out:
            raise CompileError(f"the message function must return a dict with the field {msg_field!r} the reduce reads")
        return self.tracer.create_proxy("call_function", reduce_edges, (self, out[msg_field], reduce), {})

    def _any_node(self):
        """Some node tensor for a message that reads none (message_passing needs rows)."""
        if not self.ndata:
            raise CompileError("a message that reads no node field needs some g.ndata field set")
        return next(iter(self.ndata.values()))

    def _register(self, module: nn.Module) -> nn.Module:
        """Make ``module`` reachable from the traced root, where IR ops find it by path."""
        return self.tracer.add_helper_module(module)


class _InDegrees(fx.Proxy):
    """``g.in_degrees()``. DGL's layers refuse a graph with a node without in-edges by
    ``if (g.in_degrees() == 0).any(): raise DGLError(...)``: a branch on the graph's values,
    which tracing cannot take. Here that condition records the same check, made when the
    program runs (:func:`~sarcompile.frontends.dgl.check_in_edges`, raising where DGL raises),
    and is False while tracing: past the check, it is false."""

    def __init__(self, node: fx.Node, tracer: fx.Tracer, graph: GraphProxy, stage: str = "degrees"):
        super().__init__(node, tracer)
        self.graph, self.stage = graph, stage

    def __eq__(self, other):
        out = super().__eq__(other)
        if self.stage == "degrees" and isinstance(other, int) and other == 0:
            return _InDegrees(out.node, self.tracer, self.graph, "zero")
        return out

    def any(self, *args, **kwargs):
        out = self.tracer.create_proxy("call_method", "any", (self, *args), kwargs)
        if self.stage == "zero" and not args and not kwargs:
            return _InDegrees(out.node, self.tracer, self.graph, "any zero")
        return out

    def __bool__(self):
        if self.stage != "any zero":
            return super().__bool__()
        node = self.node
        while node.op != "placeholder" and not node.users:  # any <- eq <- in_degrees: only the check stays
            parent = node.args[0]
            self.tracer.graph.erase_node(node)
            node = parent
        self.tracer.create_proxy("call_function", check_in_edges, (self.graph,), {})
        return False

    __hash__ = fx.Proxy.__hash__


def _reduce_of(reduce_func) -> tuple[str, str]:
    name = getattr(reduce_func, "_name", None)
    if type(reduce_func).__name__ != "SimpleReduceFunction" or name not in _REDUCES:
        raise CompileError(
            f"reduce function {_describe(reduce_func)} is not supported yet: use dgl.function.sum, mean or max "
            "(a function on nodes.mailbox cannot be split into blocks)"
        )
    return reduce_func.msg_field, _REDUCES[name]


def _check_field(message_out: str, reduce_in: str) -> None:
    if message_out != reduce_in:
        raise CompileError(f"the message writes {message_out!r} but the reduce reads {reduce_in!r}")


def _describe(func) -> str:
    if hasattr(func, "name"):
        return f"dgl.function.{func.name}"
    return getattr(func, "__name__", type(func).__name__)
