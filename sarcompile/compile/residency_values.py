"""What the residency checker knows of each value, and the questions all its rules ask.

:class:`Val` is one value's residency (per-node, per-edge, graph, ...) and where its rows
are. :class:`CheckerBase` holds the program, the example run's shapes and every value's
:class:`Val`, and answers what each rule needs: a value's :class:`Val`, its shape and
number of dims, a dim as a non-negative axis, and a refusal naming the layer and the
user's source line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx as fx

from sarcompile.compile.residency_rules import name_of
from sarcompile.compile.source_lines import source_line
from sarcompile.errors import CompileError
from sarcompile.ir.node_info import info
from sarcompile.ir.probe import Input
from sarcompile.ir.vocab import Residency

NODE, EDGE, GRAPH, PARAM, CONST, ROWS = (Residency.NODE, Residency.EDGE, Residency.GRAPH, Residency.PARAM,
                                         Residency.CONST, Residency.ROWS)


@dataclass(frozen=True)
class Val:
    """The residency of one value; ``rows`` says whose row count a ROWS value is, and
    ``ndim`` for a shape (``x.shape``) how many sizes it has; ``seq`` marks a tuple of
    per-row tensors (``x.max(1)``, ``x.split(...)``), ``parts`` a tuple whose items differ
    (an LSTM's ``(out, (h, c))``). ``of``, on a typed graph: the node type of per-node rows,
    the relation of per-edge rows and of a graph (for a ROWS value, of the rows it counts);
    None on a one-type graph. ``axis``: the dim a per-row tensor has its rows on (1 after
    ``torch.stack(xs)``), or where in a shape the row count is; ``moved``: the node that
    moved the rows off dim 0, for messages."""

    res: Residency
    rows: Residency | None = None
    shape_ndim: int | None = None
    seq: bool = False
    of: Any = None
    axis: int = 0
    moved: fx.Node | None = None
    parts: tuple[Val, ...] | None = None

    @property
    def per_row(self) -> bool:
        return self.res.per_row

    def word(self) -> str:
        base = {NODE: "per-node", EDGE: "per-edge"}.get(self.res, str(self.res))
        return base if self.of is None or not self.per_row else f"{base} ({type_name(self.of)})"


def type_name(of: Any) -> str:
    """A node type or a relation as the user wrote it: 'paper', ('author', 'writes', 'paper')."""
    return repr(of)


def end_of(rel: Any, res: Residency, source: bool) -> Any:
    """The type of an IR op's ``res`` rows on relation ``rel``: its source type (``source``)
    or destination type for node rows, the relation itself for edge rows and graphs."""
    if rel is None:
        return None
    if res is NODE:
        return rel[0] if source else rel[2]
    return rel if res in (EDGE, GRAPH) else None


CONST_VAL, PARAM_VAL, GRAPH_VAL = Val(CONST), Val(PARAM), Val(GRAPH)


def layer_of(node: fx.Node, gm: fx.GraphModule | None) -> str:
    """``layer 'conv1' (GPSConv)``: the lowered layer, else the innermost module fx was in."""
    if info(node).layer:
        return f"layer {info(node).layer!r} ({info(node).layer_type or '?'})"
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path, kind = list(stack.values())[-1]
        return f"layer {path!r} ({getattr(kind, '__name__', str(kind).rsplit('.', 1)[-1])})"
    if node.op == "call_module" and gm is not None:
        return f"layer {node.target!r} ({type(gm.get_submodule(node.target)).__name__})"
    return "the model's forward"


def shape_words(spec: Input) -> str:
    """``[rows, 32]`` for a per-row input, ``[4, 4]`` for a constant."""
    dims = [str(d) for d in spec.shape]
    if spec.residency.per_row and dims:
        dims[0] = "rows"
    return f"[{', '.join(dims)}]"


def w_axis(k: Val) -> str:
    return {NODE: "node axis", EDGE: "edge axis"}.get(k.res, "row axis")


def nodes_in(value: Any) -> list[fx.Node]:
    """The nodes in ``value`` (a node, or nested arguments)."""
    found: list[fx.Node] = []
    fx.node.map_arg(value, found.append)
    return found


def flat(v: Val) -> list[Val]:
    """``v`` and, for a tuple of differing items (an LSTM's output), each item."""
    return [v] if v.parts is None else [v, *(p for part in v.parts for p in flat(part))]


class CheckerBase:
    """The checker's state and the questions every rule asks. ``seen``: each value's shape
    from the example run (:func:`sarcompile.ir.probe.summary`), or why there is none
    (``why_no_shapes``); ``ir_args``: each IR op's recorded arguments; ``inside``: the
    message function being checked, if any; ``distributed``: the program is for N workers."""

    def __init__(self, gm: fx.GraphModule, seen: dict[fx.Node, Any] | None, why_no_shapes: str,
                 ir_args: dict | None = None, inside: str = "", distributed: bool = False):
        self.gm, self.seen, self.why = gm, seen or {}, why_no_shapes
        self.distributed = distributed
        self.ir_args = ir_args or {}
        self.inside = inside  # "the message function of ..." for a message body
        self.vals: dict[fx.Node, Val] = {}

    # -- errors ----------------------------------------------------------------------------
    def refuse(self, node: fx.Node, what: str, fix: str, why: str = "") -> CompileError:
        line = source_line(node)
        where = self.inside or layer_of(node, self.gm)
        why = why or ("On N workers each worker holds only its own rows, so this would not compute what one "
                      "machine computes.")
        return CompileError(f"{what}, in {where}{', at ' + line if line else ''}. {why} {fix}")

    def rows_first(self, node: fx.Node, value: Any, what: str) -> None:
        """Refuse ``value`` (a node, or arguments holding nodes) if a per-row tensor in it has
        its rows off dim 0: ``what`` (an IR op's argument, a layer, the output) takes them there."""
        for a in nodes_in(value):
            v = next((p for p in flat(self.vals[a]) if p.per_row and p.axis != 0), None)
            if v is None:
                continue
            moved = source_line(v.moved) if v.moved is not None else ""
            raise self.refuse(
                a if node.op == "output" else node,  # (the output's own line is the tracer's)
                f"{what} needs the {w_axis(v)} of a {v.word()} value at dim 0, but here it is at dim {v.axis}"
                f"{' (moved there at ' + moved + ')' if moved else ''}",
                f"Move the rows back first: .movedim({v.axis}, 0) or .transpose(0, {v.axis}), or reduce the dims "
                f"before them (.mean(0), .sum(0), x[0]).",
                why="Each worker holds its own rows of a per-row value, and sarcompile splits them along dim 0.",
            )

    def at(self, node: fx.Node, k: Val, axis: int) -> Val:
        """``k`` with its rows on dim ``axis`` (``node`` moved them there, if they were on 0)."""
        moved = None if axis == 0 else k.moved if k.axis != 0 and k.moved is not None else node
        return replace(k, axis=axis, moved=moved)

    # -- shapes ----------------------------------------------------------------------------
    def shape(self, a: Any) -> tuple[int, ...] | None:
        if isinstance(a, fx.Node):
            s = self.seen.get(a)
            return s if isinstance(s, tuple) else None
        if isinstance(a, torch.Tensor):
            return tuple(a.shape)
        return None

    def ndim(self, node: fx.Node, a: Any, what: str) -> int:
        s = self.shape(a)
        if s is None and self.why and self.inside == "":
            inputs = ", ".join(f"{n.target} {shape_words(info(n).input)}" for n in self.gm.graph.nodes
                               if n.op == "placeholder" and getattr(info(n).input, "shape", None) is not None)
            failed = next((n for n in self.gm.graph.nodes if n not in self.seen and n.op != "output"), node)
            line = source_line(failed)
            raise CompileError(
                f"the model fails on example inputs shaped as the call's (given: {inputs or 'no tensors'}), in "
                f"{layer_of(failed, self.gm)}{', at ' + line if line else ''}: {self.why}. Check that the inputs have "
                "the widths the model was built for (a layer's in_channels is the width of its input's last dim). "
                "If the model runs eagerly on inputs of these widths, its Python code takes another path when "
                "traced: a check such as isinstance(x, torch.Tensor) is False for a traced value; write that part "
                "without such a check"
            )
        if s is None:
            raise self.refuse(
                node, f"cannot tell which axis {what} is without the shape of its input"
                f"{' (the example run failed: ' + self.why + ')' if self.why else ''}",
                "Call the model once before inspecting its program (the compiler runs it on a small example "
                "graph to learn shapes), or write the dim as a non-negative number.",
            )
        return len(s)

    def axis(self, node: fx.Node, a: Any, dim: Any, extra: int = 0) -> int:
        """``dim`` of ``a`` as a non-negative axis (``extra`` dims added, as for unsqueeze)."""
        if not isinstance(dim, int):
            raise self.refuse(node, f"{name_of(node) or node.target} takes dim {dim!r}, which is not a constant",
                              "Give the dim as a Python int.")
        if dim >= 0:
            return dim
        return dim + self.ndim(node, a, f"dim={dim}") + extra

    # -- the walk --------------------------------------------------------------------------
    def val(self, a: Any) -> Val:
        if isinstance(a, fx.Node):
            return self.vals[a]
        if isinstance(a, (tuple, list)):
            inner = [self.val(x) for x in a]
            rows = [v for v in inner if v.per_row]
            return replace(rows[0], seq=True, parts=None) if rows else CONST_VAL
        return CONST_VAL

    def item(self, node: fx.Node, xv: Val) -> Val:
        """An item of a tuple of per-row tensors (``x.max(1).values``, ``x.split(2, 1)[0]``,
        ``lstm(x)[1]``)."""
        i = node.args[1]
        if xv.parts is not None and isinstance(i, int):
            return xv.parts[i]
        if xv.parts is not None and isinstance(i, slice):
            return replace(xv, parts=xv.parts[i])
        return replace(xv, seq=False, parts=None)

    def one_kind(self, node: fx.Node, ins: list[Val]) -> Val:
        """The rows ``node``'s per-row inputs hold (their residency and type; the rows' dim of
        the first of them), refusing inputs with rows of different kinds or types."""
        kinds = {(v.res, v.of) for v in ins if v.per_row} | {(v.rows, v.of) for v in ins if v.res is ROWS and v.rows}
        if len({res for res, _ in kinds}) > 1:
            raise self.refuse(node, f"`{name_of(node) or node.target}` combines per-node and per-edge values",
                              "Move between nodes and edges with the IR ops (sddmm gathers node rows onto "
                              "edges, spmm reduces edges into nodes).")
        if len(kinds) > 1:  # one residency, two types: row i of one type is not row i of the other
            res = next(iter(kinds))[0]
            which = " and ".join(sorted(type_name(of) for _, of in kinds))
            raise self.refuse(node, f"`{name_of(node) or node.target}` combines the rows of {which}, which are "
                              f"{'node types' if res is NODE else 'relations'} of their own: row i of one is not "
                              "row i of the other", "Move rows between types with the IR ops over a relation "
                              "(spmm(g[(src, name, dst)], x_dict[src]) gives rows of dst).")
        if not kinds:
            return CONST_VAL
        res, of = kinds.pop()
        first = next((v for v in ins if v.per_row), Val(res))
        return Val(res, of=of, axis=first.axis, moved=first.moved)

    def arg(self, node: fx.Node, pos: int, key: str, default: Any = None) -> Any:
        if len(node.args) > pos:
            return node.args[pos]
        return node.kwargs.get(key, default)

    def row_count(self, node, name) -> CompileError:
        return self.refuse(node, f"`{name}` computes with a row count (x.size(0), len(x)), which differs between "
                           "workers", "Compute per row; for a total over all nodes use a collective "
                           "(sc.nn.BatchNorm) instead.")
