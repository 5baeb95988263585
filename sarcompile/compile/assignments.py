"""Assignments into part of a traced tensor (``h[mask] = v``, ``h[:, a:b] = v``), as eager computes them.

torch.fx cannot record an assignment. Where it is row-local, :func:`assign` records the new
tensor instead (``masked_fill``, ``torch.where`` or ``torch.cat`` of the pieces) and rebinds
the proxy to it; :func:`check_assignments` refuses, after the trace, one that a view taken
before it would see. Other assignments are refused with a
:class:`~sarcompile.compile.trace_errors.AssignError` saying how to write them.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from sarcompile.compile.trace_errors import AssignError

if TYPE_CHECKING:
    from sarcompile.compile.trace import ShapeTracer

__all__ = ["assign", "check_assignments"]

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
    lowered to ``torch.cat`` of the pieces. Refused (an :class:`AssignError` saying how to
    write it) where ``h`` is an input or parameter (the caller's tensor would change), a view
    of another value or viewed by one (the view would see the change), where rows are picked
    by position, or where the value has one row per selected row."""
    tracer: ShapeTracer = h.tracer
    node = h.node
    if node.op in ("placeholder", "get_attr"):
        raise AssignError("an assignment into part of a forward argument or a parameter, which would change the "
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
            raise AssignError("an assignment into part of a view of a forward argument or a parameter (a slice or "
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
            raise AssignError("an assignment into part of a tensor that shares its storage with another read after "
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
        raise AssignError("an assignment into part of a traced tensor whose shape or index is not known when "
                          "compiling; compute the new tensor instead, e.g. with torch.where(mask, v, h)")
    if any(m.dtype != torch.bool for m in masks):
        raise AssignError(_POSITION)
    if any(m.dim() > x.dim() or m.shape != x.shape[:m.dim()] for m, x in zip(masks, hs)):
        raise AssignError("an assignment `h[mask] = v` whose mask is not shaped as h's leading dims; give a "
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
            raise AssignError("an assignment `h[mask] = v` whose value has one row per row selected (such as "
                              "`h[mask] = f(h[mask])`), how many differs between workers; compute it for all rows "
                              "and select: h = torch.where(mask.unsqueeze(-1), f(h), h)")
        return torch.where(mask, value.type_as(h), h)
    return h.masked_fill(mask, value)


def _columns(tracer: ShapeTracer, h: fx.Proxy, shape: torch.Size | None, index: Any, value: Any) -> fx.Proxy:
    """``h[:, a:b] = value`` (or ``h[:, k]``, ``h[..., k]``): all rows, a position along one
    feature dim, the pieces beside it kept."""
    items = list(index) if isinstance(index, tuple) else [index]
    if shape is None:
        raise AssignError("an assignment into part of a traced tensor whose shape is not known when compiling; "
                          "compute the new tensor instead, with torch.cat of its pieces along the feature dim")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at:at + 1] = [slice(None)] * (len(shape) - len(items) + 1)
    whole = slice(None)
    picked = [d for d, i in enumerate(items) if not (isinstance(i, slice) and i == whole)]
    if not picked or picked[0] == 0 or len(picked) > 1 or len(items) > len(shape) \
            or any(isinstance(i, (fx.Proxy, torch.Tensor)) for i in items):
        raise AssignError(_POSITION if not picked or picked[0] == 0 else
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
        raise AssignError("an assignment into a strided slice of a traced tensor; compute the new tensor instead, "
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
