"""Pass ``accumulate``: an aggregation added to a value nobody else keeps sums into it.

Contract. Expects the GraphModule after ``linear_groups``. Where ``inplace`` wrote

    add_into(spmm(g, x, reduce, ...), root)                  (or with the two swapped)
    add_into(add_into(spmm(g, x, reduce, ...), bias), root)  (a bias between: SAGE's lin_l)

with ``spmm`` a sum, or a mean without edge weights, read by nothing but the addition,
``bias`` a parameter, and ``root`` a fresh value (a linear layer's output, an addition's,
an unweighted sum's -- also one a linear group returns) read by nothing but the addition,
it becomes

    spmm(g, x, reduce, ..., into=root)        [then add_into(., bias)]

moved to just before where the addition was. The values are the same up to rounding (the
bias is added last, and a mean is summed with ``1/deg`` per edge), and so are the
gradients: ``root``'s is the output's. What changes is the forward's memory: SAGE's
aggregate and ``lin_r(x)`` no longer live side by side, so a layer holds one ``[n, F]``
buffer fewer (``spmm`` adds every block's sums into ``root``, the local one included).
Whether ``root`` can be written into -- its shape, a view, a leaf -- is known only at run
time; ``spmm`` checks then and adds out of place when it cannot.
"""

from __future__ import annotations

import operator

import torch.fx as fx

from sarcompile.ir import ops
from sarcompile.compile.passes.context import CompileOptions
from sarcompile.compile.passes.inplace import _fresh, add_into
from sarcompile.compile.passes.linear_groups import linear_group

__all__ = ["accumulate"]


def _summing(node: fx.Node) -> bool:
    """An ``spmm`` that can add into a buffer (see :func:`sarcompile.ir.ops.spmm`)."""
    if node.op != "call_function" or node.target is not ops.spmm:
        return False
    a = ops.registry()[ops.spmm].bind(node.args, node.kwargs)
    if a["into"] is not None or a["reuse"]:  # (a kept result must stay the aggregation alone)
        return False
    return a["reduce"] == "sum" or (a["reduce"] == "mean" and a["edge_weight"] is None)


def _root(gm: fx.GraphModule, node: fx.Node) -> bool:
    """A fresh value: of a layer, or a linear group's output (not the activation it
    returns first, which the group's backward reads)."""
    if node.op == "call_function" and node.target is operator.getitem:
        group, index = node.args
        return isinstance(group, fx.Node) and group.target is linear_group and (group.args[1] == "none" or index > 0)
    return _fresh(gm, node)


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _other(add: fx.Node, node: fx.Node) -> object:
    """The argument of ``add_into(a, b)`` that is not ``node``."""
    a, b = add.args
    return b if a is node else a


def _is_add(node: fx.Node | None) -> bool:
    return node is not None and node.op == "call_function" and node.target is add_into and len(node.args) == 2


def accumulate(gm: fx.GraphModule, ctx: CompileOptions | None = None) -> fx.GraphModule:
    graph = gm.graph
    for agg in [n for n in graph.nodes if _summing(n)]:
        add = _only_user(agg)
        if not _is_add(add):
            continue
        bias = None
        if isinstance(_other(add, agg), fx.Node) and _other(add, agg).op == "get_attr" and _is_add(_only_user(add)):
            bias, add = add, _only_user(add)
        root = _other(add, bias or agg)
        if not (isinstance(root, fx.Node) and root is not agg and _only_user(root) is add and _root(gm, root)):
            continue
        # Just before the final addition, after root: agg's inputs came earlier, its readers are here
        add.prepend(agg)
        if bias is not None:
            add.prepend(bias)
        agg.kwargs = {**agg.kwargs, "into": root}
        add.replace_all_uses_with(bias or agg)
        graph.erase_node(add)
    graph.lint()
    gm.recompile()
    return gm
