"""Pass ``residency``: where every value lives, and a refusal for what would mix rows.

Contract. Expects a lowered (and fused) GraphModule, before ``partition``. Gives every
fx node ``info(node).residency``, a :class:`~sarcompile.ir.vocab.Residency`:

* ``node`` / ``edge``: one row per node / per edge (a worker holds its own rows);
* ``graph``: the graph argument, or a graph derived from it (``g.with_self_loops()``);
* ``param``: parameters, buffers and submodules of the model;
* ``const``: values that are the same on every worker (scalars, dtypes, feature sizes);
* ``rows``: a row count (``x.size(0)``, ``x.shape``): it differs between workers.

A per-node or per-edge value whose rows are not on dim 0 (``torch.stack(xs)`` puts them on
dim 1) also gets ``info(node).row_axis``, the dim they are on.

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
  without rows, marked ``info(node).reduces_rows``: the ``row_reductions`` pass makes it a
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
with inputs of the call's trailing shapes (``info(placeholder).input``, an :class:`Input` the
compiler sets from the call, see :class:`sarcompile.compile.call_shape.CallShape`) and records each
value's shape; buffers, the RNG and gradients are left as they were. Without an example
(or if the probe fails) a decision that needs a shape is refused, saying so. Inputs
without ``info(node).input`` get their residency from their name: ``g`` / ``graph`` /
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

import itertools
import re
from dataclasses import replace

import torch
import torch.fx as fx

from sarcompile.compile.example_run import run_example
from sarcompile.compile.passes.context import CompileOptions, PassContext
from sarcompile.compile.residency_check import Checker
from sarcompile.compile.residency_values import type_name
from sarcompile.errors import CompileError
from sarcompile.ir.node_info import info, set_info
from sarcompile.ir.probe import PROBES, Input, example
from sarcompile.ir.vocab import Residency

__all__ = ["residency", "listing"]


# -- the pass ----------------------------------------------------------------------------------
def residency(gm: fx.GraphModule, ctx: CompileOptions | None = None) -> fx.GraphModule:
    """Give every node ``info(node).residency``; refuse what mixes rows (see the module
    docstring). The program is unchanged. On N workers (``ctx.distributed``, a
    :class:`~sarcompile.compile.passes.context.PassContext`'s) torch's dropout
    (``nn.Dropout`` in training) is refused too: each worker would draw its own mask; on
    one machine it draws what the eager model draws."""
    distributed = isinstance(ctx, PassContext) and ctx.distributed
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    specs = [info(n).input for n in placeholders]
    missing = [str(n.target) for n, s in zip(placeholders, specs) if s is None]
    seen, ir_args, why = None, None, f"no example of the inputs {missing}"
    tensor = next(iter(gm.parameters()), None)
    device = tensor.device if tensor is not None else torch.device("cpu")
    if all(s is not None for s in specs):
        for choice in _choices(specs):  # the first reading of the inputs under which the program runs
            rec, failed = run_example(gm, [example(s, PROBES[0], device) for s in choice], gm)
            if seen is None or not failed:
                seen, ir_args, why = rec.shapes, rec.ir_args, failed
                for node, spec in zip(placeholders, choice):
                    set_info(node, input=spec)
            if not failed:
                break
    try:
        Checker(gm, seen, why, ir_args, distributed=distributed).run()
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
    chosen = [info(n).input for n in placeholders]
    found = []
    for i, spec in enumerate(chosen):
        if not (spec.residency.per_row and Residency.CONST in spec.alternatives):
            continue
        choice = [*chosen[:i], replace(spec, residency=Residency.CONST, alternatives=()), *chosen[i + 1:]]
        try:
            rec, failed = run_example(gm, [example(s, PROBES[0], device) for s in choice], gm)
        except CompileError:  # a front-end's check refuses the call so read
            continue
        if failed:
            continue
        for node, s in zip(placeholders, choice):
            set_info(node, input=s)
        try:
            Checker(gm, rec.shapes, failed, rec.ir_args, distributed=distributed).run()
        except CompileError:
            continue
        finally:
            for node, s in zip(placeholders, chosen):
                set_info(node, input=s)
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
    res = info(node).residency
    if res is None or info(node).rows_of is None:
        return res
    return f"{res} {type_name(info(node).rows_of)}"


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
