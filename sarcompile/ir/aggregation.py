"""The IR ops that reduce into node rows: ``spmm`` (node rows over in-edges, optionally
weighted), ``message_passing`` (any message function's per-edge messages), ``edge_reduce``
(per-edge values into their destinations) and ``edge_reduce_src`` (into their sources,
pushed to the sources' owners on N workers). See :mod:`sarcompile.ir.ops`.
"""

from __future__ import annotations

import torch

from sarcompile.errors import GraphError
from sarcompile.graph.graph import Graph
from sarcompile.ir.op_common import EDGE, NODE, _check_rows, _graph_kind, _one_node_set, _single, _to_csr_order
from sarcompile.ir.opdef import EDGE_CHUNK_ELEMENTS, Args, Halo, Push, Temporaries, ir_op, row_bytes
from sarcompile.ir.vocab import Executor, LinkPolicy, Strategy

REDUCES = ("sum", "mean", "max", "min")
MESSAGE_REDUCES = ("sum", "mean", "max")  # message_passing's: it keeps a winner per row for max only
EDGE_REDUCES = ("sum", "mean", "max", "min", "mul")
SOURCE_REDUCES = ("sum", "mean")  # edge_reduce_src's: partial results that add up across workers


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


# ---------------------------------------------------------------------------- edge_reduce
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
