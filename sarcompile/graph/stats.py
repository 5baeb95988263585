"""A graph's sizes and out-degree histogram: what the memory estimate's random-partition
model (:mod:`sarcompile.compile.estimate`) reads of a graph, whether it is in memory or in
edge files (:func:`sarcompile.data.outofcore.edge_stats`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sarcompile.graph.graph import Graph

__all__ = ["GraphStats"]


@dataclass(frozen=True)
class GraphStats:
    """What the random-partition model reads of a graph: its sizes and out-degree histogram
    (``out_degree_counts[d]``: source nodes with ``d`` out-edges). :func:`graph_stats`
    takes them from a graph in memory, :func:`sarcompile.data.outofcore.edge_stats` from edge
    files in one streaming pass."""

    num_nodes: int
    num_edges: int
    self_loops: int
    out_degree_counts: torch.Tensor

    @classmethod
    def of(cls, g: Graph) -> "GraphStats":
        out_degree = torch.bincount(g.src, minlength=g.num_src_nodes)
        loops = 0 if g.bipartite else int((g.src == g.dst).sum())
        return cls(g.num_nodes, g.num_edges, loops, torch.bincount(out_degree))
