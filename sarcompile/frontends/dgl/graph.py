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
frames as plain dicts of traced values. Each relation of a typed graph is one too
(:mod:`sarcompile.frontends.dgl.hetero`), bipartite when it joins two node types:
``srcdata`` then holds rows of the source type, ``dstdata`` of the destination type.
``update_all`` lowers to

* ``spmm`` for ``copy_u`` with ``sum``/``mean``/``max``/``min``;
* ``message_passing`` (per-block messages, recomputed in backward) for every other
  builtin message (``u_mul_e``, ``u_add_v``, ``copy_e``, ...) and for a user message
  function ``def message(edges): return {"m": ...}`` reading ``edges.src`` /
  ``edges.dst`` (one node field) and ``edges.data`` (at most one edge field), on a graph
  with one node set;
* messages computed on per-edge rows and reduced into their destinations
  (``edge_reduce``, ``sum``/``mean``) for a message reading more fields, and on a
  relation between two node types.

``apply_edges`` with a builtin ``u_<op>_v`` / ``v_<op>_u`` lowers to ``sddmm``; any other
builtin (``u_add_e``, ``e_mul_v``, ...) and a user function ``def f(edges): return {...}``
compute on per-edge rows: ``edges.src[f]`` / ``edges.dst[f]`` are the field gathered onto
the edges (by ``sddmm``, read only when used), ``edges.data`` the edge frame.

The counts DGL code reads (``g.num_edges()``, ``g.num_nodes()``, ...) are the graph's row
counts, so ``torch.ones(g.num_edges())`` is a per-edge tensor; ``g.out_degrees()`` and
``g.device`` are answered by row-local helpers. Reduce functions must be DGL's builtins
``sum``, ``mean``, ``max`` or ``min`` (``min`` of ``copy_u``): a mailbox function
(``nodes.mailbox``, which DGL buckets by degree) is refused with a
:class:`~sarcompile.CompileError` naming the layer and the line, as is what is not listed here.
"""

from __future__ import annotations

import builtins
import contextlib
import operator
import os
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

import dgl
import torch
import torch.fx as fx
from torch import nn

from sarcompile.errors import CompileError
from sarcompile.ir.lowering import declare, register_function_lowering
from sarcompile.ir.ops import edge_reduce, gather_dst, gather_src, message_passing, sddmm, spmm
from sarcompile.frontends.dgl.layers import check_in_edges, graph_device, out_degrees

__all__ = ["GraphProxy", "Frames", "refusal"]

_SRC, _DST, _EDGE = 0, 1, 2  # dgl.function.TargetCode
_ALL = "__ALL__"  # dgl.base.ALL: every node or edge
_REDUCES = {"sum": "sum", "mean": "mean", "max": "max", "min": "min"}
_SDDMM = ("add", "sub", "mul", "dot")
_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}


# Where the user's line is not: sarcompile, torch, DGL and Python's own modules.
_NOT_USER = tuple(str(Path(m.__file__).resolve().parent) + os.sep for m in (torch, dgl, os))
_OURS = str(Path(__file__).resolve().parents[2]) + os.sep


def refusal(message: str, tracer: fx.Tracer | None = None) -> CompileError:
    """A :class:`~sarcompile.CompileError` saying ``message``, and where: the layer ``tracer``
    is tracing, and the user's line (the innermost frame outside sarcompile, torch, DGL and
    Python's library)."""
    where = []
    stack = list(getattr(tracer, "module_stack", {}).values())  # (path, type) per module entered
    if stack and stack[-1][0]:
        path, kind = stack[-1]
        where.append(f"in layer {path!r} ({getattr(kind, '__name__', str(kind).rsplit('.', 1)[-1])})")
    for frame in reversed(traceback.extract_stack()[:-1]):
        path = str(Path(frame.filename).resolve())
        if not path.startswith(_NOT_USER) and not path.startswith(_OURS) and not frame.filename.startswith("<"):
            where.append(f"at {Path(frame.filename).name}:{frame.lineno}: `{(frame.line or '').strip()}`")
            break
    return CompileError(f"{message} ({', '.join(where)})" if where else message)


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


class _Reads(dict):
    """A frame that remembers which fields were read."""

    def __init__(self, values: dict, read: set):
        super().__init__(values)
        self.read = read

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


class _Fields(dict):
    """One frame of a traced graph: a field it lacks is refused, naming the fields it has."""

    def __init__(self, values: dict, what: str):
        super().__init__(values)
        self.what = what

    def copy(self) -> "_Fields":
        return _Fields(self, self.what)

    def __missing__(self, key: Any):
        raise refusal(
            f"{self.what}[{key!r}]: the graph has no such field (its fields: {sorted(map(str, self))}). Set it "
            f"before calling the model, as on a DGL graph: {self.what}[{key!r}] = tensor on the graph the model is "
            "called with (on a worker on part.graph, whose ndata sc.partition(..., node_data=...) fills), or store "
            "it in forward before reading it"
        )


def _what(end: str, of: Any) -> str:
    """How DGL code names a frame: ``g.ndata``, ``G.nodes['paper'].data``, ``G.edges[rel].data``."""
    if of is None:
        return f"g.{end}"
    return f"G.{'nodes' if end == 'ndata' else 'edges'}[{of!r}].data"


class Frames:
    """The fields DGL code stores on a traced graph: a dict per node type and per relation
    (DGL's frames), with DGL's scopes. ``initial``: the fields the graph has when the model
    is called (its frames' inputs of the program, by ``(end, type or relation, field)``,
    see :func:`~sarcompile.compile.leaves.frame_inputs`).

    A heterograph and its relations share one ``Frames``, as a DGL relation graph shares
    the heterograph's storage: what ``g["writes"].srcdata`` gets, ``g.nodes["author"].data``
    shows. A one-type graph has one node type and one relation, both ``None``."""

    def __init__(self, node_types: Iterable[Any] = (None,), relations: Iterable[Any] = (None,),
                 initial: dict[tuple[str, Any, str], Any] | None = None):
        nodes = {t: _Fields({}, _what("ndata", t)) for t in node_types}
        edges = {r: _Fields({}, _what("edata", r)) for r in relations}
        for (end, of, field), value in (initial or {}).items():
            (nodes if end == "ndata" else edges)[of][field] = value
        self._stack: list[tuple[dict, dict]] = [(nodes, edges)]

    def nodes(self, ntype: Any) -> dict:
        return self._stack[-1][0][ntype]

    def edges(self, rel: Any) -> dict:
        return self._stack[-1][1][rel]

    def _current(self) -> tuple[dict, dict]:
        nodes, edges = self._stack[-1]
        return {t: f.copy() for t, f in nodes.items()}, {r: f.copy() for r, f in edges.items()}

    @contextlib.contextmanager
    def scope(self):
        """Writes inside the block are dropped at its end (DGL's ``local_scope``)."""
        self._stack.append(self._current())
        try:
            yield
        finally:
            self._stack.pop()

    def copy(self) -> "Frames":
        """Frames of their own holding the fields set now (DGL's ``local_var``)."""
        out = Frames((), ())
        out._stack = [self._current()]
        return out


class GraphProxy(fx.Proxy):
    """The graph input of a traced DGL-style model, or one relation of a typed graph
    (``rel``, its ``(src_type, name, dst_type)``): an fx proxy with DGL's frames. A relation
    between two types is bipartite: ``srcdata`` holds rows of its source type, ``dstdata``
    of its destination type; a relation within one type and a one-type graph have one node
    set (``ndata``)."""

    def __init__(self, node: fx.Node, tracer: fx.Tracer, frames: Frames | None = None, rel: Any = None):
        super().__init__(node, tracer)
        self._rel = rel
        self._src, self._dst = (rel[0], rel[2]) if rel is not None else (None, None)
        self._frames = frames if frames is not None else Frames((self._dst,), (rel,))
        self._origin: GraphProxy | None = None  # after remove_self_loop(): the graph it came from

    @property
    def bipartite(self) -> bool:
        """Whether sources and destinations are nodes of two types."""
        return self._src != self._dst

    # -- frames ------------------------------------------------------------------------------
    @property
    def ndata(self) -> dict:
        if self.bipartite:
            raise self._refusal(f"g[{self._rel}].ndata: this relation joins two node types ({self._src!r} and "
                                f"{self._dst!r}); use srcdata (rows of {self._src!r}) and dstdata (rows of "
                                f"{self._dst!r})")
        return self._frames.nodes(self._dst)

    @property
    def srcdata(self) -> dict:
        return self._frames.nodes(self._src)

    @property
    def dstdata(self) -> dict:
        return self._frames.nodes(self._dst)

    @property
    def edata(self) -> dict:
        return self._frames.edges(self._rel)

    # What DGL's layers ask of the graph before they compute (expand_as_pair, asserts):
    # known when compiling, since sarcompile graphs are whole (never blocks).
    is_block = False
    batch_size = 1

    @property
    def is_homogeneous(self) -> bool:
        return not self.bipartite

    @property
    def srctypes(self) -> list:
        return [self._src if self._rel is not None else "_N"]

    @property
    def dsttypes(self) -> list:
        return [self._dst if self._rel is not None else "_N"]

    @property
    def ntypes(self) -> list:
        return self.srctypes + self.dsttypes if self.bipartite else self.dsttypes

    @property
    def canonical_etypes(self) -> list:
        return [self._rel if self._rel is not None else ("_N", "_E", "_N")]

    @property
    def etypes(self) -> list:
        return [rel[1] for rel in self.canonical_etypes]

    # -- self-loops: sarcompile's graphs have none removed, or exactly one per node --------
    def remove_self_loop(self, etype=None) -> "GraphProxy":
        return self._derived("remove_self_loops", self, loop_free=True)

    def add_self_loop(self, edge_feat_names=None, fill_data=1.0, etype=None) -> "GraphProxy":
        """One self-loop per node, after ``remove_self_loop()`` (DGL appends them last, as
        ``with_self_loops`` does). On a graph that may have self-loops DGL adds a second one,
        which sarcompile's graphs do not express: refused."""
        if self._origin is None:
            raise self._refusal(
                "g.add_self_loop() on a graph that may have self-loops gives those nodes two, which sarcompile does "
                "not compile: call g.remove_self_loop() first, or add the loops before sc.Graph.from_dgl"
            )
        return self._derived("with_self_loops", self._origin, loop_free=False)

    def _derived(self, method: str, base: "GraphProxy", loop_free: bool) -> "GraphProxy":
        if self.bipartite:
            raise self._refusal(f"g[{self._rel}].{method}(): a relation between two node types has no self-loops")
        if self.edata:
            raise self._refusal(f"g.{method}() with edge fields set ({sorted(self.edata)}) is not supported; set "
                                "them on the graph it returns")
        node = self.tracer.create_proxy("call_method", method, (base,), {}).node
        frames = Frames((self._dst,), (self._rel,))
        frames.nodes(self._dst).update(self.ndata)
        graph = GraphProxy(node, self.tracer, frames, self._rel)
        graph._origin = base if loop_free else None
        return graph

    def local_var(self) -> "GraphProxy":
        """The same graph with frames of its own: writes to it are not seen here, as in DGL."""
        view = GraphProxy(self.node, self.tracer, self._frames.copy(), self._rel)
        view._origin = self._origin
        return view

    @contextlib.contextmanager
    def local_scope(self):
        """Writes inside the block are dropped at its end, as in DGL."""
        with self._frames.scope():
            yield self

    # -- sizes and degrees: row counts and per-node values --------------------------------
    def _count(self, attr: str):
        return self.tracer.create_proxy("call_function", builtins.getattr, (self, attr), {})

    def num_edges(self, etype=None):
        """This graph's edge count (a worker's own edges): a row count, so
        ``torch.ones(g.num_edges())`` has one row per edge."""
        return self._count("num_edges")

    def num_nodes(self, ntype=None):
        """The node count (a worker's own nodes): a row count. A relation between two types
        counts the nodes of ``ntype``, one of them."""
        if not self.bipartite or ntype == self._dst:
            return self._count("num_nodes")
        if ntype == self._src:
            return self._count("num_src_nodes")
        raise self._refusal(f"g[{self._rel}].num_nodes({ntype!r}): this relation joins {self._src!r} and "
                            f"{self._dst!r}; count one of them (num_src_nodes(), num_dst_nodes())")

    def num_src_nodes(self, ntype=None):
        return self._count("num_src_nodes") if self.bipartite else self._count("num_nodes")

    def num_dst_nodes(self, ntype=None):
        return self._count("num_nodes")

    number_of_edges = num_edges
    number_of_nodes = num_nodes
    number_of_src_nodes = num_src_nodes
    number_of_dst_nodes = num_dst_nodes

    def in_degrees(self, v=_ALL, etype=None):
        """The in-degree of every destination node; ``(g.in_degrees() == 0).any()`` in an
        ``if`` becomes the check DGL's layers make with it (see :class:`_InDegrees`)."""
        if not _is_all(v):
            raise self._refusal("g.in_degrees(v) of some nodes is not supported; use g.in_degrees() of all")
        return _InDegrees(self.tracer.create_proxy("call_method", "in_degrees", (self,), {}).node, self.tracer, self)

    def out_degrees(self, u=_ALL, etype=None):
        """The out-degree of every source node."""
        if not _is_all(u):
            raise self._refusal("g.out_degrees(u) of some nodes is not supported; use g.out_degrees() of all")
        return self.tracer.create_proxy("call_function", out_degrees, (self, self._count("src_global_ids")), {})

    @property
    def device(self):
        return self.tracer.create_proxy("call_function", graph_device, (self,), {})

    # -- message passing -------------------------------------------------------------------
    def update_all(self, message_func, reduce_func, apply_node_func=None, etype=None) -> None:
        if apply_node_func is not None:
            raise self._refusal("update_all(..., apply_node_func) is not supported yet; apply it to g.ndata after")
        self.dstdata[reduce_func.out_field] = self.aggregate(message_func, reduce_func)

    def aggregate(self, message_func, reduce_func):
        """What ``update_all(message_func, reduce_func)`` writes into the destinations:
        ``spmm`` for ``copy_u``; ``message_passing`` for a message reading one node field
        and at most one edge field, on a graph with one node set; else the messages computed
        on the edges and reduced into their destinations."""
        msg_field, reduce = _reduce_of(reduce_func, self.tracer)
        if getattr(message_func, "target", None) == _SRC and type(message_func).__name__ == "CopyMessageFunction":
            _check_field(message_func.out_field, msg_field)
            return spmm(self, self._src_field(message_func.in_field), reduce)
        lowered = None if self.bipartite else self._message(message_func, msg_field)
        if lowered is None:
            return self._reduce_edges(message_func, msg_field, reduce)
        if reduce == "min":
            raise self._refusal(f"update_all({_describe(message_func)}, dgl.function.min) is not supported yet: "
                                "min takes dgl.function.copy_u messages")
        return message_passing(self, *lowered, reduce)

    def apply_edges(self, func, edges=_ALL, etype=None) -> None:
        """A value per edge: ``sddmm`` for ``u_<op>_v`` / ``v_<op>_u``, else computed on the
        end nodes' rows gathered onto the edges (see the module docstring)."""
        if not _is_all(edges):
            raise self._refusal("apply_edges(func, edges) on some edges is not supported; apply it to all edges")
        ends = (getattr(func, "lhs", None), getattr(func, "rhs", None))
        if type(func).__name__ == "BinaryMessageFunction" and set(ends) == {_SRC, _DST} and func.binary_op in _SDDMM:
            swap = ends[0] == _DST  # v_<op>_u: b[v] op a[u]
            u, v = (func.rhs_field, func.lhs_field) if swap else (func.lhs_field, func.rhs_field)
            value = sddmm(self, self._src_field(u), self._dst_field(v), func.binary_op)
            if swap and func.binary_op == "sub":
                value = -value  # b - a == -(a - b) exactly: IEEE rounding is symmetric
            self.edata[func.out_field] = value.unsqueeze(-1) if func.binary_op == "dot" else value
        else:
            self.edata.update(self._on_edges(func))

    # -- helpers ---------------------------------------------------------------------------
    def _field(self, frame: dict, field: str, name: str):
        if field not in frame:
            raise self._refusal(f"g.{name} has no field {field!r} here (it has {sorted(frame)})")
        return frame[field]

    def _src_field(self, field: str):
        return self._field(self.srcdata, field, "srcdata" if self.bipartite else "ndata")

    def _dst_field(self, field: str):
        return self._field(self.dstdata, field, "dstdata" if self.bipartite else "ndata")

    def _edge(self, field: str):
        return self._field(self.edata, field, "edata")

    def _rows(self, end: int, field: str):
        """A field as one row per edge: the source's or destination's row, or the edge's."""
        if end == _EDGE:
            return self._edge(field)
        if end == _SRC:
            return gather_src(self, self._src_field(field))
        return gather_dst(self, self._dst_field(field))

    def _on_edges(self, func) -> dict:
        """The fields an edge function (a builtin message or ``def f(edges): return {...}``)
        gives, computed on the end nodes' rows gathered onto the edges (read only when used)."""
        kind = type(func).__name__
        if kind in ("BinaryMessageFunction", "CopyMessageFunction"):
            if kind == "BinaryMessageFunction":
                ends = [(func.lhs, func.lhs_field), (func.rhs, func.rhs_field)]
                msg = _BuiltinMessage(func.binary_op, func.lhs, func.rhs)
            else:
                ends, msg = [(func.target, func.in_field)], _BuiltinMessage("copy", func.target, None)
            rows = {end: self._rows(end, f) for end, f in ends}
            return {func.out_field: msg(rows.get(_SRC), rows.get(_DST), rows.get(_EDGE))}
        if callable(func) and not hasattr(func, "out_field"):
            out = func(_Edges(_Gathered(self, _SRC), _Gathered(self, _DST), self.edata))
            if not isinstance(out, dict):
                raise self._refusal(f"the edge function {_describe(func)} must return a dict of edge fields")
            return out
        raise self._refusal(f"{_describe(func)} is not supported yet")

    def _message(self, func, msg_field: str) -> tuple[nn.Module, Any, Any] | None:
        """(message module, node tensor, edge tensor or None) for ``message_passing``; None
        for a message reading more than one node field or edge field (computed on the edges)."""
        kind = type(func).__name__
        if kind == "CopyMessageFunction":  # copy_e (copy_u took the spmm path)
            _check_field(func.out_field, msg_field)
            if func.target != _EDGE:
                return None
            fn = _BuiltinMessage("copy", _EDGE, None)
            return self._register(fn), self._any_node(), self._edge(func.in_field)
        if kind == "BinaryMessageFunction":
            _check_field(func.out_field, msg_field)
            fields = {side: f for side, f in ((func.lhs, func.lhs_field), (func.rhs, func.rhs_field))}
            nodes = {f for side, f in fields.items() if side in (_SRC, _DST)}
            if len(nodes) > 1:
                return None
            if func.binary_op not in (*_BINARY, "dot"):
                raise self._refusal(f"{_describe(func)} is not supported yet")
            x = self._src_field(nodes.pop()) if nodes else self._any_node()
            e = self._edge(fields[_EDGE]) if _EDGE in fields else None
            return self._register(_BuiltinMessage(func.binary_op, func.lhs, func.rhs)), x, e
        if callable(func) and not hasattr(func, "out_field"):
            return self._user_message(func, msg_field)
        raise self._refusal(f"message function {_describe(func)} is not supported yet")

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
            raise self._refusal(
                f"the message function {getattr(func, '__name__', func)!r} failed when traced ({type(e).__name__}: "
                f"{e}); sarcompile supports message functions that compute with edges.src / edges.dst / "
                "edges.data tensors"
            ) from None
        added = [n for n in graph.nodes if n not in before]
        for node in reversed(added):
            graph.erase_node(node)
        if not isinstance(out, dict) or msg_field not in out:
            raise self._refusal(f"the message function must return a dict with the field {msg_field!r} the reduce "
                                "reads")
        # Several fields, or the layer's own modules and parameters (RelGraphConv's linear_r, which a
        # separate message module could not reach nor lower): computed on the edges (_reduce_edges).
        if len(node_reads) > 1 or len(edge_reads) > 1 or any(n.op in ("call_module", "get_attr") for n in added):
            return None
        node_field = next(iter(node_reads), None)
        edge_field = next(iter(edge_reads), None)
        fn = self._register(_UserMessage(func, node_field, edge_field, msg_field))
        x = self._src_field(node_field) if node_field else self._any_node()
        return fn, x, (self._edge(edge_field) if edge_field else None)

    def _reduce_edges(self, func: Callable, msg_field: str, reduce: str):
        """Messages computed on per-edge rows (``E x F``, where message_passing keeps one
        block at a time), then reduced into their destinations: for a message reading
        several node or edge fields, and on a relation between two node types."""
        if reduce in ("max", "min"):
            raise self._refusal(
                f"update_all(message, dgl.function.{reduce}) with a message function reading several node or edge "
                "fields (or on a relation between two node types) is not supported yet: use sum or mean, or "
                "dgl.function.copy_u, or put what it reads in one node and one edge tensor"
            )
        out = self._on_edges(func)
        if msg_field not in out:
            raise self._refusal(f"the message function must return a dict with the field {msg_field!r} the reduce "
                                "reads")
        return edge_reduce(self, out[msg_field], reduce)

    def _any_node(self):
        """Some node tensor for a message that reads none (message_passing needs rows)."""
        if not self.ndata:
            raise self._refusal("a message that reads no node field needs some g.ndata field set")
        return next(iter(self.ndata.values()))

    def _refusal(self, message: str) -> CompileError:
        return refusal(message, self.tracer)

    def _register(self, module: nn.Module) -> nn.Module:
        """Make ``module`` reachable from the traced root, where IR ops find it by path."""
        return self.tracer.add_helper_module(module)


class _InDegrees(fx.Proxy):
    """``g.in_degrees()``. DGL's layers refuse a graph with a node without in-edges by
    ``if (g.in_degrees() == 0).any(): raise DGLError(...)``: a branch on the graph's values,
    which tracing cannot take. Here that condition records the same check, made when the
    program runs (:func:`~sarcompile.frontends.dgl.layers.check_in_edges`, raising where DGL raises),
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


def _is_all(which: Any) -> bool:
    return isinstance(which, str) and which == _ALL


def _reduce_of(reduce_func, tracer: fx.Tracer | None = None) -> tuple[str, str]:
    name = getattr(reduce_func, "_name", None)
    if type(reduce_func).__name__ != "SimpleReduceFunction" or name not in _REDUCES:
        raise refusal(
            f"reduce function {_describe(reduce_func)} is not supported yet: use dgl.function.sum, mean, max or min "
            "(a function on nodes.mailbox cannot be split into blocks)", tracer
        )
    return reduce_func.msg_field, _REDUCES[name]


def _check_field(message_out: str, reduce_in: str) -> None:
    if message_out != reduce_in:
        raise refusal(f"the message writes {message_out!r} but the reduce reads {reduce_in!r}")


def _describe(func) -> str:
    if hasattr(func, "name"):
        return f"dgl.function.{func.name}"
    return getattr(func, "__name__", type(func).__name__)


# -- DGL's graph functions called on the traced graph -----------------------------------------
_READOUT = ("combines the rows of every node or edge (a graph readout), and each worker holds only its own: "
            "not supported; leave it out of a node-level model, or sum each worker's rows and add them with "
            "sc.global_sum")
_TRANSFORM = ("builds another graph while the model runs, which a partitioned graph cannot be: transform the "
              "graph once, before Graph.from_dgl and sc.partition")


def _refused_on_the_traced_graph(original: Callable, why: str) -> Callable:
    """``original``, refused with ``why`` where it is given the traced graph (inside forward)."""

    def call(*args, **kwargs):
        if any(isinstance(a, GraphProxy) for a in (*args, *kwargs.values())):
            raise refusal(f"dgl.{original.__name__}(g) in forward {why}")
        return original(*args, **kwargs)

    return call


for _name, _why in [*((n, _READOUT) for n in ("readout_nodes", "readout_edges", "sum_nodes", "sum_edges",
                                               "mean_nodes", "mean_edges", "max_nodes", "max_edges",
                                               "softmax_nodes", "softmax_edges", "topk_nodes", "topk_edges")),
                    *((n, _TRANSFORM) for n in ("reverse", "add_reverse_edges", "to_bidirected", "remove_self_loop",
                                                "to_simple", "add_edges", "remove_edges", "add_nodes", "remove_nodes",
                                                "node_subgraph", "edge_subgraph", "khop_graph", "line_graph"))]:
    if hasattr(dgl, _name):  # (every one in DGL 2.x)
        _original = getattr(dgl, _name)
        register_function_lowering(_original, _refused_on_the_traced_graph(_original, _why), homes=("dgl",))
