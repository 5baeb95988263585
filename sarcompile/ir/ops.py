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

Each op is defined once, here, with :func:`~sarcompile.ir.opdef.ir_op`: its checks, its
residency rule, what it exchanges, what it keeps for backward and its temporaries, its
label (:class:`~sarcompile.ir.opdef.OpDef`). That also makes it a single node when traced
with ``torch.fx``. The runtime registers each op's shard implementation onto the
definition and codegen its generated kernels, so this module imports neither.

Edge tensors are in the graph's edge order: the order edges were given for a
:class:`~sarcompile.graph.graph.Graph`, shard order for a worker's ``part.graph``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from sarcompile.errors import GraphError
from sarcompile.graph.graph import Graph
from sarcompile.ir.opdef import EDGE_CHUNK_ELEMENTS, AllReduce, Args, Halo, OpDef, Push, Temporaries, ir_op, registry, row_bytes
from sarcompile.ir.rng import edge_keep, node_keep
from sarcompile.graph.shard import ShardGraph
from sarcompile.ir.vocab import Executor, LinkPolicy, Residency, Strategy

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

REDUCES = ("sum", "mean", "max", "min")
MESSAGE_REDUCES = ("sum", "mean", "max")  # message_passing's: it keeps a winner per row for max only
SDDMM_OPS = ("add", "sub", "mul", "dot")
EDGE_REDUCES = ("sum", "mean", "max", "min", "mul")
SOURCE_REDUCES = ("sum", "mean")  # edge_reduce_src's: partial results that add up across workers

NODE, EDGE, GRAPH, CONST = Residency.NODE, Residency.EDGE, Residency.GRAPH, Residency.CONST


def _graph_kind(g: Any) -> None:
    if not isinstance(g, (Graph, ShardGraph, torch.fx.Proxy)):
        raise GraphError(
            f"the first argument of an IR op must be a sarcompile Graph or a worker's part.graph, "
            f"got {type(g).__name__}; build one with sc.Graph.from_edges / from_pyg / from_networkx"
        )


def _check_rows(g, t: torch.Tensor, what: str, rows: int) -> None:
    if t.shape[0] != rows:
        raise GraphError(f"{what} has {t.shape[0]} rows but the graph needs {rows}")


def _one_node_set(g, op: str) -> None:
    """Ops whose message reads both ends' rows from one tensor need one node set."""
    if getattr(g, "bipartite", False):
        raise GraphError(f"{op} reads source and destination rows from one tensor, so it needs one node set, but "
                         "this graph is a relation between two node types; use spmm / sddmm / attention, which take "
                         "the two ends' rows separately")


def _single(g: Graph) -> ShardGraph:
    """``g`` as a one-worker shard (made once per graph), so one machine runs the code N do."""
    if "_shard" not in g.__dict__:
        g.__dict__["_shard"] = ShardGraph.single(g)
    return g.__dict__["_shard"]


def _to_csr_order(g: Graph, t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t[g.csr_perm]


def _from_csr_order(g: Graph, t: torch.Tensor) -> torch.Tensor:
    return t[g.csr_inverse_perm]


def _heads(a: torch.Tensor) -> int:
    return a.shape[1] if a.dim() == 2 else 1


# ---------------------------------------------------------------------------------- spmm
def _check_spmm(g, x, reduce, edge_weight, into=None) -> None:
    _graph_kind(g)
    if reduce not in REDUCES:
        raise GraphError(f"spmm reduce must be one of {REDUCES}, got {reduce!r}")
    if reduce in ("max", "min") and edge_weight is not None:
        raise GraphError(f"spmm(reduce={reduce!r}) takes no edge_weight; scale the features before it instead")
    if into is not None and not (reduce == "sum" or (reduce == "mean" and edge_weight is None)):
        raise GraphError(f"spmm(into=...) adds sums or unweighted means, not reduce={reduce!r}"
                         f"{' with an edge_weight' if edge_weight is not None else ''}; add the result instead")


def _spmm_temporaries(a: Args, row: int) -> Temporaries:
    # Calibrated against measurement with benchmarks/scaling.py (20k nodes, SAGE and GAT,
    # 1 to 4 workers), then benchmarks/vs_dgl.py (100k nodes; the local block's result now
    # is the gradient buffer, and the mean's 1/deg no copy of it): the gradient arriving
    # and the input's gradient -- the layer around it writes its own into that one (a
    # donated buffer, passes/linear_groups), and forward adds into the root linear's
    # output (passes/accumulate): a SAGE step's live peak is then in backward with two
    # [n, F] buffers beside the saved ones; per edge the sparse CSR values, forward and
    # transposed.
    x, w = a["x"], a["edge_weight"]
    chunks = 3 * EDGE_CHUNK_ELEMENTS * x.element_size() if w is not None and w.requires_grad else 0
    if a["reduce"] in ("max", "min"):  # messages, candidate rows (int64) and their index
        negated = 2 if a["reduce"] == "min" else 0  # min is -max(-x): -x and the result
        return Temporaries(5 + negated, row + 2 * 8 * (row // x.element_size()), chunks)
    return Temporaries(2, 2 * x.element_size(), chunks)


@ir_op(
    check=_check_spmm,
    output=NODE,
    inputs={"x": NODE, "edge_weight": EDGE},
    exchange=Halo(
        sends=("x",),
        reads_remote_in_backward=lambda a, wants: "edge_weight" in wants,  # dw_e = <g[v], x[u]>
        pushes_gradients=lambda a, wants: "x" in wants,
    ),
    label=lambda a: f"spmm({a['reduce']})",
    saved=lambda a: f"arg{a['reduce']} [n, F] int64" if a["reduce"] in ("max", "min") else "inputs (references)",
    temporaries=_spmm_temporaries,
)
def spmm(
    g,
    x: torch.Tensor,
    reduce: str = "sum",
    edge_weight: torch.Tensor | None = None,
    *,
    strategy: Strategy = Strategy.REMAT,
    in_flight: int = 1,
    executor: Executor = Executor.AUTO,
    comm: LinkPolicy | None = None,
    into: torch.Tensor | None = None,
    reuse: bool = False,
) -> torch.Tensor:
    """Aggregate ``x`` over in-edges: ``out[v] = reduce_{u->v} w_uv * x[u]``.

    ``min`` is ``-max(-x)``, exactly (negation rounds nothing): the winner, hence the
    gradient, is the smallest value, ties going to the smallest global id as for max.

    ``into`` (sum, or mean without weights): the result is ``into + out``, written into
    ``into`` when it is a contiguous tensor of the result's shape and dtype that autograd
    lets be modified (not a view, not a leaf that requires grad), else a new tensor --
    use the returned value. A layer's ``aggregate + root`` then needs no buffer for the
    aggregate (the pass ``accumulate`` writes it so); a mean is then summed with weights
    ``1/deg`` per edge, which rounds differently from dividing the sum.

    ``reuse`` (without ``into`` and edge weights; the pass ``reuse`` sets it where ``x`` is
    an input of the call): keep the result and return it again while ``x`` is the same
    tensor, unchanged, and requires no grad (see :mod:`sarcompile.runtime.reuse`) -- the
    same values, with no aggregation and no exchange.

    Example:

    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> sc.spmm(g, torch.tensor([[1.], [2.], [4.]]), "sum")   # node 1 gets 1 (from 0) + 4 (from 2)
    tensor([[4.],
            [5.],
            [2.]])
    """
    if reduce == "min":
        return -spmm(g, -x, "max", strategy=strategy, in_flight=in_flight, executor=executor, comm=comm)
    _check_rows(g, x, "x", g.num_src_nodes)
    if edge_weight is not None:
        _check_rows(g, edge_weight, "edge_weight", g.num_edges)
    if isinstance(g, Graph):
        return spmm.definition.run(_single(g), x, reduce, _to_csr_order(g, edge_weight), executor=executor, into=into,
                                   reuse=reuse)
    return spmm.definition.run(g, x, reduce, edge_weight, strategy=strategy, in_flight=in_flight, executor=executor,
                               comm=comm, into=into, reuse=reuse)


# --------------------------------------------------------------------------------- sddmm
def _check_sddmm(g, a, b, op) -> None:
    _graph_kind(g)
    if op not in SDDMM_OPS:
        raise GraphError(f"sddmm op must be one of {SDDMM_OPS}, got {op!r}")


@ir_op(
    check=_check_sddmm,
    output=EDGE,
    inputs={"a": NODE, "b": NODE},
    exchange=Halo(
        sends=("a",),
        # d(a*b)/db reads a[u]; add and sub do not
        reads_remote_in_backward=lambda a, wants: a["op"] in ("mul", "dot") and "b" in wants,
        pushes_gradients=lambda a, wants: "a" in wants,
    ),
    label=lambda a: f"sddmm({a['op']})",
    saved=lambda a: "inputs (references)",
    temporaries=lambda a, row: Temporaries(2, 2 * row),  # the output and its gradient
)
def sddmm(
    g,
    a: torch.Tensor,
    b: torch.Tensor,
    op: str = "add",
    *,
    strategy: Strategy = Strategy.REMAT,
    in_flight: int = 1,
    comm: LinkPolicy | None = None,
) -> torch.Tensor:
    """One value per edge u->v from ``a[u]`` and ``b[v]``.

    Example:

    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> v = torch.tensor([[1.], [2.], [4.]])
    >>> sc.sddmm(g, v, v, "add")   # per edge u->v, in the graph's edge order
    tensor([[3.],
            [6.],
            [5.],
            [6.]])
    """
    _check_rows(g, a, "a", g.num_src_nodes)
    _check_rows(g, b, "b", g.num_nodes)
    if isinstance(g, Graph):
        return _from_csr_order(g, sddmm.definition.run(_single(g), a, b, op))
    return sddmm.definition.run(g, a, b, op, strategy=strategy, in_flight=in_flight, comm=comm)


# ------------------------------------------------------------------ gather, edge_reduce
def _check_graph(g, **_inputs) -> None:
    """The check of an op whose inputs' rows are checked where it is called (or need none):
    ``g`` is a graph."""
    _graph_kind(g)


@ir_op(
    check=_check_graph,
    output=EDGE,
    inputs={"x": NODE},
    # sddmm's exchange with only a source side: backward sends gradients, reads nothing
    exchange=Halo(
        sends=("x",),
        reads_remote_in_backward=lambda a, wants: False,
        pushes_gradients=lambda a, wants: "x" in wants,
    ),
    saved=lambda a: "nothing",
    temporaries=lambda a, row: Temporaries(1, 2 * row),  # the gathered rows and their gradient
)
def gather_src(
    g, x: torch.Tensor, *, strategy: Strategy = Strategy.REMAT, in_flight: int = 1, comm: LinkPolicy | None = None
) -> torch.Tensor:
    """``x[u]`` for every edge u->v, the way a message function reads its source rows
    (PyG's ``x_j``). On a worker, remote sources arrive through the halo exchange; the
    result is a per-edge tensor, so it costs ``E x F`` where the fused ops cost nothing
    per edge: the front-ends use it only for messages the fused ops cannot express."""
    _check_rows(g, x, "x", g.num_src_nodes)
    if isinstance(g, Graph):
        return _from_csr_order(g, gather_src.definition.run(_single(g), x))
    return gather_src.definition.run(g, x, strategy=strategy, in_flight=in_flight, comm=comm)


@ir_op(check=_check_graph, output=EDGE, inputs={"x": NODE})
def gather_dst(g, x: torch.Tensor) -> torch.Tensor:
    """``x[v]`` for every edge u->v (PyG's ``x_i``): local, every in-edge of a node lives
    on its worker."""
    _check_rows(g, x, "x", g.num_nodes)
    return x.index_select(0, g.dst_index.to(x.device))


def _check_gather_table(g, table, end) -> None:
    _graph_kind(g)
    if end not in ("src", "dst"):
        raise GraphError(f"gather_table end must be 'src' or 'dst', got {end!r}")


@ir_op(check=_check_gather_table, output=EDGE, inputs={"table": Residency.PARAM})
def gather_table(g, table: torch.Tensor, end: str = "src") -> torch.Tensor:
    """``table[u]`` (``end="src"``) or ``table[v]`` for every edge u->v, where ``table`` has
    one row per node of the *whole* graph, by global id, and every worker holds all of it
    (a parameter, like LINKX's node embedding). Local: nothing crosses workers; each
    worker's gradient holds its edges' share, and summing the parameter gradients over
    workers, as data-parallel training does, gives one machine's."""
    _one_node_set(g, "gather_table")
    total = g.num_nodes if isinstance(g, Graph) else g.num_global_nodes
    probe = getattr(g, "is_probe", False) and table.shape[0] > 0  # a shape probe: any table size will do
    if table.shape[0] != total and not probe:
        raise GraphError(
            f"gather_table's table has {table.shape[0]} rows but the graph has {total} nodes: it takes one row per "
            "node of the whole graph"
        )
    if isinstance(g, Graph):
        ids = g.src if end == "src" else g.dst
    elif end == "dst":
        ids = g.global_ids[g.dst_index]
    else:
        ids = torch.cat([b.src_gids[b.col] for b in g.blocks])
    return table.index_select(0, (ids % table.shape[0] if probe else ids).to(table.device))


def _check_edge_reduce(g, e, reduce, dim) -> None:
    _graph_kind(g)
    if reduce not in EDGE_REDUCES:
        raise GraphError(f"edge_reduce reduce must be one of {EDGE_REDUCES}, got {reduce!r}")


@ir_op(check=_check_edge_reduce, output=NODE, inputs={"e": EDGE})
def edge_reduce(g, e: torch.Tensor, reduce: str = "sum", dim: int = 0) -> torch.Tensor:
    """Reduce per-edge values into their destinations: ``out[v] = reduce_{u->v} e_uv``,
    local (every in-edge of a node lives on its worker). Computed as
    ``torch_geometric.utils.scatter`` does -- the same torch reductions, so ties, empty
    rows (0; 1 for mul) and gradients agree with it. ``dim`` is the edge axis, given as
    PyG aggregations give it (``node_dim``, often -2): it must name axis 0."""
    if e.dim() == 0 or dim % e.dim() != 0:
        raise GraphError(
            f"edge_reduce aggregates over axis 0 (one row per edge), got dim={dim} for a tensor of shape "
            f"{tuple(e.shape)}; PyG layers with messages of another layout (node_dim) are not supported yet"
        )
    _check_rows(g, e, "e", g.num_edges)
    dst = g.dst_index.to(e.device)
    shape = (g.num_dst, *e.shape[1:])
    idx = dst.reshape(-1, *([1] * (e.dim() - 1))).expand_as(e)
    if reduce in ("sum", "mean"):
        out = e.new_zeros(shape).scatter_add_(0, idx, e)
        if reduce == "mean":
            count = e.new_zeros(g.num_dst).scatter_add_(0, dst, e.new_ones(e.shape[0])).clamp(min=1)
            out = out / count.reshape(-1, *([1] * (e.dim() - 1)))
        return out
    if reduce == "mul":
        return e.new_ones(shape).scatter_reduce_(0, idx, e, reduce="prod", include_self=True)
    return e.new_zeros(shape).scatter_reduce_(0, idx, e, reduce=f"a{reduce}", include_self=False)


def _check_edge_reduce_src(g, e, reduce) -> None:
    _graph_kind(g)
    if reduce not in SOURCE_REDUCES:
        raise GraphError(
            f"edge_reduce_src reduce must be one of {SOURCE_REDUCES}, got {reduce!r}: a node's out-edges live on "
            "other workers, which send partial sums"
        )


@ir_op(
    check=_check_edge_reduce_src,
    output=NODE,
    inputs={"e": EDGE},
    exchange=Push(of="e"),
    label=lambda a: f"edge_reduce_src({a['reduce']})",
    saved=lambda a: "out-degrees [n]" if a["reduce"] == "mean" else "nothing",
    temporaries=lambda a, row: Temporaries(2, 0),  # the result and a block's partial sums
)
def edge_reduce_src(g, e: torch.Tensor, reduce: str = "sum", *, strategy: Strategy = Strategy.PUSH) -> torch.Tensor:
    """Reduce per-edge values into their *sources*: ``out[u] = reduce_{u->v} e_uv`` (PyG's
    ``scatter(e, edge_index[0])``); an empty neighbourhood gives 0, mean divides by the
    out-degree. A node's out-edges live on the workers of their destinations: each
    worker sums the values of its edges per halo row and pushes the sums to the rows'
    owners; backward fetches the gradient's halo rows (``gather_src``'s exchange, reversed)."""
    _check_rows(g, e, "e", g.num_edges)
    if isinstance(g, Graph):
        return edge_reduce_src.definition.run(_single(g), _to_csr_order(g, e), reduce)
    return edge_reduce_src.definition.run(g, e, reduce)


@ir_op(
    check=_check_graph,
    output=CONST,
    inputs={"e": EDGE},
    # the maximum, then the number of edges that reach it (gradients are split among them);
    # in backward the gradient arriving at the maximum, summed over the workers
    exchange=AllReduce(lambda a: (a["e"].element_size() + 8, 8 if a["e"].requires_grad else 0)),
    saved=lambda a: "where the maximum is [E] bool",
)
def edge_max(g, e: torch.Tensor, *, strategy: Strategy = Strategy.LOCAL) -> torch.Tensor:
    """The largest element of the per-edge tensor ``e`` over the edges of all workers, as
    ``e.max()`` on one machine: a 0-dim tensor, the same on every worker. Its gradient is
    split evenly among the elements equal to it, wherever they live, as torch splits it."""
    _check_rows(g, e, "e", g.num_edges)
    if isinstance(g, Graph):
        return e.max()
    return edge_max.definition.run(e)


def _check_node_mean(x) -> None:
    """No constant arguments to check (that ``x`` is per-node rows, the residency pass checks)."""


@ir_op(
    check=_check_node_mean,
    output=CONST,
    inputs={"x": NODE},
    # the sums of a row and the row count, in float64; in backward the gradient's sum
    exchange=AllReduce(lambda a: ((math.prod(a["x"].shape[1:]) + 1) * 8,
                                  math.prod(a["x"].shape[1:]) * 8 if a["x"].requires_grad else 0)),
    saved=lambda a: "row count",
)
def node_mean(x: torch.Tensor, *, strategy: Strategy = Strategy.LOCAL) -> torch.Tensor:
    """The mean of ``x`` over its rows -- every node of its type, on all workers -- as
    ``x.mean(0)`` on one machine (0 where there are no rows at all): a value without rows,
    the same on every worker (PyG's HANConv averages its semantic attention scores so).

    Summed in float64 (on N workers all-reduced with the row count), so the result hardly
    depends on how the nodes are split; on N workers backward all-reduces the gradient
    arriving (each worker's loss reaches the mean from its own rows only), then gives
    every row its share."""
    if strategy == Strategy.LOCAL:
        return (x.double().sum(0) / max(x.shape[0], 1)).to(x.dtype)
    return node_mean.definition.run(x)


# -------------------------------------------------------------------- edge_softmax, dropout
@ir_op(check=_check_graph, output=EDGE, inputs={"e": EDGE})
def edge_softmax(g, e: torch.Tensor) -> torch.Tensor:
    """Softmax of edge scores over the in-edges of each node. All in-edges of a node live
    on its worker, so this never communicates.

    Example:

    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> sc.edge_softmax(g, torch.zeros(4))   # node 1 has two in-edges, nodes 0 and 2 one
    tensor([0.5000, 1.0000, 1.0000, 0.5000])
    """
    _check_rows(g, e, "e", g.num_edges)
    dst = g.dst_index.to(e.device)
    idx = dst.reshape(-1, *([1] * (e.dim() - 1))).expand_as(e)
    peak = torch.full((g.num_dst, *e.shape[1:]), float("-inf"), dtype=e.dtype, device=e.device)
    peak = peak.scatter_reduce(0, idx, e.detach(), "amax")
    z = torch.exp(e - peak[dst])
    total = torch.zeros_like(peak).index_add_(0, dst, z)
    return z / total[dst]


@ir_op(check=_check_graph, output=GRAPH, inputs={"mask": EDGE}, saved=lambda a: "nothing")
def edge_subset(g, mask: torch.Tensor):
    """The graph of the edges ``mask`` keeps (one bool per edge of ``g``), on the same
    nodes, its edges in ``g``'s edge order: what PyG's ``edge_index[:, mask]`` selects
    (edges of one relation, ``edge_type == i``). The other ops run on it as on ``g``.

    ``mask`` is a run-time value; the subset is made once per mask content and cached
    on ``g``. A node keeps all its kept in-edges on its worker, so this is local; on a
    worker, the blocks keep their source rows (the halos do not shrink)."""
    _check_rows(g, mask, "mask", g.num_edges)
    return g.edge_subset(mask)


def _check_edge_dropout(g, e, p, salt) -> None:
    _graph_kind(g)
    if not 0.0 <= p < 1.0:
        raise GraphError(f"edge dropout probability must be in [0, 1), got {p}")


@ir_op(check=_check_edge_dropout, output=EDGE, inputs={"e": EDGE})
def edge_dropout(g, e: torch.Tensor, p: float, salt: torch.Tensor) -> torch.Tensor:
    """Zero each edge value with probability ``p`` (scaling the rest by ``1/(1-p)``), with a
    mask keyed by global edge id, head and ``salt``: the same on any number of workers."""
    _check_rows(g, e, "e", g.num_edges)
    if p == 0.0:
        return e
    heads = e[0].numel() if e.shape[0] else 1
    keep = edge_keep(g.edge_ids, heads, p, salt.to(e.device), e.dtype)  # (a model's salt lives where it does)
    return e * keep.reshape(e.shape)


def _check_node_dropout(g, x, p, salt, source=False) -> None:
    _check_edge_dropout(g, x, p, salt)


@ir_op(check=_check_node_dropout, output=NODE, inputs={"x": NODE})
def node_dropout(g, x: torch.Tensor, p: float, salt: torch.Tensor, source: bool = False) -> torch.Tensor:
    """Zero each entry of the node rows ``x`` with probability ``p`` (scaling the rest by
    ``1/(1-p)``), with a mask keyed by global node id, position in the row and ``salt``:
    every worker draws the same mask for a node, so N workers drop what one machine drops.
    ``x`` holds a row per destination node of ``g`` (per source node with ``source``)."""
    ids = g.src_global_ids if source else g.global_ids
    _check_rows(g, x, "x", ids.numel())
    if p == 0.0:
        return x
    # A product with the bool mask keeps the mask (not a float copy) for backward, and is
    # several times faster than masked_fill on the CPU.
    return x * node_keep(ids, x, p, salt.to(x.device)) / (1.0 - p)


# ----------------------------------------------------------------------------- attention
def _check_attention(g, h, a_src, a_dst, negative_slope, dropout, salt, a_edge) -> None:
    _graph_kind(g)
    if not 0.0 <= dropout < 1.0:
        raise GraphError(f"attention dropout must be in [0, 1), got {dropout}")


def _fusable_shapes(g, h: torch.Tensor, a_src: torch.Tensor, a_dst: torch.Tensor, a_edge: torch.Tensor | None) -> bool:
    """One score per edge and head: ``a [n]`` with ``h [n, C]``, or ``a [n, H]`` with ``h [n,
    H, C]``; an edge term with exactly one such score per edge (``[E]`` or ``[E, H]``).
    Only trailing shapes count: on a relation between two types (and on a worker) the
    source and destination row counts differ, and every worker must take the same path."""
    if a_src.shape[1:] != a_dst.shape[1:] or h.dim() != a_src.dim() + 1:
        return False
    if a_edge is not None and tuple(a_edge.shape) != (g.num_edges, *a_src.shape[1:]):
        return False
    return a_src.dim() == 1 or (a_src.dim() == 2 and a_src.shape[1] == h.shape[1])


def _attention_temporaries(a: Args, row: int) -> Temporaries:
    # Backward of one block holds two [E, heads] tensors for the whole block (the weights,
    # and the dot products that become the scores' gradients in place), with dropout its
    # mask too; the scores, probabilities and pre-activations' gradients live a bounded row
    # range at a time; node rows: the gradient arriving and the payload gradient (as for
    # spmm). The Triton kernels hold no [E, heads] tensor: this counts the larger of the
    # two. (Calibrated with benchmarks/vs_dgl.py: seven [E, heads] tensors before the
    # kernels bounded theirs, one node row before the local block's gradient was a tensor of
    # its own.) An edge term adds none at that moment: its block is a slice of the input,
    # its gradient is written into the input's.
    s = a["a_src"].element_size()
    per_edge = (2 + int((a.get("dropout") or 0.0) > 0)) * s
    return Temporaries(2, per_edge * _heads(a["a_src"]), 3 * EDGE_CHUNK_ELEMENTS * s)


_ANY_INPUT = frozenset(("h", "a_src", "a_dst", "a_edge"))


@ir_op(
    check=_check_attention,
    output=NODE,
    inputs={"h": NODE, "a_src": NODE, "a_dst": NODE, "a_edge": EDGE},
    # h and a_src travel together; a_edge never travels (each edge lives on its
    # destination's worker). Backward recomputes the probabilities from every block, and
    # the edge term's gradient needs them too.
    exchange=Halo(
        sends=("h", "a_src"),
        reads_remote_in_backward=lambda a, wants: bool(wants & _ANY_INPUT),
        pushes_gradients=lambda a, wants: bool(wants & _ANY_INPUT),
        grads_over_block=True,
    ),
    saved=lambda a: "out + log-sum-exp per node" + ("" if a.get("a_edge") is None else ", a_edge (reference)"),
    temporaries=_attention_temporaries,
    approximate_warning=(
        "stale or compressed communication on an attention op can collapse accuracy (a 4-layer GAT on Reddit "
        "fell from 86.6% to 23.8% with stale features)"
    ),
)
def attention(
    g,
    h: torch.Tensor,
    a_src: torch.Tensor,
    a_dst: torch.Tensor,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    salt: torch.Tensor | None = None,
    a_edge: torch.Tensor | None = None,
    *,
    strategy: Strategy = Strategy.REMAT,
    in_flight: int = 1,
    executor: Executor = Executor.AUTO,
    comm: LinkPolicy | None = None,
) -> torch.Tensor:
    """``spmm(g, h, "sum", edge_dropout(edge_softmax(leaky_relu(sddmm(g, a_src, a_dst, "add")
    [+ a_edge]))))`` in one op that never keeps a per-edge tensor (see
    :mod:`sarcompile.runtime.ops`). ``a_edge``: an optional per-edge score added before
    the leaky ReLU (GATConv's edge features), in the graph's edge order."""
    for name, t in (("h", h), ("a_src", a_src), ("a_dst", a_dst)):
        _check_rows(g, t, name, g.num_nodes if name == "a_dst" else g.num_src_nodes)
    salt = torch.zeros((), dtype=torch.long) if salt is None else salt
    if not _fusable_shapes(g, h, a_src, a_dst, a_edge):  # e.g. one score per edge shared by all heads
        score = sddmm(g, a_src, a_dst, "add", in_flight=in_flight, comm=comm)
        score = torch.nn.functional.leaky_relu(score if a_edge is None else score + a_edge, negative_slope)
        weight = edge_softmax(g, score)
        if dropout:
            weight = edge_dropout(g, weight, dropout, salt)
        second = None if comm is None else comm.second()
        return spmm(g, h, "sum", edge_weight=weight, strategy=strategy, in_flight=in_flight, executor=executor,
                    comm=second)
    single = a_src.dim() == 1
    if single:
        h, a_src, a_dst = h.unsqueeze(1), a_src.unsqueeze(1), a_dst.unsqueeze(1)
        a_edge = None if a_edge is None else a_edge.unsqueeze(1)
    if isinstance(g, Graph):
        shard, a_edge = _single(g), _to_csr_order(g, a_edge)
    else:
        shard = g
    out = attention.definition.run(
        shard, h, a_src, a_dst, negative_slope, dropout, salt, a_edge, strategy=strategy, in_flight=in_flight,
        executor=executor, comm=comm,
    )
    return out.squeeze(1) if single else out


# ---------------------------------------------------------------------------- batch_norm
def _check_batch_norm(x, weight, bias, running_mean, running_var, num_batches_tracked, training, momentum, eps) -> None:
    if momentum is not None and not 0.0 <= momentum <= 1.0:
        raise GraphError(f"batch_norm momentum must be in [0, 1] or None, got {momentum}")


def _batch_norm_bytes(a: Args) -> tuple[int, int]:
    """float64 sums: the mean and count, then the variance; in backward two per channel."""
    c = a["x"].shape[1]
    return (c + 1 + c) * 8, (2 * c * 8 if a["x"].requires_grad else 0)


@ir_op(
    check=_check_batch_norm,
    output=NODE,
    inputs={"x": NODE},
    exchange=AllReduce(_batch_norm_bytes),
    saved=lambda a: "input (reference)",
)
def batch_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    num_batches_tracked: torch.Tensor | None,
    training: bool,
    momentum: float | None,
    eps: float,
    *,
    strategy: Strategy = Strategy.LOCAL,
) -> torch.Tensor:
    """Batch norm of node features over the nodes of the whole graph, as
    ``torch.nn.BatchNorm1d`` computes it on one machine (running statistics included).

    On a worker's shard (``strategy="allreduce"``, set by the partition pass) the batch
    statistics and, in backward, the sums the input gradient needs are all-reduced, so N
    workers normalise exactly as one machine does. In eval mode the running statistics
    are used and nothing is communicated.
    """
    if x.dim() != 2:
        raise GraphError(f"batch_norm takes node features [num_nodes, channels], got shape {tuple(x.shape)}")
    if not training and running_mean is not None:
        return torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias, False, 0.0, eps)
    factor = 0.0 if momentum is not None else None
    if running_mean is not None and num_batches_tracked is not None:
        with torch.no_grad():
            num_batches_tracked.add_(1)
        factor = momentum if momentum is not None else 1.0 / float(num_batches_tracked)
    if strategy == Strategy.LOCAL:
        return torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias, True, factor or 0.0, eps)
    return batch_norm.definition.run(x, weight, bias, running_mean, running_var, factor or 0.0, eps)


# ----------------------------------------------------------------------- message_passing
def _check_message_passing(g, fn, x, edge_attr, reduce) -> None:
    _graph_kind(g)
    if reduce not in MESSAGE_REDUCES:
        raise GraphError(f"message_passing reduce must be one of {MESSAGE_REDUCES}, got {reduce!r}")
    if not isinstance(fn, torch.nn.Module):
        raise GraphError(
            f"message_passing needs the message function as a torch.nn.Module (a submodule of the model), "
            f"got {type(fn).__name__}; wrap it in a module whose forward(x_j, x_i, edge_attr) returns the messages"
        )
    for m in fn.modules():  # backward recomputes the messages: they must come out the same
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            raise GraphError(
                f"the message function {type(fn).__name__} contains {type(m).__name__}, which would draw a "
                "different mask when backward recomputes the messages; apply dropout outside it"
            )


def _message_temporaries(a: Args, row: int) -> Temporaries:
    # Per edge: the gathered source and destination rows and their gradients, the
    # messages and their gradient -- an approximation: the message function's own
    # intermediates (an MLP's hidden layer, say) are not counted.
    return Temporaries(3, 4 * row + 2 * row_bytes(a["result"]))


@ir_op(
    check=_check_message_passing,
    output=NODE,
    inputs={"x": NODE, "edge_attr": EDGE},
    # backward recomputes every block's messages (the message function's parameters
    # need them even when x needs no gradient)
    exchange=Halo(
        sends=("x",),
        reads_remote_in_backward=lambda a, wants: True,
        pushes_gradients=lambda a, wants: "x" in wants,
    ),
    label=lambda a: f"message_passing({a['reduce']})",
    saved=lambda a: "inputs (references), winning edge [n, F] int64" if a["reduce"] == "max" else "inputs (references)",
    temporaries=_message_temporaries,
)
def message_passing(
    g,
    fn: torch.nn.Module,
    x: torch.Tensor,
    edge_attr: torch.Tensor | None = None,
    reduce: str = "sum",
    *,
    strategy: Strategy = Strategy.REMAT,
    in_flight: int = 1,
    comm: LinkPolicy | None = None,
) -> torch.Tensor:
    """General message passing: ``out[v] = reduce_{u->v} fn(x[u], x[v], edge_attr[e])``.

    ``fn(x_j, x_i, edge_attr)`` maps per-edge rows (source, destination, edge features or
    None) to per-edge messages ``[E, ...]`` -- any torch code, parameters included. It runs
    block by block and no message is kept: backward re-fetches each block and recomputes
    its messages (SAR's rematerialization), so ``fn`` must be deterministic. An empty
    neighbourhood gives 0; max picks, among equal messages, the edge with the smallest id.
    """
    _one_node_set(g, "message_passing")
    _check_rows(g, x, "x", g.num_nodes)
    if edge_attr is not None:
        _check_rows(g, edge_attr, "edge_attr", g.num_edges)
    if isinstance(g, Graph):
        return message_passing.definition.run(_single(g), fn, x, _to_csr_order(g, edge_attr), reduce)
    return message_passing.definition.run(g, fn, x, edge_attr, reduce, strategy=strategy, in_flight=in_flight, comm=comm)
