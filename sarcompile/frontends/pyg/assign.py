"""``t[mask] = value`` inside a PyG layer, as eager torch computes it.

PyG's own tutorial writes ``deg_inv_sqrt[deg_inv_sqrt == float('inf')] = 0``. torch.fx cannot
record an assignment into a traced tensor, so while a layer is traced
(:func:`~.utils.intercepting`) it is rewritten: ``t`` becomes ``torch.where(mask, value,
t)`` (``masked_fill`` for a number), and the Python object ``t`` refers to the new value from
then on, as the updated tensor is the same object in eager. The residency pass then checks
the ``where`` as any other op: row-local where ``mask`` and ``t`` have the same rows (a
per-node mask of per-node values, a per-edge mask of per-edge values).

``value`` is a number, a tensor broadcasting over the masked entries (a parameter vector, a
scalar tensor), or computed from ``y[mask]`` with ``+ - * /`` (``t[mask] = y[mask]``,
``t[mask] += 1``), which is computed from ``y`` on every row.

The rewrite changes ``t`` only, where eager changes its storage: a view of ``t`` taken
before the assignment and read after it, a tensor ``t`` is a view of, read after it, and
the layer's inputs and parameters (the caller's tensors) would see the update in eager and
not here. Those are refused when the layer's trace ends (:func:`assignments_settled`), naming
the line and the fix (``t = torch.where(mask, value, t)``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx

from sarcompile.errors import CompileError
from sarcompile.ir.lowering import declare
from sarcompile.compile.source_lines import where_line
from sarcompile.compile.assignments import _is_view
from sarcompile.frontends.edge_index import _examples

__all__ = ["assign_where", "assignments_settled"]

_ARITHMETIC = (operator.add, operator.sub, operator.mul, operator.truediv)  # (t[mask] op= v is t[mask] = t[mask] op v)
_WHERE = "t = torch.where(mask, value, t) (mask.unsqueeze(-1) for each axis of t after the mask's)"


@dataclass
class _Assignment:
    """One rewritten ``t[mask] = value``: ``old`` and ``new`` are t's nodes before and after."""

    old: torch.fx.Node
    new: torch.fx.Node
    line: str


# Per layer trace being settled (innermost last): the assignments rewritten, and the nodes
# reading rows by a mask that the rewrites replaced (``y[mask]``).
_TRACES: list[tuple[list[_Assignment], list[torch.fx.Node]]] = []


def assign_where(t: torch.fx.Proxy, mask: torch.fx.Proxy, value: Any) -> None:
    """``t[mask] = value`` for a traced ``mask`` (see the module docstring): ``t.node``
    becomes the node computing the new value."""
    line = where_line()
    assignments, reads = _TRACES[-1]
    rows = _unmasked(value, mask.node, reads)
    _check_examples(t, mask, value if rows is None else None, line)
    keep = _mask_over(mask, t, line)
    if rows is None and not isinstance(value, (torch.fx.Proxy, torch.Tensor)):
        new = t.masked_fill(keep, value)  # (in t's dtype, as the assignment)
    else:
        new = torch.where(keep, _assigned(value if rows is None else rows, t, mask, rows is None, line), t)
    assignments.append(_Assignment(t.node, new.node, line))
    t.node = new.node


def assignments_settled(forward: Callable[[], Any]) -> Any:
    """``forward()`` (a layer's forward, traced), after checking each assignment it rewrote:
    refused where a value sharing t's storage (t before the assignment, a view of it, what t
    is a view of) is read after the assignment or returned, as eager would read the update
    there. The ``y[mask]`` reads replaced and unused are erased (they pick rows by a mask,
    which the residency pass would refuse)."""
    _TRACES.append(([], []))
    try:
        result = forward()
        assignments, reads = _TRACES[-1]
        returned: set[torch.fx.Node] = set()
        torch.fx.node.map_aggregate(result, lambda a: returned.add(a.node) if isinstance(a, torch.fx.Proxy) else a)
        for a in assignments:
            _check_aliases(a, returned)
        for node in reversed(reads):
            if not node.users and node not in returned:
                node.graph.erase_node(node)
        return result
    finally:
        _TRACES.pop()


def _aliased(line: str, why: str) -> CompileError:
    return CompileError(
        f"`t[mask] = value` inside a PyG layer{line}: {why}; sarcompile rewrites the assignment into a new t and "
        f"cannot update that too. Write {_WHERE} and use that t from then on, or assign into a copy of your own "
        "(t = t.clone() first)"
    )


def _check_aliases(a: _Assignment, returned: set[torch.fx.Node]) -> None:
    """Refuse ``a`` where a node sharing storage with t before it is read after it."""
    root = a.old
    while _is_view(root) and isinstance(root.args[0], torch.fx.Node):
        root = root.args[0]
    shared, todo = {root}, [root]
    while todo:  # root and every view of it, of a view of it, ...
        for user in todo.pop().users:
            if _is_view(user) and user not in shared:
                shared.add(user)
                todo.append(user)
    order = {n: i for i, n in enumerate(a.new.graph.nodes)}
    late = [n for n in shared if n in returned or any(order[u] > order[a.new] for u in n.users)]
    if root.op in ("placeholder", "get_attr"):
        whose = "the layer's input" if root.op == "placeholder" else "a parameter or buffer"
        what = "t is" if root is a.old else "t is a view of"
        raise _aliased(a.line, f"{what} {whose}, so eager's in-place update changes the caller's tensor (or the "
                               "model's)")
    if late:
        what = ("t as it was before the assignment" if a.old in late else
                "a view of t taken before the assignment (t[:, :k], t.view(...), t.t(), ...), or the tensor t is a "
                "view of,")
        raise _aliased(a.line, f"{what} is read after it, where eager reads the updated values")


def _same(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` compute the same (the same node, or the same op of the same
    arguments: ``h[h > 0] = x[h > 0]`` computes its mask twice)."""
    if isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node):
        return a is b or (a.op == b.op and a.op in ("call_function", "call_method") and a.target == b.target
                          and _same(a.args, b.args) and _same(a.kwargs, b.kwargs))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and not isinstance(a, torch.Tensor) and a == b


def _unmasked(value: Any, mask: torch.fx.Node, reads: list[torch.fx.Node]) -> Any:
    """``value`` computed from ``y`` in place of every ``y[mask]`` it reads (through ``+ - * /``),
    or None where it reads none: the same values on the entries ``mask`` keeps. The nodes
    replaced go to ``reads``."""
    if not isinstance(value, torch.fx.Proxy) or value.node.op != "call_function":
        return None
    node, tracer = value.node, value.tracer
    if node.target is operator.getitem and _same(node.args[1], mask):
        reads.append(node)
        return tracer.proxy(node.args[0])
    if node.target not in _ARITHMETIC:
        return None
    args = [tracer.proxy(a) if isinstance(a, torch.fx.Node) else a for a in node.args]
    unmasked = [_unmasked(a, mask, reads) for a in args]
    if all(u is None for u in unmasked):
        return None
    reads.append(node)
    return node.target(*(a if u is None else u for a, u in zip(args, unmasked)))


# -- the checks, at compile time where the examples are known, else at the first run ------------
def _check_examples(t: torch.fx.Proxy, mask: torch.fx.Proxy, value: Any, line: str) -> None:
    """The run-time checks of :func:`_mask_over` and :func:`_assigned` on the examples,
    where they are known: refused when compiling, rather than at the first run."""
    ts, masks = _examples(t), _examples(mask)
    if ts is None or masks is None:
        return
    # (a proxy first: while a layer is traced, isinstance(proxy, Tensor) is True, see pyg._tracing_type)
    values = _examples(value) if isinstance(value, torch.fx.Proxy) else (
        (value,) * len(ts) if isinstance(value, torch.Tensor) else None)
    for i, (x, m) in enumerate(zip(ts, masks)):
        _check_mask(m, x, line)
        if values is not None:
            _selected(values[i], x, m, line)


def _check_mask(mask: torch.Tensor, t: torch.Tensor, line: str) -> None:
    if mask.dtype != torch.bool or mask.shape != t.shape[: mask.dim()]:
        what = f"of dtype {mask.dtype}" if mask.dtype != torch.bool else f"of shape {tuple(mask.shape)}"
        raise CompileError(
            f"`t[index] = value` inside a PyG layer{line} with an index {what} on t of shape {tuple(t.shape)}: "
            "sarcompile takes a bool mask of t's leading axes (one per node of per-node values, one per edge of "
            f"per-edge values), as rows picked by position differ between workers; write {_WHERE}"
        )


def _selected(value: torch.Tensor, t: torch.Tensor, mask: torch.Tensor, line: str) -> torch.Tensor:
    """``value``, given for the masked entries, without the leading axes of size 1 torch's
    assignment drops; refused where it has an axis for the entries, whose number differs
    between workers."""
    inner = t.dim() - mask.dim()
    while value.dim() > inner + 1 and value.shape[0] == 1:
        value = value.squeeze(0)
    if value.dim() > inner + 1 or (value.dim() == inner + 1 and value.shape[0] != 1):
        raise CompileError(
            f"`t[mask] = value` inside a PyG layer{line} with a value of shape {tuple(value.shape)}, one row per "
            "masked entry: which entries those are differs between workers. Assign a number, a value that "
            f"broadcasts over them, or y[mask] (y computed for all rows); or write {_WHERE}"
        )
    return value


@torch.fx.wrap
def _mask_over(mask: torch.Tensor, t: torch.Tensor, line: str) -> torch.Tensor:
    """``mask`` (a bool tensor of t's leading axes) with an axis of size 1 for each of t's
    other axes, for ``torch.where(mask, value, t)``."""
    _check_mask(mask, t, line)
    return mask.reshape(*mask.shape, *(1,) * (t.dim() - mask.dim()))


@torch.fx.wrap
def _assigned(value: torch.Tensor, t: torch.Tensor, mask: torch.Tensor, selected: bool, line: str) -> torch.Tensor:
    """``value`` in t's dtype (the assignment casts it); a ``selected`` one (given for the
    masked entries only) checked by :func:`_selected`."""
    return (_selected(value, t, mask, line) if selected else value).to(t.dtype)


declare(_mask_over, "mask")
declare(_assigned, "value")
