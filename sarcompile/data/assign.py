"""Which part every node goes to: the cut itself (METIS, random or contiguous), or a
caller's own assignment checked.

:func:`sarcompile.data.partitioning.partition` cuts a graph with :func:`assign` and writes
the pieces; the typed and out-of-core partitioners build on the same methods.
"""

from __future__ import annotations

import numpy as np
import torch

from sarcompile.errors import GraphError, PartitionError
from sarcompile.graph.graph import Graph

__all__ = ["METHODS", "assign"]

METHODS = ("metis", "random", "contiguous")


def assign(g: Graph, num_parts: int, method: str | torch.Tensor = "metis", seed: int = 0) -> torch.Tensor:
    """The part of every node: a LongTensor of ``g.num_nodes`` values in ``[0, num_parts)``.

    ``method`` is one of :data:`METHODS` or an integer tensor that *is* the assignment
    (one part id per node; e.g. another partitioner's, see
    :func:`sarcompile.data.dgl_import.convert_dgl_partition`), which is checked
    and returned as a LongTensor; ``seed`` is then unused.

    * ``"metis"`` -- METIS k-way on the undirected simple graph behind ``g`` (edge
      directions dropped, self-loops and duplicates removed), seeded with ``seed``.
      A graph without edges, or with fewer nodes than parts, gives METIS nothing to
      optimise (and it can misbehave there), so those fall back to ``"contiguous"``.
    * ``"random"`` -- every node uniformly at random, reproducible from ``seed``.
    * ``"contiguous"`` -- node ``v`` goes to ``v * num_parts // num_nodes``: equal runs of ids.

    Parts may come out empty (e.g. more parts than nodes); the rest of the pipeline allows it.
    """
    _check_graph(g)
    _check_num_parts(num_parts)
    if isinstance(method, torch.Tensor):
        return _given_assignment(method, g.num_nodes, num_parts)
    if method not in METHODS:
        raise PartitionError(f"unknown partition method {method!r}; choose one of {', '.join(METHODS)}")
    n = g.num_nodes
    if num_parts == 1 or n == 0:
        return torch.zeros(n, dtype=torch.long)
    if method == "random":
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(num_parts, (n,), generator=gen)
    if method == "metis":
        return _metis(g, num_parts, seed)
    return _contiguous(n, num_parts)


def _given_assignment(parts: torch.Tensor, num_nodes: int, num_parts: int) -> torch.Tensor:
    """A caller's assignment, checked: one integer part id in ``[0, num_parts)`` per node."""
    if parts.is_floating_point() or parts.is_complex() or parts.dtype == torch.bool:
        raise PartitionError(f"an assignment must hold integer part ids, got dtype {parts.dtype}")
    if parts.shape != (num_nodes,):
        raise PartitionError(
            f"an assignment must hold one part id per node ({num_nodes}), got shape {tuple(parts.shape)}"
        )
    parts = parts.detach().cpu().long()
    if num_nodes and (int(parts.min()) < 0 or int(parts.max()) >= num_parts):
        raise PartitionError(
            f"assignment part ids must lie in [0, {num_parts}), got [{int(parts.min())}, {int(parts.max())}]"
        )
    return parts


def _contiguous(num_nodes: int, num_parts: int) -> torch.Tensor:
    return torch.arange(num_nodes) * num_parts // num_nodes


def _symmetric_csr(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """CSR (``xadj``, ``adjncy``) of the undirected simple graph METIS expects.

    METIS requires both directions of every edge, no self-loops and no repeated neighbours.
    """
    n = g.num_nodes
    keep = g.src != g.dst
    u = torch.cat([g.src[keep], g.dst[keep]])
    v = torch.cat([g.dst[keep], g.src[keep]])
    # One sorted, de-duplicated key per (u, v) pair is already the CSR order.
    key = torch.unique(u * n + v)
    u, v = key // n, key % n
    xadj = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(torch.bincount(u, minlength=n), 0)])
    return xadj.numpy(), v.numpy()


def _metis(g: Graph, num_parts: int, seed: int) -> torch.Tensor:
    import pymetis

    xadj, adjncy = _symmetric_csr(g)
    if adjncy.size == 0 or g.num_nodes < num_parts:
        return _contiguous(g.num_nodes, num_parts)
    options = pymetis.Options(seed=seed)
    # pymetis >= 2025.2 takes a CSRAdjacency and deprecates xadj/adjncy; older ones only have those.
    if hasattr(pymetis, "CSRAdjacency"):
        result = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(xadj, adjncy), options=options)
    else:
        result = pymetis.part_graph(num_parts, xadj=xadj, adjncy=adjncy, options=options)
    parts = torch.as_tensor(np.asarray(result[1], dtype=np.int64))
    if parts.shape != (g.num_nodes,) or int(parts.min()) < 0 or int(parts.max()) >= num_parts:
        raise PartitionError(f"METIS returned an invalid assignment for {num_parts} parts; try method='random'")
    return parts


def _check_graph(g: Graph) -> None:
    if not isinstance(g, Graph):
        raise GraphError(
            f"expected a sarcompile Graph, got {type(g).__name__}; build one with Graph.from_edges or Graph.from_pyg"
        )


def _check_num_parts(num_parts: int) -> None:
    if isinstance(num_parts, bool) or not isinstance(num_parts, int) or num_parts < 1:
        raise PartitionError(f"num_parts must be an integer >= 1, got {num_parts!r}")
