"""Pass ``dropout``: every training-mode dropout of node or edge rows draws a mask keyed by id.

Contract. Expects a GraphModule after ``residency`` (every node has ``info(node).residency``,
typed rows ``info(node).rows_of``). Finds each dropout the model applies in training,

    F.dropout(x, p, training=True)   torch.dropout(x, p, True)   nn.Dropout(p) in training

whose input holds a row per node or per edge, and rewrites it as

    node_dropout(g, x, p, site_salt(salt, k))     x per-node (its rows' graph g)
    edge_dropout(g, x, p, site_salt(salt, k))     x per-edge (the graph whose edges they are)

where ``salt = dropout_stream()`` is read once per call from a
:class:`~sarcompile.nn.RandomStream` the pass adds to the module (``dropout_stream``;
it advances one step per training call) and ``k`` numbers the dropout sites in program
order. A kept entry is scaled by ``1/(1-p)``, as torch's dropout scales it.

Why: torch's dropout draws from the process's RNG row by row, so on N workers each would
drop other entries than one machine does. A mask that is a hash of (seed, step, site,
global node or edge id, position in the row) is the same wherever a row lives, so the
compiled model drops the same entries on one machine and on any number of workers, and
backward (or a rematerialising op) can draw it again instead of keeping it. The masks
are not torch's RNG stream: they differ from eager torch's draw for draw, and agree with
it in distribution (each entry kept independently with probability ``1-p``).

Dropout of a value without rows (a parameter, a pooled vector) is left to torch: every
worker computes it alike from the same RNG state. In eval mode dropout is the identity
and nothing is rewritten. A dropout inside a message function (``message_passing``) is
left to the residency pass, which refuses it on N workers.
"""

from __future__ import annotations


import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from sarcompile.errors import CompileError
from sarcompile.ir import ops
from sarcompile.ir.node_info import info, inherit, set_info
from sarcompile.ir.rng import site_salt
from sarcompile.ir.vocab import Residency
from sarcompile.nn import RandomStream
from sarcompile.compile.source_lines import source_line
from sarcompile.compile.passes.context import CompileOptions, PassContext

__all__ = ["dropout", "STREAM"]

STREAM = "dropout_stream"  # the submodule the salt is read from

# What a dropout's new nodes keep of its record, and of fx's own meta
_KEPT = ("layer", "layer_type", "user_frame", "residency", "rows_of", "row_axis")
_KEPT_FX = ("nn_module_stack",)


def _drops(gm: fx.GraphModule, node: fx.Node) -> tuple[fx.Node, float, bool] | None:
    """(input, p, inplace) if ``node`` is a dropout in training with p > 0, else None."""
    if node.op == "call_function" and node.target is F.dropout:
        args = {"p": 0.5, "training": True, "inplace": False}
        args |= dict(zip(("input", "p", "training", "inplace"), node.args)) | dict(node.kwargs)
        x, p, training, inplace = args["input"], args["p"], args["training"], args["inplace"]
    elif node.op == "call_function" and node.target is torch.dropout:
        args = dict(zip(("input", "p", "train"), node.args)) | dict(node.kwargs)
        x, p, training, inplace = args["input"], args["p"], args["train"], False
    elif node.op == "call_module" and type(gm.get_submodule(node.target)) is nn.Dropout:
        m = gm.get_submodule(node.target)
        x, p, training, inplace = (node.args[0] if node.args else node.kwargs["input"]), m.p, m.training, m.inplace
    else:
        return None
    if training is not True or not isinstance(p, (int, float)) or p == 0:
        return None  # (a traced training flag or p is left to the residency pass to judge)
    return x, float(p), inplace


def _of_rows(x: object) -> bool:
    return isinstance(x, fx.Node) and (info(x).residency or Residency.CONST).per_row


def _graphs(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder" and info(n).residency is Residency.GRAPH]


def _edge_graph(gm: fx.GraphModule, x: fx.Node) -> fx.Node | None:
    """The graph whose edges ``x``'s rows are: the nearest upstream of ``x`` of the graph
    argument of an IR op that made per-edge rows, a graph whose edge count or ids made them
    (``torch.ones(g.num_edges)``), or for per-edge inputs the graph of their relation."""
    seen, frontier = {x}, [x]
    while frontier:
        node = frontier.pop(0)
        res = info(node).residency
        if res is Residency.GRAPH:
            return node
        if res is Residency.EDGE:
            op = ops.registry().get(node.target) if node.op == "call_function" else None
            if op is not None and "g" in op.signature.parameters:
                return op.bind(node.args, node.kwargs)["g"]
            if node.op == "placeholder":
                return next((g for g in _graphs(gm) if info(g).rows_of == info(node).rows_of), None)
        for n in node.all_input_nodes:
            if n not in seen:
                seen.add(n)
                frontier.append(n)
    return None


def _node_graph(gm: fx.GraphModule, of: object) -> tuple[fx.Node, bool] | None:
    """A graph whose destination nodes (else, ``True``, whose source nodes) are the rows of
    node type ``of`` (None on a one-type graph)."""
    graphs = _graphs(gm)
    if of is None:
        return (graphs[0], False) if graphs else None
    for end, source in ((2, False), (0, True)):
        found = next((g for g in graphs if isinstance(info(g).rows_of, tuple) and info(g).rows_of[end] == of),
                     None)
        if found is not None:
            return found, source
    return None


def _refuse(node: fx.Node, what: str, fix: str) -> CompileError:
    line = source_line(node)
    return CompileError(f"{what}{', at ' + line if line else ''}. {fix}")


def dropout(gm: fx.GraphModule, ctx: CompileOptions | None = None) -> fx.GraphModule:
    """Rewrite every training-mode dropout of node or edge rows (see the module docstring).
    ``ctx.stream`` (a :class:`~sarcompile.compile.passes.context.PassContext`'s) makes the
    :class:`~sarcompile.nn.RandomStream` the salt is read from (the compiled model's own,
    kept across recompiles so the sequence of masks goes on); by default a new one seeded
    from ``torch.initial_seed()``."""
    stream = ctx.stream if isinstance(ctx, PassContext) else None
    graph = gm.graph
    # Every dropout in training is a site, numbered in program order, those of rows or not:
    # a value read as rows on one machine and as a constant on a worker shifts no other site.
    sites = [n for n in graph.nodes if _drops(gm, n) is not None]
    if not any(_of_rows(_drops(gm, n)[0]) for n in sites):
        return gm
    gm.add_submodule(STREAM, stream() if stream is not None else RandomStream(torch.initial_seed()))
    first = next(n for n in graph.nodes if n.op != "placeholder")
    with graph.inserting_before(first):
        salt = graph.call_module(STREAM)
    set_info(salt, residency=Residency.CONST)
    for k, node in enumerate(sites):
        x, p, inplace = _drops(gm, node)  # (read now: an earlier site may have been its input)
        if not _of_rows(x):
            continue
        if inplace and any(u is not node and _after(node, u) for u in x.users):
            raise _refuse(node, "an in-place dropout (inplace=True) whose input is read again after it",
                          "Use inplace=False and read the dropout's result.")
        res, of = info(x).residency, info(x).rows_of
        if res is Residency.EDGE:
            g, extra, op = _edge_graph(gm, x), (), ops.edge_dropout
        else:
            found = _node_graph(gm, of)
            g, extra, op = (found[0], (found[1],), ops.node_dropout) if found else (None, (), None)
        if g is None:
            what = f"{'per-edge' if res is Residency.EDGE else 'per-node'} rows{f' of {of!r}' if of else ''}"
            raise _refuse(node, f"dropout of {what} whose graph the compiler cannot find",
                          "Pass the graph (or the relation whose nodes they are) to the model as an argument.")
        axis = info(x).row_axis  # rows on another dim (torch.stack(hs)): moved to dim 0 and back
        with graph.inserting_before(node):
            s = graph.call_function(site_salt, (salt, k))
            rows = graph.call_method("movedim", (x, axis, 0)) if axis else x
            new = out = graph.call_function(op, (g, rows, p, s, *extra))
            if axis:
                out = graph.call_method("movedim", (new, 0, axis))
        set_info(s, residency=Residency.CONST)
        for n in {rows, new, out} - {x}:
            n.meta.update({key: v for key, v in node.meta.items() if key in _KEPT_FX})
            inherit(n, node, _KEPT)
        if axis:
            set_info(rows, row_axis=0)
            set_info(new, row_axis=0)
        node.replace_all_uses_with(out)
        graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return gm


def _after(node: fx.Node, other: fx.Node) -> bool:
    """Whether ``other`` comes after ``node`` in program order."""
    n = node.next
    while n.op != "root":
        if n is other:
            return True
        n = n.next
    return False
