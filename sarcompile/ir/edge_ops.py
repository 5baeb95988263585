"""The IR ops that give one value per edge: ``sddmm`` (from both ends' rows),
``gather_src`` / ``gather_dst`` (an end's node rows onto the edges), ``gather_table`` (rows
of a whole-graph parameter), ``edge_softmax`` (over each node's in-edges), and
``edge_subset``, the graph of some of the edges. See :mod:`sarcompile.ir.ops`.
"""

from __future__ import annotations

import torch

from sarcompile.errors import GraphError
from sarcompile.graph.graph import Graph
from sarcompile.ir.op_common import EDGE, GRAPH, NODE, _check_graph, _check_rows, _from_csr_order, _graph_kind, _one_node_set, _single
from sarcompile.ir.opdef import Halo, Temporaries, ir_op
from sarcompile.ir.vocab import LinkPolicy, Residency, Strategy

SDDMM_OPS = ("add", "sub", "mul", "dot")


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


# -------------------------------------------------------------------------------- gathers
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


# ----------------------------------------------------------------- edge_softmax, edge_subset
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
