"""What-if memory before partitioning: ``sc.estimate(model, graph, num_parts=[...], modes=[...])``.

For a worker count with an existing partition (``partitions={N: directory}``) the estimate
is the plan's own, exact in its saved-activation and remote-block parts. For other counts
it uses a *random-partition model* of the shard sizes: every worker gets ``1/N`` of the
nodes, edges and self-loops, and receives from every other worker the expected number of
its nodes with at least one edge into the worker's nodes,

    halo(N) = (1/N) * sum over nodes u of (1 - (1 - 1/N) ** outdeg(u)),

treating each of ``u``'s out-edges as landing on a uniformly random worker. Real graphs
partitioned with METIS have smaller halos, so for them the model errs on the high side.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sarcompile.graph.graph import Graph
from sarcompile.graph.stats import GraphStats
from sarcompile.graph.hetero import HeteroGraph
from sarcompile.plan.plan import MemoryEstimate, Plan, _size, _table
from sarcompile.plan.sizes import TypedWorkerStats, WorkerStats
from sarcompile.ir.vocab import Mode

__all__ = ["Estimate", "EstimateTable", "GraphStats", "estimate", "model_workers"]


@dataclass
class Estimate:
    """The per-worker peak for one (worker count, mode): the largest over workers."""

    num_parts: int
    mode: str
    peak_bytes: int
    worst: MemoryEstimate  # the worker with the largest peak
    exact: bool  # from a real partition, not from the partition model


@dataclass
class EstimateTable:
    """What :func:`estimate` returns: one :class:`Estimate` per worker count and mode;
    ``print(table)`` shows them as a table, :meth:`peak` reads one.

    Example:

    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> table = sc.estimate(sc.nn.SAGEConv(2, 4), g, num_parts=[1, 2], modes=["sar"], x=torch.ones(3, 2), show=False)
    >>> str(table).splitlines()[0]
    'estimated peak memory per worker (largest worker):'
    """

    rows: list[Estimate] = field(default_factory=list)

    def peak(self, num_parts: int, mode: str) -> int:
        """The estimated peak bytes of the largest worker, for ``num_parts`` workers in ``mode``."""
        return next(r.peak_bytes for r in self.rows if r.num_parts == num_parts and r.mode == mode)

    def __str__(self) -> str:
        counts = sorted({r.num_parts for r in self.rows})
        modes = list(dict.fromkeys(r.mode for r in self.rows))
        exact = {r.num_parts: r.exact for r in self.rows}
        rows = [
            (str(n), "partition" if exact[n] else "model", *(_size(self.peak(n, m)) for m in modes)) for n in counts
        ]
        lines = ["estimated peak memory per worker (largest worker):", *_table(("workers", "from", *modes), rows)]
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike) -> None:
        """Peak per worker against the worker count, one line per mode (PNG; needs matplotlib)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.5))
        for mode in dict.fromkeys(r.mode for r in self.rows):
            pts = sorted((r.num_parts, r.peak_bytes / 2**20) for r in self.rows if r.mode == mode)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers")
        ax.set_ylabel("estimated peak per worker (MiB)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)


def model_workers(
    g: Graph | HeteroGraph | GraphStats, num_parts: int
) -> list[WorkerStats] | list[TypedWorkerStats]:
    """Shard sizes of ``num_parts`` equal workers under the random-partition model; of a
    typed graph, every node type split evenly and each relation modelled on its own (its
    halo counts its source type's nodes)."""
    if isinstance(g, HeteroGraph):
        relations = {rel: model_workers(rg, num_parts) for rel, rg in g.items()}
        nodes = {t: _share(g.num_nodes(t), num_parts) for t in g.node_types}
        counts = {t: g.num_nodes(t) for t in g.node_types}
        return [TypedWorkerStats(dict(nodes), {rel: ws[r] for rel, ws in relations.items()}, counts)
                for r in range(num_parts)]
    stats = g if isinstance(g, GraphStats) else GraphStats.of(g)
    n = num_parts
    degrees = torch.arange(len(stats.out_degree_counts), dtype=torch.float64)
    reached = (1.0 - (1.0 - 1.0 / n) ** degrees) * stats.out_degree_counts.to(torch.float64)
    halo = float(reached.sum()) / n if n > 1 else 0.0
    edges = _share(stats.num_edges, n)
    return [
        WorkerStats(
            _share(stats.num_nodes, n),
            edges,
            _share(stats.self_loops, n),
            [0 if q == r else round(halo) for q in range(n)],
            [-(-edges // n)] * n,  # a random partition spreads a node's in-edges evenly
        )
        for r in range(n)
    ]


def _share(total: int, num_parts: int) -> int:
    return -(-total // num_parts)  # the largest worker's share


def estimate(
    model: Any,
    graph: Graph | HeteroGraph | GraphStats,
    num_parts: list[int] = (1, 2, 4, 8),
    modes: list[str] = Mode.values(),
    x: torch.Tensor | dict[str, torch.Tensor] | None = None,
    partitions: dict[int, str | os.PathLike] | None = None,
    optimizer: Any = None,
    show: bool = True,
) -> EstimateTable:
    """Estimated per-worker peak for every worker count and mode; printed when ``show``.

    ``model`` is an ``nn.Module`` (or a distributed one); ``graph`` the graph, or only its
    :class:`GraphStats` (for a graph too large to load); ``x`` an example input (trailing
    shape and dtype; over a :class:`~sarcompile.graph.hetero.HeteroGraph`, a dict of them per
    node type with features). ``partitions`` maps worker counts to existing partition
    directories, which make those rows exact.

    Example:

    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> table = sc.estimate(sc.nn.SAGEConv(2, 4), g, num_parts=[1, 2], modes=["sar"], x=torch.ones(3, 2), show=False)
    >>> [(row.num_parts, row.mode) for row in table.rows]
    [(1, 'sar'), (2, 'sar')]
    """
    from sarcompile.compile.distribute import DistributedModule, distribute

    if x is None:
        raise ValueError("estimate(..., x=example input): its trailing shape and dtype size every row")
    original = model.original if isinstance(model, DistributedModule) else model
    partitions = partitions or {}
    table = EstimateTable()
    for mode in modes:
        compiled = distribute(original, mode=mode)
        for n in num_parts:
            if n in partitions:
                plan: Plan = compiled.plan(Path(partitions[n]), x=x, optimizer=optimizer)
            else:
                plan = compiled.plan_for_workers(model_workers(graph, n), x=x, optimizer=optimizer)
            worst = max(plan.memory_estimate(), key=lambda e: e.peak_bytes)
            table.rows.append(Estimate(n, mode, worst.peak_bytes, worst, n in partitions))
    if show:
        print(table)
    return table
