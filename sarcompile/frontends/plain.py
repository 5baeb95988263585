"""Message passing written in plain torch over ``edge_index``, as IR ops.

Code without a GNN library (and PyG layers' own ``message`` / ``aggregate``) passes
messages with torch's indexing and scatter functions::

    src, dst = edge_index
    out = torch.zeros_like(x).index_add_(0, dst, x[src] * w)

While a model or layer is traced, ``edge_index[0]`` and ``edge_index[1]`` are
:class:`~.edge_index.EdgeEnd` markers (in a model's own forward too, see
:func:`~.edge_index.in_forward`); the torch functions and Tensor methods below, given one,
become IR ops (:func:`~.edge_index.tensor_rule`). This front-end needs no GNN library: it
is loaded for every compile, and imports none.

==============================================================  =====================================
plain torch (``e``: one row per edge; ``t``: one row per node)  lowered to
==============================================================  =====================================
``x[src]``, ``x.index_select(0, src)``, ``torch.index_select``  ``gather_src`` (``gather_dst`` for dst)
``t.index_add_(0, dst, e)``, ``index_add``, ``torch.index_add``  ``t + edge_reduce(g, e, "sum")``
``t.scatter_add_(0, dst.unsqueeze(-1).expand_as(e), e)``        the same
``t.scatter_reduce(0, idx, e, reduce, include_self=...)``,      ``edge_reduce`` (sum, mean, prod, amax,
``t.index_reduce(0, dst, e, reduce, include_self=...)``         amin), ``t`` kept where no edge arrives
``torch.ones_like(dst, dtype=...)``, ``zeros_like``, ``full_like``  a value per edge
==============================================================  =====================================

Into the destinations (``dst``) every reduction is local, as every in-edge of a node lives
on its worker. Into the sources (``src``) a sum or mean is the ``edge_reduce_src`` op (the
other workers push their partial sums); a maximum, minimum or product there is refused.
``include_self=True`` with amax / amin is refused: torch splits the gradient of a tie among
``t``'s entry and the edges', which the reduction over the edges alone cannot repeat.

The tensor aggregated into must be traced with one row per node (``torch.zeros_like(x)``,
``x.new_zeros(x.size(0), d)``, ``torch.zeros(x.size(0), d)``): a tensor of a fixed size
has the whole graph's rows, which a worker does not hold. An in-place update
(``index_add_``) rebinds the tensor to the result, as eager updates it; into a forward
argument, a parameter or a view it is refused (eager would change the caller's tensor or
the viewed one).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from sarcompile.errors import CompileError
from sarcompile.ir.lowering import declare
from sarcompile.ir.ops import edge_reduce, edge_reduce_src
from sarcompile.compile.source_lines import where_line
from sarcompile.compile.assignments import _is_view
from sarcompile.frontends.edge_index import EdgeEnd, _edge_axis, _examples, _in_degree, _ones_per_edge, gather, tensor_rule

__all__: list[str] = []

for _helper in (_edge_axis, _in_degree, _ones_per_edge):  # edge_index's run-time helpers, one node each here too
    torch.fx.wrap(_helper.__name__)

# torch's reduction names -> edge_reduce's ("sum" for mean: the mean with t's entry divides by one more)
_REDUCES = {"sum": "sum", "mean": "mean", "prod": "mul", "amax": "max", "amin": "min"}


def _end_given(name: str, index: Any) -> EdgeEnd:
    if not isinstance(index, EdgeEnd):
        raise CompileError(
            f"{name} with edge_index[i] as a value rather than as its index{where_line()}: sarcompile lowers "
            f"{name}(dim, edge_index[i], ...), with the index in its own place"
        )
    return index


@tensor_rule("index_select")
def _index_select(name: str, x: Any, dim: Any, index: Any) -> torch.fx.Proxy:
    """``x.index_select(0, src)``: ``x[src]``."""
    end = _end_given(name, index)
    if dim != 0:
        raise CompileError(
            f"index_select(dim={dim!r}, edge_index[i]){where_line()} is not supported: sarcompile gathers node rows "
            "onto edges along axis 0 (x.index_select(0, edge_index[i]) or x[edge_index[i]])"
        )
    return gather(x, end)


@tensor_rule("ones_like", "zeros_like", "full_like")
def _like(name: str, index: Any, *args: Any, dtype: torch.dtype | None = None, **kwargs: Any) -> torch.fx.Proxy:
    """``torch.ones_like(dst, dtype=...)``: a value per edge, in ``dst``'s dtype (int64) by default."""
    end = _end_given(name, index)
    if end.column:
        raise end.refusal()
    fill = {"ones_like": 1, "zeros_like": 0}.get(name, args[0] if args else kwargs.get("fill_value"))
    return _ones_per_edge(end.graph, dtype or torch.long, fill)


@tensor_rule("index_add", "index_add_")
def _index_add(name: str, t: Any, dim: Any, index: Any, source: Any, *, alpha: Any = 1) -> Any:
    """``t.index_add_(0, dst, e)``: ``t`` plus each node's sum over its edges."""
    end = _end_given(name, index)
    if end.column:
        raise end.refusal()
    return _into(name, t, dim, end, source if alpha == 1 else source * alpha, "sum", True)


@tensor_rule("index_reduce", "index_reduce_")
def _index_reduce(name: str, t: Any, dim: Any, index: Any, source: Any, reduce: str, *,
                  include_self: bool = True) -> Any:
    end = _end_given(name, index)
    if end.column:
        raise end.refusal()
    return _into(name, t, dim, end, source, reduce, include_self)


@tensor_rule("scatter_add", "scatter_add_")
def _scatter_add(name: str, t: Any, dim: Any, index: Any, src: Any) -> Any:
    """``t.scatter_add_(0, dst.unsqueeze(-1).expand_as(e), e)``: :func:`_index_add`'s."""
    end = _end_given(name, index)
    return _into(name, t, dim, end, _source(src, end), "sum", True)


@tensor_rule("scatter_reduce", "scatter_reduce_")
def _scatter_reduce(name: str, t: Any, dim: Any, index: Any, src: Any, reduce: str, *,
                    include_self: bool = True) -> Any:
    end = _end_given(name, index)
    return _into(name, t, dim, end, _source(src, end), reduce, include_self)


@tensor_rule("scatter", "scatter_")
def _scatter(name: str, t: Any, dim: Any, index: Any, src: Any = None, *, value: Any = None,
             reduce: str | None = None) -> Any:
    """``t.scatter_(0, idx, e, reduce="add")`` (torch's older spelling of scatter_add_);
    a plain ``scatter`` (a write, no reduction) is refused."""
    end = _end_given(name, index)
    if reduce not in ("add", "multiply") or src is None:
        raise CompileError(
            f"{name}(0, edge_index[i], ...) without a reduction{where_line()} writes one of a node's edges' values "
            "into its row, and which one is not defined (it differs between workers); aggregate them instead: "
            "t.scatter_reduce(0, index, e, reduce='amax'/'sum'/'mean', include_self=False) or t.index_add_(0, "
            "edge_index[i], e)"
        )
    reduce = "sum" if reduce == "add" else "prod"
    return _into(name, t, dim, end, _source(src, end), reduce, True)


def _into(name: str, t: Any, dim: Any, end: EdgeEnd, e: Any, reduce: str, include_self: bool) -> Any:
    """``t`` with the per-edge ``e`` reduced into the rows ``end`` names, as torch's
    ``scatter_reduce(t, dim, index, e, reduce, include_self=...)`` (dim 0); in place
    (``t`` rebound) for a ``name`` ending in ``_``."""
    if not isinstance(t, torch.fx.Proxy):
        raise CompileError(
            f"`{name}` into a tensor of a fixed size{where_line()}: aggregating over edge_index[i] needs a tensor "
            "with one row per node, which on N workers holds each worker's own rows; make it from the node "
            "features: torch.zeros_like(x), x.new_zeros(x.size(0), d) or torch.zeros(x.size(0), d)"
        )
    if reduce not in _REDUCES:
        raise CompileError(f"{name} with reduce={reduce!r}{where_line()}: torch allows {sorted(_REDUCES)}")
    if include_self and reduce in ("amax", "amin"):
        raise CompileError(
            f"{name}(..., reduce={reduce!r}, include_self=True) over edge_index[i]{where_line()} is not supported: "
            "where t's entry ties with an edge's value, torch splits the gradient among them, which sarcompile's "
            "reduction over the edges does not repeat; pass include_self=False (then t keeps its entry only where "
            "no edge arrives)"
        )
    in_place = name.endswith("_")
    if in_place:
        _check_in_place(name, t)
    op = "sum" if reduce == "mean" and include_self else _REDUCES[reduce]
    e = _edge_axis(e, dim, name)
    if end.end == "dst":
        reduced, count = edge_reduce(end.graph, e, op), _in_degree(end.graph, None)
    elif op in ("sum", "mean"):  # a node's out-edges live on other workers, which push their partial sums
        reduced = edge_reduce_src(end.graph, e, op)
        count = edge_reduce_src(end.graph, _ones_per_edge(end.graph, None), "sum")
    else:
        raise CompileError(
            f"{name}(..., reduce={reduce!r}) into edge_index[0] (the sources){where_line()} is not supported: a "
            "node's out-edges live on other workers, which sarcompile can only sum (or average) into it; reduce "
            "into edge_index[1], or build the graph reversed (sc.Graph.from_edges(dst, src, n))"
        )
    out = _combined(t, reduced, count, reduce, include_self)
    if in_place:
        t.node = out.node  # eager's t is the updated tensor from now on
        return t
    return out


def _check_in_place(name: str, t: torch.fx.Proxy) -> None:
    """Refuse ``t.<name>(...)`` in place where eager's update would reach another tensor:
    ``t`` is a forward argument or parameter (the caller's), a view, or viewed."""
    node = t.node
    if node.op in ("placeholder", "get_attr") or _is_view(node) or any(_is_view(u) for u in node.users):
        raise CompileError(
            f"`{name}` in place into a forward argument, a parameter or a tensor that shares its storage with "
            f"another (a view){where_line()}: eager's update would change that one too, and sarcompile computes "
            f"the result as a new tensor; use the out-of-place `{name.rstrip('_')}`, or aggregate into a fresh "
            "tensor (torch.zeros_like(x))"
        )


def _source(src: Any, end: EdgeEnd) -> Any:
    """``src`` of a scatter over ``end`` (:func:`_scattered`), checked now where the
    examples are known, so a refusal names the user's line."""
    like = end.like
    likes = _examples(like) if isinstance(like, torch.fx.Proxy) else None
    for i, value in enumerate(_examples(src) or ()):
        shape = likes[i].shape if likes else like
        if not isinstance(like, torch.fx.Proxy) or likes:
            _check_covers(value, shape, end.column, where_line())
    return _scattered(src, like, end.column)


def _check_covers(src: torch.Tensor, like: Any, column: bool, line: str) -> None:
    """Refuse a scatter's index over the edges that does not cover ``src``: the 1-d marker
    for a 1-d ``src``, or the marker viewed as a column and expanded to ``src``'s shape
    (``expand_as(src)``, ``expand(-1, d)``) -- then the scatter is ``index_add``."""
    if like is None:
        covers = src.dim() == 1 and not column
    else:
        shape = like.shape if isinstance(like, torch.Tensor) else tuple(like)
        covers = len(shape) == src.dim() and all(s in (-1, n) for s, n in zip(shape[1:], src.shape[1:]))
    if not covers:
        raise CompileError(
            f"a scatter over edge_index[i] with an index not shaped as its source {tuple(src.shape)}{line}: "
            "sarcompile lowers an index of the source's shape, edge_index[i] for a 1-d source or "
            "edge_index[i].unsqueeze(-1).expand_as(src) for a 2-d one"
        )


@torch.fx.wrap
def _scattered(src: torch.Tensor, like: Any, column: bool) -> torch.Tensor:
    """``src``, after :func:`_check_covers` (at run time, where the trace did not know it)."""
    _check_covers(src, like, column, "")
    return src


@torch.fx.wrap
def _combined(t: torch.Tensor, reduced: torch.Tensor, count: torch.Tensor, reduce: str,
              include_self: bool) -> torch.Tensor:
    """torch's ``scatter_reduce(t, 0, index, e, reduce, include_self)`` from ``reduced``
    (the edges' reduction per row; their sum for a mean with ``t``'s entry) and ``count``
    (how many edges reach each row)."""
    count = count.reshape(-1, *(1,) * (reduced.dim() - 1)).to(reduced.dtype)
    if not include_self:
        return torch.where(count > 0, reduced, t)
    if reduce == "sum":
        return t + reduced
    if reduce == "mean":
        return (t + reduced) / (count + 1)
    return t * reduced  # prod


declare(_scattered, "src")
declare(_combined, "t")
