"""The statistics the memory estimate's partition model needs, read from edge files in
one streaming pass (the graph is never loaded)."""

from __future__ import annotations

import numpy as np
import torch

from sarcompile.graph.stats import GraphStats
from sarcompile.data.outofcore.sources import EdgeFiles

__all__ = ["edge_stats"]


def edge_stats(edges: EdgeFiles, chunk_edges: int = 1 << 22) -> GraphStats:
    """Sizes, self-loops and the out-degree histogram of ``edges``."""
    out_degree = np.zeros(edges.num_nodes, dtype=np.int64)
    loops = 0
    for _, src, dst in edges.chunks(chunk_edges):
        out_degree += np.bincount(src, minlength=edges.num_nodes)
        loops += int((src == dst).sum())
    return GraphStats(edges.num_nodes, edges.num_edges, loops, torch.from_numpy(np.bincount(out_degree)))
