"""Pass ``residency``: where every value lives, and a refusal for what would mix rows.

Contract. Expects a lowered (and fused) GraphModule, before ``partition``. Gives every
fx node ``meta["residency"]``, a :class:`~sarcompile.ir.vocab.Residency`:

* ``node`` / ``edge``: one row per node / per edge (a worker holds its own rows);
* ``graph``: the graph argument, or a graph derived from it (``g.with_self_loops()``);
* ``param``: parameters, buffers and submodules of the model;
* ``const``: values that are the same on every worker (scalars, dtypes, feature sizes);
* ``rows``: a row count (``x.size(0)``, ``x.shape``): it differs between workers.

A per-node or per-edge value whose rows are not on dim 0 (``torch.stack(xs)`` puts them on
dim 1) also gets ``meta["row_axis"]``, the dim they are on.

It guarantees that every per-node or per-edge value is computed *row-locally*: row ``i``
of a result depends only on row ``i`` of its per-row inputs. Such a program computes on
each worker's rows exactly what one machine computes on the same rows, so "compiles"
means "exact". Otherwise it raises a :class:`~sarcompile.errors.CompileError` naming the
layer, the user's source line, what mixes rows and the fix. Values are unchanged.

How residency flows:

* IR ops (:func:`sarcompile.ir.ops.registry`) declare the residency of their row arguments
  and of their result: they are where node and edge rows meet. ``message_passing``'s
  message function is traced and checked too, its inputs being per-edge rows.
* Graph values may only be passed to IR ops, to graph methods (``with_self_loops``,
  ``remove_self_loops``, ``plus_self_loops`` give a graph, ``in_degrees`` per-node values), read for
  ``num_nodes`` / ``num_edges`` / ``global_ids`` / ``edge_ids``, or given to helpers that
  declared themselves row-local (:func:`sarcompile.ir.lowering.declare`, used by the front-ends).
* The rows follow the dims they are on: ``unsqueeze``, ``stack``, ``permute``, ``transpose``,
  ``movedim``, ``.T``, indexing with ``None`` or an int before them, reductions over the dims
  before them, ``view``/``reshape`` sized by a symbolic row count (``-1``, ``x.size(0)``)
  with the same elements before it, ``einsum``/``matmul`` keeping the rows' subscript, and
  ``torch.zeros(1, x.size(0), h)`` (any factory sized by the row count, in any position) move
  them. Pointwise ops broadcast from the right, so their per-row operands must have their
  rows as many dims from the right, and the others size 1 there. IR ops, declared helpers,
  ``NodeDropout`` and the program's output take rows on dim 0: elsewhere they are refused,
  saying where the rows are and how to move them back (``.mean(0)``, ``.movedim(1, 0)``).
* Torch code keeps the residency of its per-row inputs when it is row-local: pointwise
  ops (``torch.Tag.pointwise``, and the activations) broadcasting with parameters or
  constants that do not cover the row axis; ``nn.Linear`` (rows not on the last dim),
  ``LayerNorm`` over features; RNN cells (``GRUCell``, ``LSTMCell``, ``RNNCell``) on
  ``[rows, features]``, LSTM/GRU over a sequence per row (the rows their batch, in their
  hidden states too); reductions, softmax, ``cat``, indexing along other axes; ``x[:n]``
  with ``n`` the row count of ``x``'s kind (all its rows); ``sc.nn.NodeDropout`` (masks
  keyed by node id), dropout in eval mode.
* A mean of per-node rows over their row axis (``x.mean(0)``) is let through as a value
  without rows, marked ``meta["reduces_rows"]``: the ``row_reductions`` pass makes it a
  collective.
* Refused: anything else over the row axis (reductions, softmax, sort, topk, cumsum, ``cat``
  of rows, full reductions such as ``x.sum()``), attention over rows
  (``nn.MultiheadAttention``), a matmul or einsum contracting rows or pairing the rows of
  two values (an outer product), a reshape or flatten merging rows with another dim,
  indexing or slicing rows by position (``x[0]``, ``x[1:]``, ``x[perm]``), ``.flip(0)``;
  arithmetic on row counts and ``torch.arange(rows)``; random draws per row
  (``torch.randn_like``, and on N workers ``nn.Dropout`` in training);
  using the graph as a tensor (``edge_index.flip([0])``); and any function or module the
  pass does not know to be row-local, because it cannot prove it.

Shapes. Which axis ``dim=-1`` or ``...`` is depends on the number of dims, so the pass
runs the program once on a small made-up graph (the first of :data:`sarcompile.ir.probe.PROBES`)
with inputs of the call's trailing shapes (``placeholder.meta["input"]``, an :class:`Input` the
compiler sets from the call, see :class:`sarcompile.compile.call_shape.CallShape`) and records each
value's shape; buffers, the RNG and gradients are left as they were. Without an example
(or if the probe fails) a decision that needs a shape is refused, saying so. Inputs
without ``meta["input"]`` get their residency from their name: ``g`` / ``graph`` /
``edge_index`` / ``adj_t`` / ``block`` a graph, names with ``edge`` per-edge, others
per-node.

>>> import torch, sarcompile as sc
>>> from sarcompile.compile.passes.lower import lower
>>> from sarcompile.compile.trace import trace
>>> class M(torch.nn.Module):
...     def forward(self, g, x):
...         return x + x.sum(0)
>>> residency(lower(trace(M())))
Traceback (most recent call last):
  ...
sarcompile.errors.CompileError: sum over dim 0 reduces over the node axis, ...
"""

from __future__ import annotations

import builtins
import inspect
import itertools
import math
import operator
import re
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from sarcompile.compile.passes.context import CompileOptions, PassContext
from sarcompile.errors import CompileError, SarcompileError
from sarcompile.ir.opdef import Halo, Push
from sarcompile.ir.ops import registry
from sarcompile.nn import NodeDropout, RandomStream
from sarcompile.ir.probe import PROBES, Input, example
from sarcompile.runtime.comm import offline
from sarcompile.graph.shard import DERIVED_GRAPHS
from sarcompile.compile.source_lines import source_line
from sarcompile.compile.trace import ShapeTracer
from sarcompile.ir.lowering import declared_helpers
from sarcompile.ir.vocab import Residency

__all__ = ["residency", "listing", "Input"]

NODE, EDGE, GRAPH, PARAM, CONST, ROWS = (Residency.NODE, Residency.EDGE, Residency.GRAPH, Residency.PARAM,
                                         Residency.CONST, Residency.ROWS)
GRAPH_NAMES = ("g", "graph", "edge_index", "adj", "adj_t", "block")


# -- values ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Val:
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
    parts: tuple[_Val, ...] | None = None

    @property
    def per_row(self) -> bool:
        return self.res.per_row

    def word(self) -> str:
        base = {NODE: "per-node", EDGE: "per-edge"}.get(self.res, str(self.res))
        return base if self.of is None or not self.per_row else f"{base} ({_type_name(self.of)})"


def _type_name(of: Any) -> str:
    """A node type or a relation as the user wrote it: 'paper', ('author', 'writes', 'paper')."""
    return repr(of)


def _end_of(rel: Any, res: Residency, source: bool) -> Any:
    """The type of an IR op's ``res`` rows on relation ``rel``: its source type (``source``)
    or destination type for node rows, the relation itself for edge rows and graphs."""
    if rel is None:
        return None
    if res is NODE:
        return rel[0] if source else rel[2]
    return rel if res in (EDGE, GRAPH) else None


_CONST, _PARAM, _GRAPH = _Val(CONST), _Val(PARAM), _Val(GRAPH)

# Row-preserving ops not tagged pointwise in every torch version.
_ELEMENTWISE = {
    "elu", "leaky_relu", "softplus", "hardtanh", "mish", "selu", "celu", "relu6", "threshold", "hardsigmoid",
    "hardswish", "log_sigmoid", "logsigmoid", "floor_divide", "fill", "fill_", "to", "type", "type_as", "float",
    "double", "half", "bfloat16", "long", "int", "bool", "detach", "clone", "contiguous", "requires_grad_",
    "cpu", "cuda", "relu", "sigmoid", "tanh", "gelu", "silu", "softsign", "tanhshrink", "masked_fill",
    "where", "nan_to_num", "clamp", "clamp_min", "clamp_max", "prelu", "dropout", "alpha_dropout",
    "feature_alpha_dropout",
}
# name -> (position of the dim argument, its default; None: a full reduction)
_ALONG = {
    "sum": (1, None), "mean": (1, None), "prod": (1, None), "amax": (1, ()), "amin": (1, ()), "all": (1, None),
    "any": (1, None), "argmax": (1, None), "argmin": (1, None), "logsumexp": (1, None), "std": (1, None),
    "var": (1, None), "nansum": (1, None), "nanmean": (1, None), "count_nonzero": (1, None),
    "median": (1, None), "mode": (1, -1), "norm": (2, None), "softmax": (1, None), "log_softmax": (1, None),
    "softmin": (1, None), "cumsum": (1, None), "cumprod": (1, None), "cummax": (1, None), "cummin": (1, None),
    "logcumsumexp": (1, None), "sort": (1, -1), "argsort": (1, -1), "topk": (2, -1), "kthvalue": (2, -1),
    "diff": (2, -1), "unbind": (1, 0), "chunk": (2, 0), "split": (2, 0), "tensor_split": (2, 0),
    "narrow": (1, None), "select": (1, None), "index_select": (1, None), "gather": (1, None),
    "scatter": (1, None), "scatter_add": (1, None), "scatter_reduce": (1, None), "glu": (1, -1),
    "flip": (1, None), "roll": (2, None), "normalize": (2, 1), "unflatten": (1, None), "renorm": (2, None),
    "squeeze": (1, "all"), "max": (1, None), "min": (1, None), "cosine_similarity": (2, 1),
}
# Those whose result lacks the dims they work along (without keepdim; squeeze: those of size 1).
_DROPS = {"sum", "mean", "prod", "amax", "amin", "all", "any", "argmax", "argmin", "logsumexp", "std", "var", "nansum",
          "nanmean", "count_nonzero", "median", "mode", "norm", "max", "min", "kthvalue", "select", "unbind",
          "squeeze", "cosine_similarity"}
_RETURNS_SEQ = {"max", "min", "median", "mode", "sort", "topk", "kthvalue", "unbind", "chunk", "split",
                "tensor_split", "cummax", "cummin"}
_SHAPED = {"view", "reshape", "expand", "view_as", "reshape_as", "expand_as", "repeat"}
_META = {"dim": _CONST, "ndim": _CONST, "dtype": _CONST, "device": _CONST, "is_cuda": _CONST,
         "requires_grad": _CONST, "element_size": _CONST, "is_floating_point": _CONST, "layout": _CONST}
_LIKE = {"zeros_like", "ones_like", "full_like", "empty_like"}
_RANDOM = {"rand_like", "randn_like", "randint_like", "bernoulli", "bernoulli_", "multinomial", "normal_",
           "uniform_", "rrelu", "rand", "randn", "randint", "randperm"}
_POSITIONS = {"arange", "eye", "linspace", "logspace"}  # numbers by position (refused before _RANDOM)
_FACTORIES = {"zeros", "ones", "full", "empty", "new_zeros", "new_ones", "new_full", "new_empty"}
_OPERATORS = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
    operator.floordiv: "floor_divide", operator.mod: "remainder", operator.pow: "pow", operator.neg: "neg",
    operator.pos: "positive", operator.abs: "abs", operator.invert: "bitwise_not", operator.and_: "bitwise_and",
    operator.or_: "bitwise_or", operator.xor: "bitwise_xor", operator.eq: "eq", operator.ne: "ne",
    operator.lt: "lt", operator.le: "le", operator.gt: "gt", operator.ge: "ge", operator.matmul: "matmul",
    operator.getitem: "getitem", builtins.getattr: "getattr", operator.iadd: "add", operator.imul: "mul",
    operator.isub: "sub", operator.itruediv: "div",
}
_ACTIVATIONS = (
    nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.Sigmoid, nn.Tanh, nn.SiLU, nn.Mish, nn.Softplus, nn.Hardtanh,
    nn.ReLU6, nn.SELU, nn.CELU, nn.Hardswish, nn.Hardsigmoid, nn.LogSigmoid, nn.Tanhshrink, nn.Softsign,
    nn.Identity, nn.Threshold, nn.PReLU, nn.Softshrink, nn.Hardshrink,
)
_ATTENTION = (nn.MultiheadAttention, nn.Transformer, nn.TransformerEncoder, nn.TransformerEncoderLayer,
              nn.TransformerDecoder, nn.TransformerDecoderLayer)
_ATTENTION_FIX = ("Attention over all nodes cannot be split by rows: use attention over the edges (GATConv, "
                  "sc.ops.attention), or leave the global attention out.")
_DROPOUTS = (nn.Dropout, nn.AlphaDropout, nn.FeatureAlphaDropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)
# Ops reading or writing rows by an index tensor: only the graph's own ends index rows exactly.
_BY_INDEX = frozenset({"index_select", "index_add", "index_reduce", "index_copy", "index_fill", "index_put", "gather",
                       "scatter", "scatter_add", "scatter_reduce", "take", "take_along_dim"})
_INDEX_FIX = ("Rows picked or aggregated by an index tensor (a batch vector, a permutation, node ids) live on other "
              "workers; index and aggregate by the graph's own ends instead: x[edge_index[0]], "
              "t.index_add_(0, edge_index[1], msg), t.scatter_reduce(0, edge_index[1].unsqueeze(-1).expand_as(msg), "
              "msg, 'amax', include_self=False), or PyG's scatter(msg, edge_index[1]).")
_DROPOUT_FIX = ("Use F.dropout or nn.Dropout on node or edge rows outside message functions (the compiler gives them "
                "a mask keyed by node or edge id, the same on any number of workers), e.g. on the messages' inputs or "
                "on the aggregated output.")


def _pointwise(name: str) -> bool:
    base = name[:-1] if name.endswith("_") and not name.startswith("_") else name
    if base in _ELEMENTWISE or name in _ELEMENTWISE:
        return True
    op = getattr(torch.ops.aten, base, None)
    try:
        return any(torch.Tag.pointwise in getattr(op, o).tags for o in op.overloads())
    except (AttributeError, RuntimeError, TypeError):
        return False


def _name_of(node: fx.Node) -> str | None:
    """The op a node runs, as torch names it (``add``, ``softmax``), or None if unknown."""
    if node.op == "call_method":
        return node.target
    t = node.target
    if t in _OPERATORS:
        return _OPERATORS[t]
    module = getattr(t, "__module__", None) or ""
    owner = getattr(t, "__self__", None)
    if module.startswith("torch") or owner is torch or owner is torch._C._VariableFunctions \
            or module == "torch._C._nn" or getattr(torch, getattr(t, "__name__", ""), None) is t:
        return t.__name__
    return None


def _layer(node: fx.Node, gm: fx.GraphModule | None) -> str:
    """``layer 'conv1' (GPSConv)``: the lowered layer, else the innermost module fx was in."""
    if node.meta.get("layer"):
        return f"layer {node.meta['layer']!r} ({node.meta.get('layer_type', '?')})"
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path, kind = list(stack.values())[-1]
        return f"layer {path!r} ({getattr(kind, '__name__', str(kind).rsplit('.', 1)[-1])})"
    if node.op == "call_module" and gm is not None:
        return f"layer {node.target!r} ({type(gm.get_submodule(node.target)).__name__})"
    return "the model's forward"


# -- the probe ---------------------------------------------------------------------------------

class _Recorder(fx.Interpreter):
    """Runs the program, keeping every value's shape and each message_passing's inputs."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.seen: dict[fx.Node, Any] = {}
        self.messages: dict[fx.Node, tuple] = {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        self.seen[n] = _summary(out)
        op = registry().get(n.target) if n.op == "call_function" else None
        if op is not None and "fn" in op.signature.parameters:  # message_passing: its body is probed too
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            self.messages[n] = op.bind(args, kwargs)
        return out


def _summary(v: Any) -> Any:
    """A tensor's shape, a tuple of summaries, or the type of anything else."""
    if isinstance(v, torch.Tensor):
        return tuple(v.shape)
    if isinstance(v, (tuple, list)) and not isinstance(v, torch.Size):
        return [_summary(x) for x in v]
    return type(v)


def _edge_rows(like: torch.Tensor | None, edges: int, seed: int) -> torch.Tensor | None:
    """An example like ``like`` with ``edges`` rows (None for None)."""
    if like is None:
        return None
    shape = (edges, *like.shape[1:])
    if not like.is_floating_point():
        return like.new_zeros(shape)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=like.dtype).to(like.device)


def _run_probe(gm: fx.GraphModule, inputs: list, buffers_of: nn.Module) -> tuple[_Recorder | None, str]:
    """(recorder, why it failed or '') after running ``gm`` on ``inputs``: on a failure the
    recorder has the shapes of the values computed before it. Buffers, the RNG state and
    gradients are as before."""
    saved = {k: v.clone() for k, v in buffers_of.named_buffers()}
    rec = _Recorder(gm)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]), offline():
            rec.run(*inputs)
        return rec, ""
    except CompileError:  # a front-end's check refused the call itself
        raise
    except Exception as e:  # noqa: BLE001 - best effort: the shapes up to the failure are kept
        return rec, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        with torch.no_grad():
            for k, v in buffers_of.named_buffers():
                if k in saved:
                    v.copy_(saved[k])


def _shape_words(spec: Input) -> str:
    """``[rows, 32]`` for a per-row input, ``[4, 4]`` for a constant."""
    dims = [str(d) for d in spec.shape]
    if spec.residency.per_row and dims:
        dims[0] = "rows"
    return f"[{', '.join(dims)}]"


# -- the checker -------------------------------------------------------------------------------
class _Checker:
    def __init__(self, gm: fx.GraphModule, seen: dict[fx.Node, Any] | None, why_no_shapes: str,
                 messages: dict | None = None, inside: str = "", distributed: bool = False):
        self.gm, self.seen, self.why = gm, seen or {}, why_no_shapes
        self.distributed = distributed
        self.messages = messages or {}
        self.inside = inside  # "the message function of ..." for a message body
        self.vals: dict[fx.Node, _Val] = {}

    # -- errors ----------------------------------------------------------------------------
    def refuse(self, node: fx.Node, what: str, fix: str, why: str = "") -> CompileError:
        line = source_line(node)
        where = self.inside or _layer(node, self.gm)
        why = why or ("On N workers each worker holds only its own rows, so this would not compute what one "
                      "machine computes.")
        return CompileError(f"{what}, in {where}{', at ' + line if line else ''}. {why} {fix}")

    def rows_first(self, node: fx.Node, value: Any, what: str) -> None:
        """Refuse ``value`` (a node, or arguments holding nodes) if a per-row tensor in it has
        its rows off dim 0: ``what`` (an IR op's argument, a layer, the output) takes them there."""
        for a in _nodes_in(value):
            v = next((p for p in _flat(self.vals[a]) if p.per_row and p.axis != 0), None)
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

    def at(self, node: fx.Node, k: _Val, axis: int) -> _Val:
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
            inputs = ", ".join(f"{n.target} {_shape_words(n.meta['input'])}" for n in self.gm.graph.nodes
                               if n.op == "placeholder" and getattr(n.meta.get("input"), "shape", None) is not None)
            failed = next((n for n in self.gm.graph.nodes if n not in self.seen and n.op != "output"), node)
            line = source_line(failed)
            raise CompileError(
                f"the model fails on example inputs shaped as the call's (given: {inputs or 'no tensors'}), in "
                f"{_layer(failed, self.gm)}{', at ' + line if line else ''}: {self.why}. Check that the inputs have "
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
            raise self.refuse(node, f"{_name_of(node) or node.target} takes dim {dim!r}, which is not a constant",
                              "Give the dim as a Python int.")
        if dim >= 0:
            return dim
        return dim + self.ndim(node, a, f"dim={dim}") + extra

    # -- the walk --------------------------------------------------------------------------
    def val(self, a: Any) -> _Val:
        if isinstance(a, fx.Node):
            return self.vals[a]
        if isinstance(a, (tuple, list)):
            inner = [self.val(x) for x in a]
            rows = [v for v in inner if v.per_row]
            return replace(rows[0], seq=True, parts=None) if rows else _CONST
        return _CONST

    def run(self) -> None:
        nodes = list(self.gm.graph.nodes)
        for i, node in enumerate(nodes):
            try:
                v = self.visit(node)
            except CompileError:
                self.prefer_attention(nodes[i + 1:])
                raise
            self.vals[node] = v
            node.meta["residency"] = v.res
            if v.of is not None:  # a typed graph's node type or relation
                node.meta["rows_of"] = v.of
            if v.per_row and v.axis:  # rows off dim 0 (after torch.stack(xs)): only row-local torch code reads it
                node.meta["row_axis"] = v.axis

    def item(self, node: fx.Node, xv: _Val) -> _Val:
        """An item of a tuple of per-row tensors (``x.max(1).values``, ``x.split(2, 1)[0]``,
        ``lstm(x)[1]``)."""
        i = node.args[1]
        if xv.parts is not None and isinstance(i, int):
            return xv.parts[i]
        if xv.parts is not None and isinstance(i, slice):
            return replace(xv, parts=xv.parts[i])
        return replace(xv, seq=False, parts=None)

    def prefer_attention(self, later: list[fx.Node]) -> None:
        """Code before a global attention (PyG's to_dense_batch) is refused first; name the
        attention instead, the reason the code is there."""
        for node in later:
            if node.op == "call_module" and isinstance(self.gm.get_submodule(node.target), _ATTENTION):
                raise self.refuse(node, f"{type(self.gm.get_submodule(node.target)).__name__} attends over all "
                                  "nodes (global attention), and the code preparing its input mixes rows",
                                  _ATTENTION_FIX) from None

    def visit(self, node: fx.Node) -> _Val:
        if node.op == "placeholder":
            spec = node.meta.get("input")
            if spec is not None:
                return _Val(spec.residency, of=spec.of)
            name = str(node.target)
            return _GRAPH if name in GRAPH_NAMES else _Val(EDGE if "edge" in name else NODE)
        if node.op == "get_attr":
            return _PARAM
        if node.op == "output":
            self.rows_first(node, node.args[0], "the message function's result" if self.inside else "the output")
            return self.val(node.args[0])
        if node.op == "call_function" and node.target is getattr(fx._symbolic_trace, "_assert_is_none", None):
            return _CONST  # fx's check that an input traced as None is None
        if node.op == "call_function" and node.target in registry():
            return self.ir_op(node)
        if node.op == "call_function" and node.target in declared_helpers():
            return self.declared(node)
        ins = [self.vals[n] for n in node.all_input_nodes]
        if any(v.res is GRAPH for v in ins):
            return self.graph_use(node)
        if node.op == "call_module":
            return self.module(node, ins)
        if not any(v.per_row or v.res is ROWS for v in ins):
            return _PARAM if any(v.res is PARAM for v in ins) else _CONST
        return self.torch_op(node, ins)

    # -- IR ops and declared helpers ---------------------------------------------------------
    def ir_op(self, node: fx.Node) -> _Val:
        op = registry()[node.target]
        bound = op.bind(node.args, node.kwargs)
        # On a typed graph the relation says whose rows each argument holds: what travels
        # (the halo's sends) is the source type's, the rest the destination type's.
        rel = self.val(bound["g"]).of if isinstance(bound.get("g"), fx.Node) else None
        sources = op.exchange.sends if isinstance(op.exchange, Halo) else ()
        for name, value in bound.items():
            v = self.val(value)
            if name in op.inputs:
                want = op.inputs[name]
                if value is not None and v.res is not want:
                    raise self.refuse(node, f"{op.name}'s argument {name} must be per-{want} rows, got a "
                                      f"{v.word()} value", f"Pass {op.name} a per-{want} tensor for {name}.")
                self.rows_first(node, value, f"{op.name}'s argument {name}")
                expect = _end_of(rel, want, name in sources)
                if value is not None and rel is not None and want.per_row and v.of != expect:
                    end = "source" if name in sources else "destination"
                    raise self.refuse(
                        node, f"{op.name} over relation {rel} takes the rows of {_type_name(expect)} (its {end} "
                        f"type) for {name}, but got the rows of {_type_name(v.of)}",
                        f"Pass {op.name} the {end} type's rows for {name} (x_dict[{expect!r}]), or the relation "
                        f"whose {end} type is {_type_name(v.of)}.")
            elif name == "g":
                if v.res is not GRAPH:
                    raise self.refuse(node, f"{op.name} got a {v.word()} value where it takes the graph",
                                      "Pass the graph argument (or g.with_self_loops() ...).")
            elif v.per_row or v.res in (ROWS, GRAPH):
                raise self.refuse(node, f"{op.name}'s argument {name} got a {v.word()} value",
                                  f"Only {', '.join(op.inputs)} take rows.")
            if name == "fn" and isinstance(value, fx.Node) and node.op == "call_function":
                self.message_body(node, value)
        if rel is None:  # no graph (batch_norm): the rows of its input
            return _Val(op.output, of=self.rows_of(node, op.output))
        return _Val(op.output, of=_end_of(rel, op.output, isinstance(op.exchange, Push)))

    def rows_of(self, node: fx.Node, res: Residency) -> Any:
        """The type of the ``res`` rows among ``node``'s inputs (None on a one-type graph)."""
        kinds = {self.vals[n].of for n in node.all_input_nodes if self.vals[n].res is res}
        return kinds.pop() if len(kinds) == 1 else None

    def declared(self, node: fx.Node) -> _Val:
        out = declared_helpers()[node.target]  # its author vouches for it, whatever it is given
        self.rows_first(node, (node.args, node.kwargs), getattr(node.target, "__name__", str(node.target)))
        if isinstance(out, Residency):
            return _Val(out, of=self.rows_of(node, out))
        bound = inspect.signature(node.target).bind(*node.args, **node.kwargs)
        return self.val(bound.arguments.get(out))

    def message_body(self, node: fx.Node, fn_node: fx.Node) -> None:
        """Trace the message function and check it with per-edge inputs."""
        fn = self.gm.get_submodule(fn_node.target)
        bound = registry()[node.target].bind(node.args, node.kwargs)
        where = f"the message function {type(fn).__name__} of {_layer(node, self.gm)}"
        names = list(inspect.signature(fn.forward).parameters)
        if len(names) != 3:
            raise self.refuse(node, f"{where} takes {names}, not (x_j, x_i, edge_attr)",
                              "Write the message as forward(x_j, x_i, edge_attr).")
        no_edge = bound.get("edge_attr") is None
        recorded = self.messages.get(node)
        examples = None
        if recorded is not None:  # per-edge rows of the recorded shapes, on as many edges as each probe has
            x, e = recorded["x"], recorded["edge_attr"]
            edges = [e.shape[0] if e is not None else PROBES[0].edges, PROBES[1].edges]
            examples = []
            for probe, count in zip(PROBES, edges):
                rows = _edge_rows(x, count, probe.seed)
                examples.append([rows, rows.clone(), e if probe is PROBES[0] else _edge_rows(e, count, probe.seed)])
        tracer = ShapeTracer(examples, every_value=True)
        try:
            graph = tracer.trace(fn, concrete_args={names[2]: None} if no_edge else None)
            body = fx.GraphModule(fn, graph)
        except SarcompileError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever stopped tracing: say it cannot be checked
            raise CompileError(
                f"{where} cannot be traced ({type(e).__name__}: {e}), so sarcompile cannot prove it computes each "
                "edge's message from that edge's rows alone; write it without control flow on tensor values"
            ) from None
        placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
        seen = {n: _summary(v[0]) for n, v in tracer.values.items()} if examples is not None else None
        why = "" if examples is not None else "no example run"
        for i, ph in enumerate(placeholders):  # x_j, x_i, edge_attr: one row per edge
            ph.meta["input"] = Input(CONST if (no_edge and i == 2) else EDGE)
        checker = _Checker(body, seen, why, inside=where, distributed=self.distributed)
        checker.run()
        out = checker.vals[next(n for n in body.graph.nodes if n.op == "output")]
        if out.res is not EDGE:
            raise self.refuse(node, f"{where} returns a {out.word()} value, not one message per edge",
                              "Return a tensor with one row per edge, computed from x_j, x_i and edge_attr.")

    # -- the graph ---------------------------------------------------------------------------
    def graph_use(self, node: fx.Node) -> _Val:
        first = node.args[0] if node.args else None
        others = [n for n in node.all_input_nodes if n is not first]
        if node.op == "call_method" and self.val(first).res is GRAPH:
            # a derived graph's arguments are constants (PyG's node count), the same on every worker
            if node.target in DERIVED_GRAPHS and all(self.val(n).res is CONST for n in others):
                return self.val(first)
            if node.target == "in_degrees" and len(node.args) == 1:
                return _Val(NODE, of=_end_of(self.val(first).of, NODE, False))
        if node.op == "call_function" and node.target is builtins.getattr and len(node.args) == 2:
            attr, rel = node.args[1], self.val(first).of
            dst, src = _end_of(rel, NODE, False), _end_of(rel, NODE, True)
            known = {"num_nodes": _Val(ROWS, NODE, of=dst), "num_dst": _Val(ROWS, NODE, of=dst),
                     "num_src_nodes": _Val(ROWS, NODE, of=src), "num_edges": _Val(ROWS, EDGE, of=rel),
                     "global_ids": _Val(NODE, of=dst), "src_global_ids": _Val(NODE, of=src),
                     "edge_ids": _Val(EDGE, of=rel)}
            if attr in known:
                return known[attr]
        if node.op == "call_module":
            m = self.gm.get_submodule(node.target)
            if isinstance(m, NodeDropout) and len(node.args) == 2 and self.val(node.args[0]).res is GRAPH:
                self.rows_first(node, node.args[1], "NodeDropout")
                x, rel = self.val(node.args[1]), self.val(node.args[0]).of
                want = _end_of(rel, NODE, m.source)
                if want is not None and x.of is not None and x.of != want:
                    end = "source" if m.source else "destination"
                    raise self.refuse(node, f"NodeDropout keys its mask by the ids of relation {rel}'s {end} type "
                                      f"{want!r}, but is given rows of {x.of!r}",
                                      f"Pass a relation whose {end} type is {x.of!r} (source=True: its source type).")
                return x
        what = _name_of(node) or getattr(node.target, "__name__", str(node.target))
        raise self.refuse(
            node, f"`{what}` uses the graph argument as a tensor or an object",
            "The graph (edge_index) is a sarcompile Graph split across workers: pass it only to IR ops, layers "
            "and g.with_self_loops() / g.remove_self_loops() / g.in_degrees(); reverse or change a graph when "
            "building it (sc.Graph.from_edges(dst, src, n)).",
        )

    # -- modules -----------------------------------------------------------------------------
    def module(self, node: fx.Node, ins: list[_Val]) -> _Val:
        m = self.gm.get_submodule(node.target)
        kind = type(m).__name__
        if isinstance(m, RandomStream):
            return _CONST
        rows = [v for v in ins if v.per_row]
        if not rows and not any(v.res is ROWS for v in ins):
            return _PARAM if any(v.res is PARAM for v in ins) else _CONST
        k = self.one_kind(node, ins)
        x = node.args[0] if node.args else next(iter(node.kwargs.values()), None)
        if isinstance(m, _ATTENTION):
            raise self.refuse(node, f"{kind} attends over all rows of a {k.word()} value (global attention)",
                              _ATTENTION_FIX)
        if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)):
            raise self.refuse(node, f"{kind} normalises over the rows it sees",
                              "Use sc.nn.BatchNorm (statistics across all workers, same parameters and "
                              "state_dict keys) or LayerNorm.")
        if any(v.res is ROWS for v in ins):
            raise self.refuse(node, f"{kind} is given a row count", "Do not compute with the number of rows.")
        if isinstance(m, _DROPOUTS):
            # nn.Dropout gets a mask keyed by row id (the dropout pass); the others draw theirs from torch's RNG
            if m.training and m.p > 0 and self.distributed and (type(m) is not nn.Dropout or self.inside):
                raise self.refuse(node, f"{kind}(p={m.p}) in training draws its mask from torch's RNG row by row",
                                  _DROPOUT_FIX)
            return k
        if isinstance(m, _ACTIVATIONS):
            return k
        nd = self.ndim(node, x, f"the feature axis of {kind}")
        a = self.val(x).axis
        if isinstance(m, (nn.Linear, nn.Bilinear, nn.LazyLinear)):
            if a >= nd - 1:
                raise self.refuse(node, f"{kind} contracts the last dim of a {nd}-D {k.word()} tensor, which holds "
                                  "its rows", "Give it the features on the last dim: [rows, in_features] "
                                  "(x.unsqueeze(-1)).")
            return k
        if isinstance(m, nn.RNNBase):  # e.g. JumpingKnowledge(mode="lstm"): a sequence per row
            return self.rnn(node, m, x, k, nd)
        if isinstance(m, nn.RNNCellBase):  # e.g. GatedGraphConv's GRUCell: one step per row, rows as the batch
            if nd != 2 or a != 0:
                raise self.refuse(node, f"{kind} on a {nd}-D {k.word()} tensor does not take its rows as the batch",
                                  "Give it [rows, features].")
            hx = self.arg(node, 1, "hx")
            if hx is not None and not all(self.val(h).per_row and self.val(h).axis == 0
                                          for h in (hx if isinstance(hx, tuple) else (hx,))):
                raise self.refuse(node, f"{kind}'s hidden state is not one row per {k.word()} row",
                                  "Give it a hidden state [rows, hidden] computed per row, or none.")
            return replace(k, seq=isinstance(m, nn.LSTMCell))  # LSTMCell: (h, c)
        if isinstance(m, nn.LayerNorm):
            if len(m.normalized_shape) >= nd - a:
                raise self.refuse(node, f"LayerNorm{tuple(m.normalized_shape)} normalises over the row axis too",
                                  "Normalise over the feature dims only.")
            return k
        if isinstance(m, nn.GroupNorm):
            if nd < 2 or a != 0:
                raise self.refuse(node, f"GroupNorm on a {nd}-D {k.word()} tensor with its rows on dim {a} normalises "
                                  "over rows", "Give it [rows, channels].")
            return k
        if isinstance(m, nn.Flatten):
            return self.flattened(node, x, m.start_dim, m.end_dim, k, kind)
        if isinstance(m, nn.Unflatten):
            return self.unflattened(node, x, m.dim, len(m.unflattened_size), k, kind)
        if isinstance(m, nn.Embedding):
            return k
        if isinstance(m, (nn.Softmax, nn.LogSoftmax, nn.Softmin)):
            if m.dim is None or self.axis(node, x, m.dim) == a:
                raise self.refuse(node, f"{kind}(dim={m.dim}) works along the row axis", "Give it a feature dim.")
            return k
        raise self.refuse(
            node, f"sarcompile cannot prove that {kind} is row-local (each output row computed from the same "
            "input row alone)",
            "Write it with torch operations that work per row, or as an IR op.",
        )

    def rnn(self, node: fx.Node, m: nn.RNNBase, x: fx.Node, k: _Val, nd: int) -> _Val:
        """An RNN over a sequence per row: the rows are its batch (dim 0 with ``batch_first``,
        else 1), and so are its hidden states' dim 1, given and returned."""
        kind, batch = type(m).__name__, 0 if m.batch_first else 1
        if nd != 3 or self.val(x).axis != batch:
            raise self.refuse(node, f"{kind} on a {nd}-D {k.word()} tensor with its rows on dim {self.val(x).axis} "
                              "runs its sequence along the row axis", "Give it the rows as the batch: [rows, steps, "
                              "features] with batch_first=True (or [steps, rows, features] without).")
        hx = self.arg(node, 1, "hx")
        for h in (hx if isinstance(hx, (tuple, list)) else () if hx is None else (hx,)):
            if not all(v.per_row and v.axis == 1 for v in _flat(self.val(h)) if v.parts is None):
                raise self.refuse(node, f"{kind}'s hidden state is not [layers, rows, hidden] with one row per "
                                  f"{k.word()} row", "Compute it per row, e.g. torch.zeros(layers, x.size(0), hidden) "
                                  "for batch_first input x, or give none.")
        state = self.at(node, k, 1)
        hidden = replace(state, seq=True, parts=(state, state)) if isinstance(m, nn.LSTM) else state
        out = self.at(node, k, batch)
        return replace(out, seq=True, parts=(out, hidden))  # (output, hidden state)

    # -- torch operations ----------------------------------------------------------------------
    def one_kind(self, node: fx.Node, ins: list[_Val]) -> _Val:
        """The rows ``node``'s per-row inputs hold (their residency and type; the rows' dim of
        the first of them), refusing inputs with rows of different kinds or types."""
        kinds = {(v.res, v.of) for v in ins if v.per_row} | {(v.rows, v.of) for v in ins if v.res is ROWS and v.rows}
        if len({res for res, _ in kinds}) > 1:
            raise self.refuse(node, f"`{_name_of(node) or node.target}` combines per-node and per-edge values",
                              "Move between nodes and edges with the IR ops (sddmm gathers node rows onto "
                              "edges, spmm reduces edges into nodes).")
        if len(kinds) > 1:  # one residency, two types: row i of one type is not row i of the other
            res = next(iter(kinds))[0]
            which = " and ".join(sorted(_type_name(of) for _, of in kinds))
            raise self.refuse(node, f"`{_name_of(node) or node.target}` combines the rows of {which}, which are "
                              f"{'node types' if res is NODE else 'relations'} of their own: row i of one is not "
                              "row i of the other", "Move rows between types with the IR ops over a relation "
                              "(spmm(g[(src, name, dst)], x_dict[src]) gives rows of dst).")
        if not kinds:
            return _CONST
        res, of = kinds.pop()
        first = next((v for v in ins if v.per_row), _Val(res))
        return _Val(res, of=of, axis=first.axis, moved=first.moved)

    def arg(self, node: fx.Node, pos: int, key: str, default: Any = None) -> Any:
        if len(node.args) > pos:
            return node.args[pos]
        return node.kwargs.get(key, default)

    def torch_op(self, node: fx.Node, ins: list[_Val]) -> _Val:
        name = _name_of(node)
        k = self.one_kind(node, ins)
        w = k.word()
        if name is None:
            what = getattr(node.target, "__qualname__", str(node.target))
            raise self.refuse(
                node, f"sarcompile cannot prove that {what} is row-local (it takes a {w} value, and the program "
                "calls it as one step it cannot look into)", "Write it with torch operations, and do not wrap it "
                "(torch.fx.wrap), so that its body is traced and checked.",
            )
        x = node.args[0] if node.args else None
        xv = self.val(x)
        # shapes and sizes -----------------------------------------------------------------
        if name in ("size", "shape", "numel", "nelement", "__len__", "len") or (
                name == "getattr" and node.args[1] in ("shape", "ndim", "dtype", "device", "T", "mT", "is_cuda",
                                                       "requires_grad", "data")):
            return self.meta_of(node, name, x, xv)
        if name in _META and node.op == "call_method":  # x.dim(), x.element_size(): the same on every worker
            return _META[name]
        if (xv.seq or xv.parts is not None) and name in ("getattr", "getitem"):  # x.max(1).values, x.split(2, 1)[0]
            return self.item(node, xv)
        if xv.res is ROWS and name == "getitem" and xv.shape_ndim is not None:
            return self.shape_item(node, xv)
        if name in _POSITIONS:
            raise self.refuse(node, f"`{name}` numbers the rows of a {w} value by their position on this worker",
                              "A row's position differs between workers: where the model needs a node's id, use "
                              "the graph's node ids (g.global_ids).")
        if name in _RANDOM:
            raise self.refuse(node, f"`{name}` draws random numbers for the rows of a {w} value from torch's "
                              "random number generator, which each worker runs over its own rows",
                              "For dropout use F.dropout or nn.Dropout, whose masks sarcompile keys by node id, the "
                              "same on any number of workers; draw other random numbers per row outside the model "
                              "and pass them in as an input with a row per node.")
        if name in _FACTORIES:
            return self.factory(node, name, ins, k)
        if name == "getitem" and xv.per_row:
            return self.getitem(node, x, xv, k)
        if name == "add" and len(node.args) == 2:  # x.shape + (1,) * k: a longer shape
            longer = self.longer_shape(node)
            if longer is not None:
                return longer
        if any(v.res is ROWS for v in ins) and name not in _SHAPED:
            raise self.row_count(node, name)
        if name == "getitem":
            return self.lookup(node, x, xv, k)
        if name in _SHAPED:
            return self.reshape(node, name, x, k)
        if name in _LIKE:
            return k
        if name in ("t", "T", "mT", "adjoint", "transpose", "swapaxes", "swapdims", "permute", "movedim",
                    "moveaxis", "unsqueeze", "flatten", "ravel"):
            return self.axes(node, name, x, k)
        if name in ("cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "column_stack"):
            return self.join(node, name, k)
        if name in ("matmul", "mm", "bmm", "linear", "einsum", "bilinear"):
            return self.matmul(node, name, k)
        if name == "addmm":
            return self.addmm(node, k)
        if name == "dropout" or name in ("alpha_dropout", "feature_alpha_dropout"):
            # dropout gets a mask keyed by row id (the dropout pass), but not inside a message function
            p, training = self.arg(node, 1, "p", 0.5), self.arg(node, 2, "training", True)
            if training and p and self.distributed and (name != "dropout" or self.inside):
                raise self.refuse(node, f"{name}(p={p}) in training draws its mask from torch's RNG row by row",
                                  _DROPOUT_FIX)
            return k
        if name == "layer_norm":
            shape = self.arg(node, 1, "normalized_shape")
            if len(shape) >= self.ndim(node, x, "the feature axis of layer_norm") - xv.axis:
                raise self.refuse(node, "layer_norm normalises over the row axis too", "Normalise over features.")
            return k
        if name == "embedding" and self.val(self.arg(node, 1, "weight")).per_row:
            raise self.refuse(node, f"an embedding lookup reads rows of a node table ({self.val(node.args[1]).word()}) "
                              "by index", "A worker holds only its own rows of a node table: use the table's "
                              "rows as they are (emb[t].weight), or look them up by the type's own ids "
                              "(emb[t](g[rel].global_ids) on a relation into t).")
        if name in ("embedding", "one_hot"):
            return k
        if name in _ALONG:
            return self.along(node, name, x, k)
        if name in ("to", "type_as") and isinstance(x, fx.Node):  # the other tensor gives a dtype and a device only
            return xv
        if _pointwise(name):
            return self.pointwise(node, name, k)
        raise self.refuse(
            node, f"sarcompile cannot prove that `{name}` is row-local (it takes a {w} value)",
            _INDEX_FIX if name.rstrip("_") in _BY_INDEX else "Write it with row-wise torch operations, or as an IR op.",
        )

    def meta_of(self, node, name, x, xv) -> _Val:
        if name == "getattr":
            name = node.args[1]
        if name in ("T", "mT"):
            return self.axes(node, name, x, xv)
        if name in ("ndim", "dtype", "device", "is_cuda", "requires_grad"):
            return _CONST
        if name == "data":
            return xv
        if not xv.per_row:
            return _CONST if xv.res is not PARAM else _PARAM
        if name == "size" and (len(node.args) > 1 or "dim" in node.kwargs):
            d = self.axis(node, x, self.arg(node, 1, "dim"))
            return _Val(ROWS, xv.res, of=xv.of) if d == xv.axis else _CONST
        if name in ("size", "shape"):
            return _Val(ROWS, xv.res, shape_ndim=self.ndim(node, x, "the shape"), of=xv.of, axis=xv.axis)
        if name in ("__len__", "len") and xv.axis != 0:
            return _CONST  # the size of dim 0, which is not the rows'
        return _Val(ROWS, xv.res, of=xv.of)  # numel, len

    def shape_item(self, node, xv) -> _Val:
        idx = node.args[1]
        picked = range(xv.shape_ndim)[idx]
        if isinstance(idx, int):
            return _Val(ROWS, xv.rows, of=xv.of) if picked == xv.axis else _CONST
        if xv.axis not in picked:
            return _CONST
        return _Val(ROWS, xv.rows, shape_ndim=len(picked), of=xv.of, axis=picked.index(xv.axis))

    def longer_shape(self, node) -> _Val | None:
        """``x.shape + (1,) * k`` or ``(1,) + x.shape``: a longer shape, its row count where it
        moved; None if ``node`` is not such a sum."""
        a, b = node.args
        if self.val(a).res is ROWS and self.val(a).shape_ndim is not None and self.tuple_length(b) is not None:
            return replace(self.val(a), shape_ndim=self.val(a).shape_ndim + self.tuple_length(b))
        if self.val(b).res is ROWS and self.val(b).shape_ndim is not None and self.tuple_length(a) is not None:
            extra = self.tuple_length(a)
            return replace(self.val(b), shape_ndim=self.val(b).shape_ndim + extra, axis=self.val(b).axis + extra)
        return None

    def row_count(self, node, name) -> CompileError:
        return self.refuse(node, f"`{name}` computes with a row count (x.size(0), len(x)), which differs between "
                           "workers", "Compute per row; for a total over all nodes use a collective "
                           "(sc.nn.BatchNorm) instead.")

    def factory(self, node, name, ins, k) -> _Val:
        """``torch.zeros(x.size(0), 4)``, ``torch.zeros(1, x.size(0), h)`` (an LSTM's state),
        ``x.new_ones(x.shape)``: rows of ``x``'s kind on the dim the row count sizes."""
        sizes = list(node.args[1:] if name.startswith("new_") else node.args)
        sizes = list(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
        if name in ("full", "new_full"):
            sizes = list(sizes[0]) if isinstance(sizes[0], (tuple, list)) else sizes[:1]
        vals = [self.val(s) for s in sizes]
        counts = [i for i, v in enumerate(vals) if v.res is ROWS]
        if not counts:
            return _CONST
        v = vals[counts[0]]
        if len(counts) > 1 or (v.shape_ndim is not None and len(vals) > 1):
            raise self.refuse(node, f"{name} is given more than one row count", "Give the number of rows as one "
                              "size: torch.zeros(x.size(0), 4), torch.zeros(1, x.size(0), 4).")
        return self.at(node, _Val(v.rows, of=v.of), counts[0] if v.shape_ndim is None else v.axis)

    def row_slice(self, i: Any, xv: _Val) -> bool:
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

    def getitem(self, node, x, xv, k) -> _Val:
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

    def lookup(self, node, x, xv, k) -> _Val:
        """``p[index]``: a parameter's rows looked up by a per-row index, an embedding."""
        items = self.expanded(node, x, list(node.args[1]) if isinstance(node.args[1], tuple) else [node.args[1]])
        first = items[0] if items else slice(None)
        fv = self.val(first) if isinstance(first, fx.Node) else _CONST
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

    def reshape(self, node, name, x, k) -> _Val:
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

    def broadcast_to(self, node, what, x, ndim: int, at: int, k: _Val) -> _Val:
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

    def axes(self, node, name, x, k) -> _Val:
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

    def flattened(self, node, x, start, end, k, what) -> _Val:
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

    def unflattened(self, node, x, dim, count: int, k, what) -> _Val:
        """Dim ``dim`` of ``x`` split into ``count`` dims: row-local unless it is the rows'."""
        a, d = self.val(x).axis, self.axis(node, x, dim)
        if d == a:
            raise self.refuse(node, f"{what} over dim {dim} picks or splits by position along the {w_axis(k)}",
                              "Split the feature dims only.")
        return self.at(node, k, a + count - 1 if d < a else a)

    def along(self, node, name, x, k) -> _Val:
        pos, default = _ALONG[name]
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
            return _CONST
        if any(self.axis(node, x, d) == a for d in dims):
            raise self.refuse(
                node, f"{name} over dim {dims[0] if len(dims) == 1 else tuple(dims)} {_verb(name)} the "
                f"{w_axis(k)}", "Work along the feature dims (dim=-1); to combine rows use the IR ops "
                "(spmm over edges) or a collective (sc.nn.BatchNorm).",
            )
        before = [d for d in (self.axis(node, x, d) for d in dims) if d < a]
        return replace(self.at(node, k, a - self.dropped(node, name, x, before)), seq=name in _RETURNS_SEQ)

    def mean_of_rows(self, node, name, x, k, dims: list[int]) -> bool:
        """Whether ``node`` is the mean of per-node rows over their (only) row axis, dim 0: not
        row-local, but a collective computes it exactly (the ``row_reductions`` pass makes
        it ``node_mean``), so it is marked for that pass instead of refused."""
        if name != "mean" or k.res is not NODE or self.inside or self.val(x).axis != 0 or len(dims) != 1:
            return False
        if self.axis(node, x, dims[0]) != 0 or self.arg(node, 3, "dtype") is not None:
            return False
        node.meta["reduces_rows"] = (x, bool(self.arg(node, 2, "keepdim", False)))
        return True

    def dropped(self, node, name, x, dims: list[int]) -> int:
        """How many of ``dims`` (before the rows) the result of reduction ``name`` lacks: all
        of them, none with ``keepdim``, for squeeze those of size 1."""
        if not dims or name not in _DROPS:
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

    def join(self, node, name, k) -> _Val:
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

    def matmul(self, node, name, k) -> _Val:
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

    def contract(self, node, name, equation: str, operands: list, k) -> _Val:
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

    def addmm(self, node, k) -> _Val:
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

    def pointwise(self, node, name, k) -> _Val:
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

def w_axis(k: _Val) -> str:
    return {NODE: "node axis", EDGE: "edge axis"}.get(k.res, "row axis")


def _verb(name: str) -> str:
    if name in ("sort", "argsort", "topk", "kthvalue", "flip", "roll"):
        return "reorders values along"
    if name in ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "diff"):
        return "accumulates along"
    if name in ("narrow", "select", "index_select", "gather", "scatter", "scatter_add", "scatter_reduce",
                "unbind", "chunk", "split", "tensor_split", "unflatten", "squeeze"):
        return "picks or splits by position along"
    return "reduces over"


def _nodes_in(value: Any) -> list[fx.Node]:
    """The nodes in ``value`` (a node, or nested arguments)."""
    found: list[fx.Node] = []
    fx.node.map_arg(value, found.append)
    return found


def _flat(v: _Val) -> list[_Val]:
    """``v`` and, for a tuple of differing items (an LSTM's output), each item."""
    return [v] if v.parts is None else [v, *(p for part in v.parts for p in _flat(part))]


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


# -- the pass ----------------------------------------------------------------------------------
def residency(gm: fx.GraphModule, ctx: CompileOptions | None = None) -> fx.GraphModule:
    """Give every node ``meta["residency"]``; refuse what mixes rows (see the module
    docstring). The program is unchanged. On N workers (``ctx.distributed``, a
    :class:`~sarcompile.compile.passes.context.PassContext`'s) torch's dropout
    (``nn.Dropout`` in training) is refused too: each worker would draw its own mask; on
    one machine it draws what the eager model draws."""
    distributed = isinstance(ctx, PassContext) and ctx.distributed
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    specs = [n.meta.get("input") for n in placeholders]
    missing = [str(n.target) for n, s in zip(placeholders, specs) if s is None]
    seen, messages, why = None, None, f"no example of the inputs {missing}"
    tensor = next(iter(gm.parameters()), None)
    device = tensor.device if tensor is not None else torch.device("cpu")
    if all(s is not None for s in specs):
        for choice in _choices(specs):  # the first reading of the inputs under which the program runs
            rec, failed = _run_probe(gm, [example(s, PROBES[0], device) for s in choice], gm)
            if seen is None or not failed:
                seen, messages, why = rec.seen, rec.messages, failed
                for node, spec in zip(placeholders, choice):
                    node.meta["input"] = spec
            if not failed:
                break
    try:
        _Checker(gm, seen, why, messages, distributed=distributed).run()
    except CompileError as e:
        constants = _fine_as_constants(gm, placeholders, device, distributed)
        if not constants:
            raise
        raise CompileError(
            f"{e} ({', '.join(constants)} {'was' if len(constants) == 1 else 'were'} read as rows of the graph "
            "because the row count matches this worker's part; as a tensor that is the same on every worker the "
            "model compiles: keep such a tensor in the model, as a buffer (register_buffer) or a parameter, where "
            "it is never read as rows.)"
        ) from None
    return gm


def _fine_as_constants(gm: fx.GraphModule, placeholders: list[fx.Node], device: torch.device,
                       distributed: bool) -> list[str]:
    """The inputs read as rows (their row count matched the graph's) under which reading as a
    constant instead the program runs and passes the checks: the likely cause of a refusal."""
    chosen = [n.meta["input"] for n in placeholders]
    found = []
    for i, spec in enumerate(chosen):
        if not (spec.residency.per_row and Residency.CONST in spec.alternatives):
            continue
        choice = [*chosen[:i], replace(spec, residency=Residency.CONST, alternatives=()), *chosen[i + 1:]]
        try:
            rec, failed = _run_probe(gm, [example(s, PROBES[0], device) for s in choice], gm)
        except CompileError:  # a front-end's check refuses the call so read
            continue
        if failed:
            continue
        for node, s in zip(placeholders, choice):
            node.meta["input"] = s
        try:
            _Checker(gm, rec.seen, failed, rec.messages, distributed=distributed).run()
        except CompileError:
            continue
        finally:
            for node, s in zip(placeholders, chosen):
                node.meta["input"] = s
        found.append(f"'{placeholders[i].target}' {list(spec.shape)}")
    return found


def _choices(specs: list[Input], limit: int = 8) -> list[list[Input]]:
    """Readings of the inputs: first as given, then with the alternatives of ambiguous
    ones, fewest changes first; always with some per-row input if one was given."""
    options = [[s] + [replace(s, residency=r, alternatives=()) for r in s.alternatives] for s in specs]
    readings = sorted(itertools.product(*options), key=lambda c: sum(a is not b for a, b in zip(c, specs)))
    if any(s.residency.per_row for s in specs):
        readings = [c for c in readings if any(s.residency.per_row for s in c)]
    return [list(c) for c in readings[:limit]]


def _listed(node: fx.Node) -> str | None:
    """``node``, ``node 'paper'``, ``edge ('author', 'writes', 'paper')``: a residency and its type."""
    res = node.meta.get("residency")
    if res is None or "rows_of" not in node.meta:
        return res
    return f"{res} {_type_name(node.meta['rows_of'])}"


def listing(gm: fx.GraphModule) -> str:
    """The program's code with each value's residency as a comment (``# node``)."""
    of = {n.name: _listed(n) for n in gm.graph.nodes}
    lines = []
    for line in gm.code.splitlines():
        m = re.match(r"\s*(\w+) = ", line)
        if m and of.get(m.group(1)) is not None:
            line = f"{line.split(';  ')[0]}  # {of[m.group(1)]}"
        elif line.lstrip().startswith("def forward("):
            args = [f"{n.name}: {_listed(n)}" for n in gm.graph.nodes if n.op == "placeholder"]
            line = f"{line}  # {', '.join(args)}"
        lines.append(line)
    return "\n".join(lines)
