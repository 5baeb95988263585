"""DGL's message passing on a traced graph (:class:`MessagePassingMethods`, mixed into
:class:`~sarcompile.frontends.dgl.graph.GraphProxy`): ``update_all`` and ``apply_edges``
with DGL's builtin and user functions lowered to IR ops.

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

Reduce functions must be DGL's builtins ``sum``, ``mean``, ``max`` or ``min`` (``min`` of
``copy_u``): a mailbox function (``nodes.mailbox``, which DGL buckets by degree) is refused
with a :class:`~sarcompile.CompileError` naming the layer and the line, as is what is not
listed here.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx as fx
from torch import nn

from sarcompile.errors import CompileError
from sarcompile.ir.lowering import declare
from sarcompile.ir.ops import edge_reduce, gather_dst, gather_src, message_passing, sddmm, spmm
from sarcompile.frontends.dgl.frames import refusal

__all__ = ["MessagePassingMethods"]

_SRC, _DST, _EDGE = 0, 1, 2  # dgl.function.TargetCode
_ALL = "__ALL__"  # dgl.base.ALL: every node or edge
_REDUCES = {"sum": "sum", "mean": "mean", "max": "max", "min": "min"}
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

    def __init__(self, graph: "MessagePassingMethods", end: int):
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


class MessagePassingMethods:
    """DGL's message passing methods of a traced graph. The class mixing them in is an fx
    proxy of the graph (``tracer``) with DGL's frames (``ndata``, ``srcdata``, ``dstdata``,
    ``edata``), ``bipartite`` where it joins two node types, and ``_refusal(message)``."""

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

    def _register(self, module: nn.Module) -> nn.Module:
        """Make ``module`` reachable from the traced root, where IR ops find it by path."""
        return self.tracer.add_helper_module(module)


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
