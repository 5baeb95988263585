"""Example inputs on small made-up graphs, to learn a program's shapes before it runs.

The tracer (:class:`sarcompile.trace.ShapeTracer`) computes every value of a model on
each of the :data:`PROBES` while it traces, so Python code may branch on feature widths
and ``dim()``; the residency pass runs the lowered program on the first probe. A per-row
input gets the probe's row count, and a size that is not the same on every probe, or is
one of their row counts (:data:`ROW_COUNTS`), is taken for a row count: it differs
between workers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from .graph import Graph, probe_graph
from .vocab import Residency

__all__ = ["Input", "Probe", "PROBES", "ROW_COUNTS", "example"]


@dataclass(frozen=True)
class Input:
    """What the compiler knows of one input of the call: its residency and, for a tensor,
    its shape and dtype (for the probe; a per-row input gets the probe's row count); for
    another value, the value. ``alternatives``: other residencies its shape fits (a
    ``[4, 3]`` weight given with a 4-node graph could be per-node rows); the first choice
    under which the probe runs is taken."""

    residency: Residency
    shape: tuple[int, ...] | None = None
    dtype: torch.dtype | None = None
    value: Any = None
    alternatives: tuple[Residency, ...] = ()


@dataclass(frozen=True)
class Probe:
    """A made-up graph of ``nodes`` nodes and ``edges`` edges, ``loops`` of them self-loops;
    ``seed`` draws its example features."""

    nodes: int
    edges: int
    loops: int
    seed: int

    @property
    def graph(self) -> Graph:
        return _graph(self.nodes, self.edges, self.loops)

    @property
    def row_counts(self) -> frozenset[int]:
        """Its node count and the edge counts of the graph, without and with self-loops."""
        plain = self.edges - self.loops
        return frozenset({self.nodes, self.edges, plain, plain + self.nodes})


@functools.lru_cache(maxsize=None)
def _graph(nodes: int, edges: int, loops: int) -> Graph:
    return probe_graph(nodes, edges, loops)


# Sizes unlikely to equal a feature width (23, 61, 58, 81 and 37, 83, 78, 115), so a row
# axis is recognisable; two probes, so a size that follows the row count is seen to change.
PROBES = (Probe(23, 61, 3, seed=1), Probe(37, 83, 5, seed=2))
ROW_COUNTS = frozenset().union(*(p.row_counts for p in PROBES))


def example(spec: Input, probe: Probe, device: torch.device) -> Any:
    """An example value of an input described by ``spec``, on ``probe``'s graph."""
    if spec.residency is Residency.GRAPH:
        return probe.graph
    if spec.shape is None:
        return spec.value
    graph = probe.graph
    rows = {Residency.NODE: graph.num_nodes, Residency.EDGE: graph.num_edges}.get(spec.residency)
    shape = spec.shape if rows is None else (rows, *spec.shape[1:])
    gen = torch.Generator().manual_seed(probe.seed)
    dtype = spec.dtype or torch.get_default_dtype()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=dtype).to(device)
    return torch.zeros(shape, dtype=dtype, device=device)
