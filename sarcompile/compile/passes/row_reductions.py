"""Pass ``row_reductions``: a mean over every node becomes a collective.

Contract. Expects a GraphModule after ``residency``, which marks each mean over the node
axis of per-node rows that it let through with ``info(node).reduces_rows`` (the input node,
and whether the row axis is kept, ``keepdim``). Rewrites each such node,

    x.mean(0)   torch.mean(x, dim=0)   x.mean(dim=0, keepdim=True)

as ``node_mean(x)`` (``.unsqueeze(0)`` where the axis is kept): on one machine the mean of
every row, on N workers one all-reduce of each worker's row sums and row count, with the
gradient shared back to every row (see :func:`sarcompile.ir.ops.node_mean`). The result
has no rows and is the same on every worker (``const``).

Why: a mean over all nodes is not row-local, but it is exact on N workers with a
collective, and models take it where they pool a graph into one vector: HAN's semantic
attention averages its per-node scores (``project(z).mean(0)``), readouts of a whole
graph. Every other reduction over the rows stays refused by the residency pass.
"""

from __future__ import annotations

import torch.fx as fx

from sarcompile.ir import ops
from sarcompile.ir.node_info import info, inherit, set_info
from sarcompile.ir.vocab import Residency
from sarcompile.compile.passes.context import CompileOptions

__all__ = ["row_reductions"]

# What a reduction's new nodes keep of its record, and of fx's own meta
_KEPT = ("layer", "layer_type", "user_frame")
_KEPT_FX = ("nn_module_stack",)


def row_reductions(gm: fx.GraphModule, ctx: CompileOptions | None = None) -> fx.GraphModule:
    graph = gm.graph
    marked = [n for n in graph.nodes if info(n).reduces_rows is not None]
    for node in marked:
        x, keepdim = info(node).reduces_rows
        with graph.inserting_before(node):
            new = graph.call_function(ops.node_mean, (x,))
            out = graph.call_method("unsqueeze", (new, 0)) if keepdim else new
        for n in {new, out}:
            n.meta.update({k: v for k, v in node.meta.items() if k in _KEPT_FX})
            inherit(n, node, _KEPT)
            set_info(n, residency=Residency.CONST)
        node.replace_all_uses_with(out)
        graph.erase_node(node)
    if marked:
        graph.lint()
        gm.recompile()
    return gm
