"""The IR: the few sparse primitives all message passing is written with.

======================================== =========================================================
``spmm(g, x, reduce, edge_weight)``      ``out[v] = reduce over u->v of w_uv * x[u]``; reduce
                                         in sum, mean, max, min (empty neighbourhood gives 0)
``sddmm(g, a, b, op)``                   per edge u->v: ``a[u] op b[v]``; op in add, sub, mul,
                                         dot (dot sums the last dim)
``gather_src(g, x)`` / ``gather_dst``     per edge u->v: ``x[u]`` / ``x[v]`` (node rows onto edges)
``gather_table(g, t, end)``              per edge u->v: ``t[u]`` (or ``t[v]``) of a table with a
                                         row per node of the whole graph (a parameter)
``edge_reduce(g, e, reduce)``            ``out[v] = reduce over u->v of e_uv``; reduce in sum,
                                         mean, max, min, mul (empty neighbourhood gives 0, 1
                                         for mul)
``edge_reduce_src(g, e, reduce)``        ``out[u] = reduce over u->v of e_uv`` (onto sources);
                                         reduce in sum, mean; on N workers the partial
                                         results are pushed to the sources' owners
``edge_max(g, e)``                       the largest value of ``e`` over every edge (all
                                         workers): a scalar, as ``e.max()``
``node_mean(x)``                         the mean of ``x`` over every row of all workers: a
                                         value without rows, as ``x.mean(0)``
``edge_softmax(g, e)``                   softmax of per-edge scores over the in-edges of each v
``edge_subset(g, mask)``                 the graph of the edges ``mask`` keeps (PyG's
                                         ``edge_index[:, mask]``), for the ops above
``edge_dropout(g, e, p, salt)``          dropout of edge values with a mask keyed by edge id
``node_dropout(g, x, p, salt, source)``  dropout of node rows with a mask keyed by global node id
``attention(g, h, a_src, a_dst, ...)``   the fused chain sddmm(add) [+ a_edge] ->
                                         leaky_relu -> edge_softmax -> [edge_dropout] ->
                                         weighted spmm; the fuse pass produces it
``batch_norm(x, weight, bias, ...)``     batch norm over all nodes, on every worker
``message_passing(g, fn, x, e, reduce)`` ``out[v] = reduce over u->v of fn(x[u], x[v], e_uv)``
                                         for any message function ``fn`` (a module)
======================================== =========================================================

Each op is defined once, with :func:`~sarcompile.ir.opdef.ir_op`, in the module of its
family, and exported here (``sc.ops``), the one module the package and users import ops from:

==================================  ============================================================
``ir.aggregation``                  into node rows: spmm, message_passing, edge_reduce,
                                    edge_reduce_src
``ir.edge_ops``                     a value per edge: sddmm, gather_src, gather_dst,
                                    gather_table, edge_softmax, edge_subset
``ir.dropout``                      edge_dropout, node_dropout
``ir.attention``                    attention
``ir.global_ops``                   over all workers' rows: edge_max, node_mean, batch_norm
``ir.op_common``                    the argument checks they share, and running on a whole Graph
==================================  ============================================================

An op's definition holds its checks, its residency rule, what it exchanges, what it keeps
for backward and its temporaries, its label (:class:`~sarcompile.ir.opdef.OpDef`). That
also makes it a single node when traced with ``torch.fx``. The runtime registers each op's
shard implementation onto the definition and codegen its generated kernels, so these
modules import neither.

Edge tensors are in the graph's edge order: the order edges were given for a
:class:`~sarcompile.graph.graph.Graph`, shard order for a worker's ``part.graph``.
"""

from __future__ import annotations

from sarcompile.ir.aggregation import REDUCES, edge_reduce, edge_reduce_src, message_passing, spmm
from sarcompile.ir.attention import attention
from sarcompile.ir.dropout import edge_dropout, node_dropout
from sarcompile.ir.edge_ops import SDDMM_OPS, edge_softmax, edge_subset, gather_dst, gather_src, gather_table, sddmm
from sarcompile.ir.global_ops import batch_norm, edge_max, node_mean
from sarcompile.ir.opdef import OpDef, ir_op, registry

__all__ = [
    "OpDef",
    "ir_op",
    "registry",
    "spmm",
    "sddmm",
    "gather_src",
    "gather_dst",
    "gather_table",
    "edge_reduce",
    "edge_reduce_src",
    "edge_max",
    "node_mean",
    "edge_softmax",
    "edge_subset",
    "edge_dropout",
    "node_dropout",
    "attention",
    "batch_norm",
    "message_passing",
    "REDUCES",
    "SDDMM_OPS",
]

# Each op names this module, where it is imported from, as its home (numpy's set_module):
# help() and the docs point here, and a printed fx program calls it sarcompile_ir_ops_<op>
# whichever family module defines it.
for _op in (spmm, sddmm, gather_src, gather_dst, gather_table, edge_reduce, edge_reduce_src, edge_max, node_mean,
            edge_softmax, edge_subset, edge_dropout, node_dropout, attention, batch_norm, message_passing):
    _op.__module__ = __name__
