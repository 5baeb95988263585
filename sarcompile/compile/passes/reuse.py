"""Pass ``reuse``: an aggregation of the call's own input is kept across calls.

Contract. Expects the GraphModule after ``kernels`` (and before ``inplace``, which must
not write into a kept result). Marks every

    spmm(g, x, "sum" | "mean" | "max")        (no edge weights, no ``into``)

whose ``x`` is an input of the call -- a placeholder, or an item of one (a typed graph's
features per node type) -- with ``reuse=True``. Nothing else changes. At run time
(:mod:`sarcompile.runtime.reuse`) the op computes as before unless ``x`` is the tensor of
the last call, unchanged and needing no grad; then it returns the kept result, the same
values, without aggregating or exchanging anything: the graph and the input features of
full-batch training stay the same from step to step. Why: a model whose first layer
aggregates the raw features (SAGE or GraphConv widening the rows, GIN) spends that
layer's forward aggregation, and on N workers a fifth or so of the exchange, recomputing
one constant. ``min`` is left alone (it aggregates ``-x``, a new tensor every call), and
so is an aggregation ``linear_first`` already moved behind a linear layer.
"""

from __future__ import annotations

import operator

import torch.fx as fx

from sarcompile.ir import ops
from sarcompile.compile.passes.context import CompileOptions
from sarcompile.ir.node_info import info

__all__ = ["reuse"]


def _call_input(node: object) -> bool:
    """Whether ``node`` is an input of the call, or an item of one."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_function" and node.target is operator.getitem:
        node = node.args[0]
    # (a typed model's node table is a parameter handed in as an input: it needs its grad)
    return isinstance(node, fx.Node) and node.op == "placeholder" and info(node).table is None


def reuse(gm: fx.GraphModule, ctx: CompileOptions | None = None) -> fx.GraphModule:
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not ops.spmm:
            continue
        a = ops.registry()[ops.spmm].bind(node.args, node.kwargs)
        if a["reduce"] != "min" and a["edge_weight"] is None and a["into"] is None and _call_input(a["x"]):
            node.kwargs = {**node.kwargs, "reuse": True}
    gm.recompile()
    return gm
