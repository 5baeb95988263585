"""A sparse adjacency's values (PyG's normalised ``adj_t``): the layers whose rule reads
them as PyG reads a ``torch.sparse`` adjacency, and the refusal for the others.
"""

from __future__ import annotations

import torch
import torch.fx

from sarcompile.errors import CompileError
from sarcompile.compile.trace import ShapeTracer
from sarcompile.ir.lowering import declare
from sarcompile.ir.ops import edge_reduce, gather_src, spmm
from sarcompile.ir.vocab import Residency

# The layers whose rule reads a sparse adjacency's values as PyG reads a torch.sparse adj_t.
ADJACENCY_LAYERS = ("GCNConv", "SAGEConv", "GINConv", "GraphConv", "GATConv", "GATv2Conv")


@torch.fx.wrap
def adjacency_values(graph, like: torch.Tensor) -> torch.Tensor:
    """The values of the sparse adjacency ``graph`` was made from (``adj_values``), one per
    edge in its edge order (a worker's shard: in shard order), on ``like``'s device."""
    values = graph.adj_values
    if values is None:
        raise CompileError(
            "the model was compiled for a sparse adjacency with values (adj_t) and called with a graph without "
            "them; on a worker give the shard of that adjacency's graph (sc.Graph.from_adjacency(adj_t), "
            "partitioned: part.graph carries the values)"
        )
    return values.to(like.device)


def _has_values(graph) -> bool:
    """Whether ``graph`` is a sparse adjacency's with values (``adj_values``): asked of the
    graph itself when a stand-in runs on an example, else of its example values (a graph
    input with values has probes with values, see :func:`~sarcompile.ir.probe.example`)."""
    if not isinstance(graph, torch.fx.Proxy):
        return getattr(graph, "adj_values", None) is not None
    tracer = graph.tracer
    examples = tracer.value(graph.node) if isinstance(tracer, ShapeTracer) else None
    return bool(examples) and getattr(examples[0], "adj_values", None) is not None


def _values(graph, like):
    """The adjacency values of ``graph`` (see :func:`adjacency_values`) where it has them, else None."""
    return adjacency_values(graph, like) if _has_values(graph) else None


def _aggregate_weighted(graph, x, reduce: str, weight):
    """``torch.sparse.mm(adj_t, x, reduce)`` (PyG's ``spmm``) on an adjacency of values
    ``weight`` (None: ones): ``reduce`` over the in-edges of ``weight * x[src]``; max and
    min as per-edge rows reduced (spmm takes weights with sum and mean only)."""
    if weight is None or reduce in ("sum", "mean"):
        return spmm(graph, x, reduce, edge_weight=weight)
    return edge_reduce(graph, gather_src(graph, x) * weight.unsqueeze(-1), reduce)


def _no_adjacency_values(layer: str, graph) -> None:
    """Refuse a sparse adjacency with values or self-loops where ``layer``'s rule does not
    read them as PyG does (the general lowering traces the layer's edge_index path)."""
    if _has_values(graph):
        raise CompileError(
            f"{layer} was given a sparse adjacency with values other than 1 or with self-loops (a normalised "
            f"adj_t); PyG reads such a matrix otherwise than the same edges as edge_index, and sarcompile reads it "
            f"as PyG does in {', '.join(ADJACENCY_LAYERS)} only. Give {layer} the graph of edges "
            "(sc.Graph.from_edges(src, dst, n), or the adjacency of ones without self-loops) and the values as "
            "its edge_weight where it takes one"
        )


declare(adjacency_values, Residency.EDGE)  # row-local: one value per edge
