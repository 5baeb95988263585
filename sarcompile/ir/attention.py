"""The IR's fused attention op: ``sddmm(add) [+ a_edge] -> leaky_relu -> edge_softmax ->
[edge_dropout] -> weighted spmm`` in one op that keeps no per-edge tensor (the fuse pass
produces it from that chain). See :mod:`sarcompile.ir.ops`.
"""

from __future__ import annotations

import torch

from sarcompile.errors import GraphError
from sarcompile.graph.graph import Graph
from sarcompile.ir.aggregation import spmm
from sarcompile.ir.dropout import edge_dropout
from sarcompile.ir.edge_ops import edge_softmax, sddmm
from sarcompile.ir.op_common import EDGE, NODE, _check_rows, _graph_kind, _single, _to_csr_order
from sarcompile.ir.opdef import EDGE_CHUNK_ELEMENTS, Args, Halo, Temporaries, ir_op
from sarcompile.ir.vocab import Executor, LinkPolicy, Strategy


def _heads(a: torch.Tensor) -> int:
    return a.shape[1] if a.dim() == 2 else 1


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
