"""What the IR op families share: the checks of their graph and row arguments, and the
way an op runs on a whole :class:`~sarcompile.graph.graph.Graph` -- as the shard of one
worker, edge tensors put in CSR order and back -- so one machine runs the code N do.

The ops themselves are defined in their family modules and exported by
:mod:`sarcompile.ir.ops`.
"""

from __future__ import annotations

from typing import Any

import torch

from sarcompile.errors import GraphError
from sarcompile.graph.graph import Graph
from sarcompile.graph.shard import ShardGraph
from sarcompile.ir.vocab import Residency

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


def _check_graph(g, **_inputs) -> None:
    """The check of an op whose inputs' rows are checked where it is called (or need none):
    ``g`` is a graph."""
    _graph_kind(g)
