"""How rows move through torch ops that work on dims.

:class:`DimRules` follows the rows through shape queries, factories sized by a row count,
indexing, reshapes, ops that move or merge dims, reductions and other work along a dim,
joins, products (read as einsum equations) and broadcasting pointwise ops: it records the
dim the rows end up on (``Val.axis``) and refuses what moves rows off a dim of their own or
mixes them. The walk that calls it is :class:`sarcompile.compile.residency_check.Checker`.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
import torch.fx as fx

from sarcompile.compile.residency_rules import ALONG, DROPS, RETURNS_SEQ, verb
from sarcompile.compile.residency_values import (CONST, CONST_VAL, NODE, PARAM, PARAM_VAL, ROWS, CheckerBase, Val,
                                                 w_axis)
from sarcompile.ir.node_info import set_info


class DimRules(CheckerBase):
    """The rules for torch ops over dims (see the module docstring)."""

    def meta_of(self, node, name, x, xv) -> Val:
        if name == "getattr":
            name = node.args[1]
        if name in ("T", "mT"):
            return self.axes(node, name, x, xv)
        if name in ("ndim", "dtype", "device", "is_cuda", "requires_grad"):
            return CONST_VAL
        if name == "data":
            return xv
        if not xv.per_row:
            return CONST_VAL if xv.res is not PARAM else PARAM_VAL
        if name == "size" and (len(node.args) > 1 or "dim" in node.kwargs):
            d = self.axis(node, x, self.arg(node, 1, "dim"))
            return Val(ROWS, xv.res, of=xv.of) if d == xv.axis else CONST_VAL
        if name in ("size", "shape"):
            return Val(ROWS, xv.res, shape_ndim=self.ndim(node, x, "the shape"), of=xv.of, axis=xv.axis)
        if name in ("__len__", "len") and xv.axis != 0:
            return CONST_VAL  # the size of dim 0, which is not the rows'
        return Val(ROWS, xv.res, of=xv.of)  # numel, len

    def shape_item(self, node, xv) -> Val:
        idx = node.args[1]
        picked = range(xv.shape_ndim)[idx]
        if isinstance(idx, int):
            return Val(ROWS, xv.rows, of=xv.of) if picked == xv.axis else CONST_VAL
        if xv.axis not in picked:
            return CONST_VAL
        return Val(ROWS, xv.rows, shape_ndim=len(picked), of=xv.of, axis=picked.index(xv.axis))

    def longer_shape(self, node) -> Val | None:
        """``x.shape + (1,) * k`` or ``(1,) + x.shape``: a longer shape, its row count where it
        moved; None if ``node`` is not such a sum."""
        a, b = node.args
        if self.val(a).res is ROWS and self.val(a).shape_ndim is not None and self.tuple_length(b) is not None:
            return replace(self.val(a), shape_ndim=self.val(a).shape_ndim + self.tuple_length(b))
        if self.val(b).res is ROWS and self.val(b).shape_ndim is not None and self.tuple_length(a) is not None:
            extra = self.tuple_length(a)
            return replace(self.val(b), shape_ndim=self.val(b).shape_ndim + extra, axis=self.val(b).axis + extra)
        return None

    def factory(self, node, name, ins, k) -> Val:
        """``torch.zeros(x.size(0), 4)``, ``torch.zeros(1, x.size(0), h)`` (an LSTM's state),
        ``x.new_ones(x.shape)``: rows of ``x``'s kind on the dim the row count sizes."""
        sizes = list(node.args[1:] if name.startswith("new_") else node.args)
        sizes = list(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
        if name in ("full", "new_full"):
            sizes = list(sizes[0]) if isinstance(sizes[0], (tuple, list)) else sizes[:1]
        vals = [self.val(s) for s in sizes]
        counts = [i for i, v in enumerate(vals) if v.res is ROWS]
        if not counts:
            return CONST_VAL
        v = vals[counts[0]]
        if len(counts) > 1 or (v.shape_ndim is not None and len(vals) > 1):
            raise self.refuse(node, f"{name} is given more than one row count", "Give the number of rows as one "
                              "size: torch.zeros(x.size(0), 4), torch.zeros(1, x.size(0), 4).")
        return self.at(node, Val(v.rows, of=v.of), counts[0] if v.shape_ndim is None else v.axis)

    def row_slice(self, i: Any, xv: Val) -> bool:
        """Whether ``i``, indexing the rows of ``xv``, takes them all: ``:``, or ``:n`` with ``n``
        the row count of their own kind (``x[:y.size(0)]``, DGL's ``feat[:g.num_dst_nodes()]``),
        every row on any worker."""
        if i == slice(None):
            return True
        if not (xv.res is NODE and isinstance(i, slice) and i.start is None and i.step is None):
            return False
        stop = self.val(i.stop) if isinstance(i.stop, fx.Node) else None
        return (stop is not None and stop.res is ROWS and stop.rows is xv.res and stop.of == xv.of
                and stop.shape_ndim is None)

    def tuple_length(self, a: Any) -> int | None:
        """The length of ``a`` if it is a tuple of sizes the same on every worker, else None."""
        if isinstance(a, (tuple, list)):
            return None if any(isinstance(i, fx.Node) and self.val(i).res is not CONST for i in a) else len(a)
        if isinstance(a, fx.Node) and self.val(a).res is CONST and isinstance(self.seen.get(a), list):
            return len(self.seen[a])
        return None

    def getitem(self, node, x, xv, k) -> Val:
        """Indexing a per-row tensor: row-local if it takes every row (``:`` at the rows' dim)
        and indexes the other dims by constants; the rows' dim moves with the dims before it."""
        if isinstance(self.seen.get(x), list):
            return self.item(node, xv)
        idx = node.args[1]
        items = self.expanded(node, x, list(idx) if isinstance(idx, tuple) else [idx])
        d = o = 0  # the next input and output dim
        new, plain_before, tensors = None, 0, []
        for pos, i in enumerate(items):
            if i is None:
                o, plain_before = o + 1, plain_before + (new is None)
                continue
            if d == xv.axis:
                if not self.row_slice(i, xv):
                    if i is None or isinstance(i, slice) or not isinstance(i, fx.Node) or not self.val(i).per_row:
                        raise self.refuse(node, f"indexing `[{_fmt(idx)}]` picks rows of a {k.word()} value by "
                                          "position", "Rows are split across workers: select features "
                                          "(x[:, ...]), or move between nodes with the IR ops.")
                    raise self.refuse(node, f"indexing `[{_fmt(idx)}]` picks rows by a {self.val(i).word()} index",
                                      "Rows are split across workers: move between nodes with the IR ops.")
                new, d, o = o, d + 1, o + 1
                continue
            bounds = [i.start, i.stop, i.step] if isinstance(i, slice) else [i]
            if any(isinstance(b, fx.Node) and self.val(b).res is ROWS for b in bounds):
                raise self.row_count(node, "getitem")
            if isinstance(i, fx.Node) and self.val(i).per_row:
                raise self.refuse(node, "indexing a feature axis with a per-row tensor", "Use gather along dim 1.")
            if isinstance(i, (int, slice)) or (isinstance(i, fx.Node) and self.seen.get(i) in (int, bool)):
                o, plain_before = o + isinstance(i, slice), plain_before + (isinstance(i, slice) and new is None)
            else:  # positions along a feature dim: the indexed dims take their place (or go first, below)
                tensors.append(pos)
                o += self.index_ndim(node, i) if new is None else 1  # (after the rows, only their count matters)
            d += 1
        if new is None:  # the rows come after the dims indexed
            new, plain_before = o + xv.axis - d, plain_before + xv.axis - d
        apart = any(i is None or isinstance(i, slice) for i in items[tensors[0]:tensors[-1]]) if tensors else False
        if apart:  # torch puts the dims of indices that a slice separates first
            new = max(self.index_ndim(node, items[p]) for p in tensors) + plain_before
        self.same_rows(node, x, f"indexing `[{_fmt(idx)}]`", new)
        return self.at(node, k, new)

    def expanded(self, node, x, items: list) -> list:
        """``items`` of an index with ``...`` spelled out as the slices it stands for."""
        if Ellipsis not in items:
            return items
        at = items.index(Ellipsis)
        real = [i for i in items if i is not None and i is not Ellipsis]
        fill = self.ndim(node, x, "`...`") - len(real)
        return items[:at] + [slice(None)] * fill + items[at + 1:]

    def index_ndim(self, node, i: Any) -> int:
        """The number of dims a tensor (or list) of positions in an index gives."""
        if isinstance(i, (list, tuple)):
            return 1 + (self.index_ndim(node, i[0]) if i and isinstance(i[0], (list, tuple)) else 0)
        return self.ndim(node, i, "the index")

    def lookup(self, node, x, xv, k) -> Val:
        """``p[index]``: a parameter's rows looked up by a per-row index, an embedding."""
        items = self.expanded(node, x, list(node.args[1]) if isinstance(node.args[1], tuple) else [node.args[1]])
        first = items[0] if items else slice(None)
        fv = self.val(first) if isinstance(first, fx.Node) else CONST_VAL
        if fv.per_row and all(i == slice(None) for i in items[1:]):
            return k
        raise self.refuse(node, f"indexing `[{_fmt(node.args[1])}]` combines a {xv.word()} value with per-row ones",
                          "Index a parameter by one per-row index tensor (an embedding lookup) only.")

    def same_rows(self, node, x, what, new: int | None = None) -> None:
        """Refuse if the probe's shapes show that dim ``new`` of ``node`` (default: where ``x``
        has its rows) is not ``x``'s rows."""
        axis = self.val(x).axis
        new = axis if new is None else new
        a, b = self.shape(x), self.shape(node)
        if a is not None and b is not None and (len(b) <= new or b[new] != a[axis]):
            raise self.refuse(node, f"{what} turns {a} into {b}, so the rows do not stay rows",
                              "Keep the row axis whole: reshape the feature dims only.")

    def reshape(self, node, name, x, k) -> Val:
        """view / reshape / expand / repeat (and ``*_as``): row-local when the rows stay one
        dim, sized by a symbolic row count (``-1``, ``x.size(0)``), with the same dims before it."""
        xv = self.val(x)
        if name in ("view_as", "reshape_as", "expand_as"):
            other = self.val(node.args[1])
            if other.res is not k.res or other.of != k.of:
                raise self.refuse(node, f"{name} gives a {k.word()} value the shape of a {other.word()} one",
                                  "Reshape to a shape whose first size is the row count.")
            if name == "expand_as":
                return self.broadcast_to(node, name, x, self.ndim(node, node.args[1], "the shape"), other.axis, k)
            self.keeps_rows(node, x, name, other.axis)
            return self.at(node, k, other.axis)
        sizes = list(node.args[1:])
        if "size" in node.kwargs or "shape" in node.kwargs:
            sizes = [node.kwargs.get("size", node.kwargs.get("shape"))]
        if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
            sizes = list(sizes[0])
        what = f"{name}({_fmt(tuple(sizes))})"
        counts = [i for i, s in enumerate(sizes) if isinstance(s, fx.Node) and self.val(s).res is ROWS]
        if any(self.val(sizes[i]).rows is not k.res or self.val(sizes[i]).of != k.of for i in counts) or \
                len(counts) > 1 or (counts and self.val(sizes[counts[0]]).shape_ndim is not None and len(sizes) > 1):
            raise self.refuse(node, f"{what} is given another row count than that of a {k.word()} value, or more "
                              "than one", "Size the rows once, by the value's own count (-1 or x.size(0)).")
        shape = self.val(sizes[0]) if counts and self.val(sizes[counts[0]]).shape_ndim is not None else None
        if name == "repeat" or not xv.per_row:
            if not xv.per_row and name in ("expand", "repeat") and counts:  # a parameter or constant made per-row
                at = shape.axis if shape is not None else counts[0]
                return self.broadcast_to(node, name, x, shape.shape_ndim if shape is not None else len(sizes), at, k)
            if not xv.per_row:
                raise self.refuse(node, f"{what} gives a {xv.word()} value the row count of a per-row one",
                                  "Broadcast it instead (p.expand(x.size(0), -1)).")
            at = len(sizes) - self.ndim(node, x, "the dims repeat adds") + xv.axis
            if sizes[at] != 1:
                raise self.refuse(node, f"{what} repeats the rows of a {k.word()} value", "Repeat the features only "
                                  "(a count of 1 for the rows).")
            return self.at(node, k, at)
        if shape is not None:  # x.view(y.shape)
            at = shape.axis
        elif counts:
            at = counts[0]
        elif -1 in sizes and name == "expand":
            at = len(sizes) - self.ndim(node, x, "the dims expand adds") + xv.axis
        elif -1 in sizes:
            at = sizes.index(-1)
        else:
            raise self.refuse(node, f"{what} does not keep the rows of a {k.word()} value",
                              "Size the rows by -1 or x.size(0) and reshape the feature dims only.")
        if name == "expand":
            return self.broadcast_to(node, what, x, len(sizes), at, k)
        self.keeps_rows(node, x, what, at)
        return self.at(node, k, at)

    def keeps_rows(self, node, x, what, new: int) -> None:
        """Refuse a reshape that does not keep ``x``'s rows whole as dim ``new`` with the same
        number of elements before them (as the probe's shapes show)."""
        axis = self.val(x).axis
        a, b = self.shape(x), self.shape(node)
        if (axis, new) != (0, 0) and (a is None or b is None):
            self.ndim(node, None, f"where {what} puts the rows")  # (refuses: the probe gave no shapes)
        if a is not None and b is not None and (len(b) <= new or b[new] != a[axis] or
                                                math.prod(a[:axis]) != math.prod(b[:new])):
            raise self.refuse(node, f"{what} turns {a} into {b}, so the rows do not stay rows",
                              "Keep the row axis whole: reshape the feature dims only.")

    def broadcast_to(self, node, what, x, ndim: int, at: int, k: Val) -> Val:
        """``x`` expanded to ``ndim`` dims with rows on dim ``at``: ``x``'s own rows must be
        there (dims are added in front), or, for a value without rows, a dim of size 1."""
        xv, nd = self.val(x), self.ndim(node, x, f"the dims {what} adds")
        if xv.per_row and ndim - nd + xv.axis != at:
            raise self.refuse(node, f"{what} lines the rows of a {xv.word()} value up with another axis",
                              "Expand the feature dims only (-1 for the rows).")
        shape = self.shape(x)
        if not xv.per_row and at >= ndim - nd and (shape is None or shape[at - (ndim - nd)] != 1):
            raise self.refuse(node, f"{what} gives a {xv.word()} tensor of shape {shape} the rows of a {k.word()} "
                              "value along an axis it has", "Give it a dim of size 1 there, so it applies to every "
                              "row alike (p.unsqueeze(0).expand(x.size(0), -1)).")
        return self.at(node, k, at)

    def axes(self, node, name, x, k) -> Val:
        """Ops that move dims (t, transpose, permute, movedim, unsqueeze) move the rows with
        them; flatten merges dims, refused where it merges the rows with another."""
        a = self.val(x).axis
        if name == "unsqueeze":
            d = self.axis(node, x, self.arg(node, 1, "dim"), extra=1)
            return self.at(node, k, a + 1 if d <= a else a)
        if name in ("flatten", "ravel"):
            start = self.arg(node, 1, "start_dim", 0) if name == "flatten" else 0
            end = self.arg(node, 2, "end_dim", -1) if name == "flatten" else -1
            return self.flattened(node, x, start, end, k, f"`{name}`")
        nd = self.ndim(node, x, f"the axes `{name}` moves")
        order = list(range(nd))  # dim j of the result is dim order[j] of x
        if name in ("t", "T"):
            order.reverse()
        elif name in ("mT", "adjoint"):
            order[-2:] = order[:-3:-1]
        elif name in ("transpose", "swapaxes", "swapdims"):
            d0, d1 = self.axis(node, x, self.arg(node, 1, "dim0")), self.axis(node, x, self.arg(node, 2, "dim1"))
            order[d0], order[d1] = d1, d0
        elif name == "permute":
            dims = node.args[1:] if len(node.args) > 2 else self.arg(node, 1, "dims")
            order = [self.axis(node, x, d) for d in (dims if isinstance(dims, (tuple, list)) else [dims])]
        else:  # movedim / moveaxis
            src, dst = self.arg(node, 1, "source"), self.arg(node, 2, "destination")
            src = [self.axis(node, x, d) for d in (src if isinstance(src, (tuple, list)) else [src])]
            dst = [self.axis(node, x, d) for d in (dst if isinstance(dst, (tuple, list)) else [dst])]
            rest = iter(d for d in range(nd) if d not in src)
            placed = dict(zip(dst, src))
            order = [placed[j] if j in placed else next(rest) for j in range(nd)]
        return self.at(node, k, order.index(a))

    def flattened(self, node, x, start, end, k, what) -> Val:
        """Dims ``start..end`` of ``x`` merged into one: row-local unless the rows merge with a
        dim of another size than 1."""
        a, nd = self.val(x).axis, self.ndim(node, x, f"the dims {what} merges")
        s, e = (self.axis(node, x, d) % max(nd, 1) for d in (start, end))
        if s <= a <= e and s != e:
            shape = self.shape(x)
            if any(shape[d] != 1 for d in range(s, e + 1) if d != a):
                raise self.refuse(node, f"{what} merges the row axis of a {k.word()} value with other dims",
                                  "Keep rows a dim of their own: flatten the feature dims only (x.flatten(1)).")
            return self.at(node, k, s)
        return self.at(node, k, a - (e - s) if a > e else a)

    def unflattened(self, node, x, dim, count: int, k, what) -> Val:
        """Dim ``dim`` of ``x`` split into ``count`` dims: row-local unless it is the rows'."""
        a, d = self.val(x).axis, self.axis(node, x, dim)
        if d == a:
            raise self.refuse(node, f"{what} over dim {dim} picks or splits by position along the {w_axis(k)}",
                              "Split the feature dims only.")
        return self.at(node, k, a + count - 1 if d < a else a)

    def along(self, node, name, x, k) -> Val:
        pos, default = ALONG[name]
        if name in ("max", "min") and isinstance(self.arg(node, 1, "other"), fx.Node):
            return self.pointwise(node, name, k)
        if name in ("normalize", "cosine_similarity") and node.op == "call_function":
            pos = 2
        key = {"flip": "dims", "roll": "dims"}.get(name, "dim")
        dims = self.arg(node, pos, key, default)
        if name == "squeeze" and dims == "all":
            raise self.refuse(node, "squeeze() without a dim would drop the row axis of a worker with one row",
                              "Give the dim: x.squeeze(-1).")
        if name == "index_select" and not self.val(x).per_row and self.axis(node, x, dims) == 0:
            return k  # a parameter's rows looked up by a per-row index: an embedding, as param[index]
        if name in ("scatter", "scatter_add", "scatter_reduce", "gather", "index_select"):
            index = self.arg(node, 2, "index")
            if isinstance(index, fx.Node) and name == "index_select" and self.val(index).per_row:
                raise self.refuse(node, f"{name} with a per-row index", "Use gather along a feature dim.")
        if dims is None or dims == ():
            raise self.refuse(
                node, f"{name} over all elements reduces over the {w_axis(k)} of a {k.word()} value",
                "Reduce over the feature dims only (x.sum(-1)); a total over all nodes needs a collective "
                "(e.g. sc.nn.BatchNorm), which sarcompile provides for batch norm.",
            )
        if name == "unflatten":
            return self.unflattened(node, x, dims, len(self.arg(node, 2, "sizes")), k, name)
        dims = list(dims) if isinstance(dims, (tuple, list)) else [dims]
        a = self.val(x).axis
        if self.mean_of_rows(node, name, x, k, dims):
            return CONST_VAL
        if any(self.axis(node, x, d) == a for d in dims):
            raise self.refuse(
                node, f"{name} over dim {dims[0] if len(dims) == 1 else tuple(dims)} {verb(name)} the "
                f"{w_axis(k)}", "Work along the feature dims (dim=-1); to combine rows use the IR ops "
                "(spmm over edges) or a collective (sc.nn.BatchNorm).",
            )
        before = [d for d in (self.axis(node, x, d) for d in dims) if d < a]
        return replace(self.at(node, k, a - self.dropped(node, name, x, before)), seq=name in RETURNS_SEQ)

    def mean_of_rows(self, node, name, x, k, dims: list[int]) -> bool:
        """Whether ``node`` is the mean of per-node rows over their (only) row axis, dim 0: not
        row-local, but a collective computes it exactly (the ``row_reductions`` pass makes
        it ``node_mean``), so it is marked for that pass instead of refused."""
        if name != "mean" or k.res is not NODE or self.inside or self.val(x).axis != 0 or len(dims) != 1:
            return False
        if self.axis(node, x, dims[0]) != 0 or self.arg(node, 3, "dtype") is not None:
            return False
        set_info(node, reduces_rows=(x, bool(self.arg(node, 2, "keepdim", False))))
        return True

    def dropped(self, node, name, x, dims: list[int]) -> int:
        """How many of ``dims`` (before the rows) the result of reduction ``name`` lacks: all
        of them, none with ``keepdim``, for squeeze those of size 1."""
        if not dims or name not in DROPS:
            return 0
        if name in ("select", "unbind"):
            return len(dims)
        shape = self.shape(x) or self.ndim(node, None, f"the dims {name} drops")
        if name == "squeeze":
            return sum(shape[d] == 1 for d in dims)
        out = self.seen.get(node)
        out = out[0] if isinstance(out, list) and out else out
        if not isinstance(out, tuple):
            self.ndim(node, None, f"whether {name} keeps its dims")
        return len(dims) if len(out) < len(shape) else 0

    def join(self, node, name, k) -> Val:
        """cat / stack and their variants: rows stay rows when each part has them on the same
        dim and the parts are joined along another; stacking puts a new dim before or after."""
        tensors = node.args[0] if node.args else node.kwargs.get("tensors")
        parts = [self.val(t) for t in tensors]
        if any(not p.per_row for p in parts):
            raise self.refuse(node, f"{name} joins a {k.word()} value with one that is not per-row",
                              "Expand the other value per row first (p.expand(x.size(0), -1)).")
        if len({p.axis for p in parts}) > 1:
            raise self.refuse(node, f"{name} joins {k.word()} values whose rows are on different dims "
                              f"({', '.join(str(p.axis) for p in parts)})", "Move the rows to the same dim first "
                              "(.movedim(d, 0)).")
        first, a = tensors[0], parts[0].axis
        if name in ("hstack", "vstack", "dstack", "column_stack"):
            nd = self.ndim(node, first, f"the dim {name} joins along")
            # as torch: 1-D parts become columns (column_stack) or rows (vstack); dstack gives them 3 dims
            if nd == 1 and name in ("vstack", "dstack"):
                return self.at(node, k, 1)
            if name == "dstack" or (nd > 1 and name != "vstack") or name == "column_stack":
                return self.at(node, k, a)
            dim, stacked = 0, False
        else:
            dim, stacked = self.arg(node, 1, "dim", 0), name == "stack"
        d = self.axis(node, first, dim, extra=int(stacked))
        if stacked:
            return self.at(node, k, a + 1 if d <= a else a)
        if d == a:
            raise self.refuse(node, f"{name} along dim {dim} concatenates the rows of {k.word()} values",
                              "Join along the features: dim=-1 (or 1).")
        return self.at(node, k, a)

    def matmul(self, node, name, k) -> Val:
        """Products, read as einsum equations (matmul's batch dims broadcast as ``...``)."""
        if name == "einsum":
            equation, *operands = node.args
            if len(operands) == 1 and isinstance(operands[0], (tuple, list)):
                operands = list(operands[0])
            if not isinstance(equation, str):
                raise self.refuse(node, "einsum in the sublist format", "Write the equation as a string.")
            return self.contract(node, name, equation, operands, k)
        if name == "linear":
            x, w = node.args[0], self.arg(node, 1, "weight")
            return self.contract(node, name, "...k,jk->...j", [x, w], k)
        if name == "bilinear":
            x1, x2, w = node.args[0], node.args[1], self.arg(node, 2, "weight")
            return self.contract(node, name, "...i,oij,...j->...o", [x1, w, x2], k)
        a, b = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("other", node.kwargs.get("mat2"))
        na, nb = self.ndim(node, a, "the contracted axis"), self.ndim(node, b, "the contracted axis")
        left = "...ik" if na >= 2 else "k"
        right = "...kj" if nb >= 2 else "k"
        out = ("..." if max(na, nb) > 2 else "") + ("i" if na >= 2 else "") + ("j" if nb >= 2 else "")
        return self.contract(node, name, f"{left},{right}->{out}", [a, b], k)

    def contract(self, node, name, equation: str, operands: list, k) -> Val:
        """An einsum ``equation`` over ``operands``: row-local when the per-row operands have
        their rows under one subscript, which the result keeps, and the other operands have
        size 1 under it (they apply to every row alike). The result has its rows there."""
        ndims = [self.ndim(node, o, f"the subscripts of {name}'s operands") for o in operands]
        inputs, output = _subscripts(equation, ndims)
        rows = {labels[self.val(o).axis] for o, labels in zip(operands, inputs) if self.val(o).per_row}
        if len(rows) > 1:
            raise self.refuse(node, f"{name} pairs rows of {k.word()} values on different subscripts (every row of "
                              "one with every row of the other)", "Give the per-row operands the same subscript for "
                              "the rows (\"bi,bj->bij\").")
        label = rows.pop()
        if label not in output:
            raise self.refuse(node, f"{name} contracts or mixes the {w_axis(k)} of a {k.word()} value",
                              "Multiply over the features: x @ W with x [rows, in], W [in, out] (or nn.Linear); "
                              "keep the rows' subscript in the einsum's result.")
        for o, labels in zip(operands, inputs):
            v, shape = self.val(o), self.shape(o)
            if labels.count(label) > (1 if v.per_row else 0) and (v.per_row or shape is None or any(
                    shape[i] != 1 for i, s in enumerate(labels) if s == label)):
                raise self.refuse(node, f"{name} combines a {k.word()} value with a {v.word()} tensor of shape "
                                  f"{shape} along its rows", "Give the other operand size 1 (or no dim) under the "
                                  "rows' subscript, so it applies to every row alike.")
        return self.at(node, k, output.index(label))

    def addmm(self, node, k) -> Val:
        """``addmm(input, x, W)`` = ``beta * input + alpha * x @ W``: row-local for per-row
        ``x [rows, in]`` and a parameter ``W``, with ``input`` rows of the same kind or a
        vector of output features."""
        inp, a, b = (list(node.args) + [node.kwargs.get(n) for n in ("input", "mat1", "mat2")][len(node.args):])[:3]
        iv, av, bv = self.val(inp), self.val(a), self.val(b)
        rows_ok = (iv.per_row and iv.res is av.res and iv.axis == 0 and self.ndim(node, inp, "addmm's input") == 2) or (
            not iv.per_row and self.ndim(node, inp, "addmm's input") <= 1)
        if not (av.per_row and av.axis == 0 and not bv.per_row and self.ndim(node, a, "the contracted axis") == 2
                and rows_ok):
            raise self.refuse(node, f"addmm contracts or mixes the {w_axis(k)} of a {k.word()} value",
                              "Multiply over the features: addmm(b, x, W) with x [rows, in], W [in, out], b [out] "
                              "or rows like x.")
        return k

    def pointwise(self, node, name, k) -> Val:
        """Elementwise ops broadcast their operands from the right: row-local when every
        per-row operand has its rows the same number of dims from the right, and the others
        size 1 (or no dim) there. The result has its rows that far from its right."""
        out = self.shape(node)
        tensors = [a for a in node.all_input_nodes if self.val(a).res is not CONST or self.shape(a)]
        known = [self.shape(a) for a in tensors]
        if out is None and tensors and all(s is not None for s in known):  # the probe stopped here
            try:
                out = tuple(torch.broadcast_shapes(*known))
            except RuntimeError:
                out = max(known, key=len)
        if out is None:
            if all(self.val(a).per_row or self.val(a).res is CONST for a in tensors) and \
                    sum(self.val(a).per_row for a in tensors) == 1 and not any(
                        self.val(a).res is PARAM for a in tensors):
                return k  # one per-row tensor with scalars: nothing to broadcast
            self.ndim(node, None, f"how `{name}` broadcasts")
        right = None  # how many dims from the right the rows are, counting their own
        for a in tensors:
            v, s = self.val(a), self.shape(a)
            if v.per_row and s is not None:
                if right is None:
                    right = len(s) - v.axis
                elif len(s) - v.axis != right:
                    raise self.refuse(
                        node, f"`{name}` broadcasts a {v.word()} tensor of shape {s} against shape {out}, which "
                        "lines its rows up with another axis", "Give the operands their rows on the same dim and the "
                        "same number of dims after it (x.unsqueeze(-1)).",
                    )
        if right is None:
            return k
        for a in tensors:
            v, s = self.val(a), self.shape(a)
            if not v.per_row and s is not None and len(s) >= right and s[len(s) - right] != 1:
                raise self.refuse(
                    node, f"`{name}` combines a {k.word()} value with a {v.word()} tensor of shape {s} whose "
                    f"axis {len(s) - right} lines up with the rows", "Give the other operand size 1 there (or "
                    "fewer dims), so it applies to every row alike.",
                )
        return self.at(node, k, len(out) - right)


def _subscripts(equation: str, ndims: list[int]) -> tuple[list[list[str]], list[str]]:
    """The subscripts of each operand of an einsum ``equation`` (with ``ndims`` dims) and of
    its result, one per dim, ``...`` spelled out as subscripts of its own, broadcast from
    the right as torch does.

    >>> _subscripts("bij,ijk->bik", [3, 3])
    ([['b', 'i', 'j'], ['i', 'j', 'k']], ['b', 'i', 'k'])
    >>> _subscripts("...ik,kj", [3, 2])
    ([['...0', 'i', 'k'], ['k', 'j']], ['...0', 'i', 'j'])
    """
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    width = max((nd - len(t.replace("...", "")) for t, nd in zip(terms, ndims) if "..." in t), default=0)
    dots = [f"...{i}" for i in range(width)]

    def spelled(term: str, count: int) -> list[str]:
        head, has, tail = term.partition("...")
        return list(head) + (dots[width - count:] if has and count else []) + list(tail)

    inputs = [spelled(t, nd - len(t.replace("...", ""))) for t, nd in zip(terms, ndims)]
    if arrow:
        return inputs, spelled(rhs, width)
    return inputs, dots + sorted(s for s in set(lhs) if s.isalpha() and lhs.count(s) == 1)  # implicit: as torch


def _fmt(idx: Any) -> str:
    if isinstance(idx, tuple):
        return ", ".join(_fmt(i) for i in idx)
    if isinstance(idx, slice):
        parts = ["" if p is None else _fmt(p) for p in (idx.start, idx.stop, idx.step)]
        return ":".join(parts[:2]) + (f":{parts[2]}" if idx.step is not None else "")
    if idx is Ellipsis:
        return "..."
    return idx.name if isinstance(idx, fx.Node) else repr(idx)
