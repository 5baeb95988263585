"""Pass ``linear_first``: transform before aggregating, where that narrows the rows.

Contract. Expects a lowered GraphModule. Finds every unweighted sum or mean aggregation
whose only user is a linear layer,

    linear(spmm(g, x, "sum" | "mean"), W, b)          (nn.Linear or F.linear)

with ``out_features <= in_features``, and rewrites it as

    spmm(g, F.linear(x, W), reduce) + b

which is the same function (both are linear in ``x``; an empty neighbourhood gives ``b``
either way), rounded differently. Why: the first form keeps the aggregate ``[n, in]``
for the weight's gradient and aggregates ``in`` columns; the second keeps nothing new
(the linear's input ``x`` is kept by whatever else reads it, e.g. SAGE's root weight),
aggregates ``out <= in`` columns and sends ``out``-wide halo rows. DGL's SAGEConv does
the same when ``in > out``. Weighted aggregations are left alone (a per-channel edge
weight would not commute with the linear), and so is a linear that widens the rows: its
aggregation would cost more than the memory it saves.
"""

from __future__ import annotations

import operator

import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from sarcompile.ir import ops
from sarcompile.compile.passes.context import CompileOptions
from sarcompile.ir.node_info import FIELDS, KEY, inherit

__all__ = ["linear_first", "linear_of"]


def linear_of(gm: fx.GraphModule, node: fx.Node, x: fx.Node) -> tuple[fx.Node | str, fx.Node | str | None, int, int] | None:
    """(weight, bias, in, out) if ``node`` is a linear layer applied to ``x`` alone; the
    weight and bias as attribute paths (modules) or the nodes given to F.linear."""
    if node.op == "call_module" and node.args == (x,) and not node.kwargs:
        module = gm.get_submodule(node.target)
        if type(module) is nn.Linear:  # a subclass may override forward
            bias = f"{node.target}.bias" if module.bias is not None else None
            return f"{node.target}.weight", bias, module.in_features, module.out_features
    if node.op == "call_function" and node.target is F.linear and node.args[:1] == (x,):
        args = dict(zip(("input", "weight", "bias"), node.args)) | dict(node.kwargs)
        weight = args.get("weight")
        if isinstance(weight, fx.Node) and weight.op == "get_attr":
            out, in_ = _attr(gm, weight.target).shape
            return weight, args.get("bias"), in_, out
    return None


def _attr(gm: fx.GraphModule, path: str):
    obj = gm
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def linear_first(gm: fx.GraphModule, ctx: CompileOptions | None = None) -> fx.GraphModule:
    graph = gm.graph
    for agg in [n for n in graph.nodes if n.op == "call_function" and n.target is ops.spmm]:
        a = ops.registry()[ops.spmm].bind(agg.args, agg.kwargs)
        if a["reduce"] not in ("sum", "mean") or a["edge_weight"] is not None or len(agg.users) != 1:
            continue
        (user,) = agg.users
        found = linear_of(gm, user, agg)
        if found is None or found[3] > found[2]:
            continue
        weight, bias, _, _ = found
        with graph.inserting_before(user):  # after everything the linear reads
            w = graph.get_attr(weight) if isinstance(weight, str) else weight
            narrowed = graph.call_function(F.linear, (a["x"], w))
            new = graph.call_function(ops.spmm, (a["g"], narrowed, *agg.args[2:]), dict(agg.kwargs))
            out = new
            if bias is not None:
                b = graph.get_attr(bias) if isinstance(bias, str) else bias
                out = graph.call_function(operator.add, (new, b))
        for n in (narrowed, new, out):
            n.meta.update({k: v for k, v in user.meta.items() if k == "nn_module_stack"})
            inherit(n, user, ("layer", "layer_type"))
        new.meta.update({k: v for k, v in agg.meta.items() if k != KEY})
        inherit(new, agg, [f for f in FIELDS if f != "example"])
        user.replace_all_uses_with(out)
        graph.erase_node(user)
        graph.erase_node(agg)
    graph.lint()
    gm.recompile()
    return gm
