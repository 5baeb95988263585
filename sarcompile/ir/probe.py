"""Example inputs on small made-up graphs, to learn a program's shapes before it runs.

The tracer (:class:`sarcompile.compile.trace.ShapeTracer`) computes every value of a model on
each of the :data:`PROBES` while it traces, so Python code may branch on feature widths
and ``dim()``; the residency pass runs the lowered program on the first probe. A per-row
input gets the probe's row count, and a size that is not the same on every probe, or is
one of their row counts (:data:`ROW_COUNTS`), is taken for a row count: it differs
between workers.

A typed graph's probe (inputs whose :attr:`Input.of` names a node type or a relation)
gives each node type a row count of its own (:meth:`Probe.type_rows`), and each relation a
graph between its two types' rows, so a program that lined up two types' rows would fail
on the probe as it would on a worker.

:class:`Recorder` runs a program on such inputs and records what the compiler and the
planner learn from it: every value's shape and every IR op's arguments.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from sarcompile.graph.graph import Graph, probe_graph, probe_relation
from sarcompile.ir.opdef import definition
from sarcompile.ir.vocab import Residency

__all__ = ["Input", "Probe", "PROBES", "ROW_COUNTS", "Recorder", "example", "summary"]


@dataclass(frozen=True)
class Input:
    """What the compiler knows of one input of the call: its residency and, for a tensor,
    its shape and dtype (for the probe; a per-row input gets the probe's row count); for
    another value, the value; for a graph, ``dtype`` is that of its adjacency values where it
    has them (``Graph.adj_values``: its probe has values too). ``alternatives``: other residencies its shape fits (a
    ``[4, 3]`` weight given with a 4-node graph could be per-node rows); the first choice
    under which the probe runs is taken. ``of``: in a call over a typed graph, the node
    type (per-node rows) or the relation ``(src, name, dst)`` (per-edge rows, a
    relation's graph) the input belongs to; None on a one-type graph."""

    residency: Residency
    shape: tuple[int, ...] | None = None
    dtype: torch.dtype | None = None
    value: Any = None
    alternatives: tuple[Residency, ...] = ()
    of: Any = None


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
        """Its node count and the edge counts of the graph, without and with self-loops,
        and the same for every row count a node type may get."""
        plain = self.edges - self.loops
        counts = {self.nodes, self.edges, plain, plain + self.nodes}
        for n in self.type_counts:
            counts |= {n, plain + n}
        return frozenset(counts)

    @property
    def type_counts(self) -> tuple[int, ...]:
        """The row counts node types draw from: primes next to the node count, which no
        feature width is likely to equal."""
        return tuple(n for n in range(self.nodes + 2, self.nodes + 60) if all(n % d for d in range(2, n)))[:8]

    def type_rows(self, ntype: str) -> int:
        """The rows of node type ``ntype`` on this probe: fixed by its name, so every input
        of the type agrees (two types may share a count; the residency pass tells them
        apart by name)."""
        counts = self.type_counts
        return counts[zlib.crc32(ntype.encode()) % len(counts)]

    def relation(self, rel: tuple[str, str, str]) -> Graph:
        """The graph of relation ``(src, name, dst)``: ``edges`` edges from the source
        type's rows to the destination type's, self-loops included within one type."""
        s, name, d = rel
        return _relation(self.type_rows(s), self.type_rows(d), self.edges, self.loops if s == d else 0,
                         zlib.crc32("__".join(rel).encode()), s == d)


@functools.lru_cache(maxsize=None)
def _graph(nodes: int, edges: int, loops: int) -> Graph:
    return probe_graph(nodes, edges, loops)


@functools.lru_cache(maxsize=None)
def _relation(num_src: int, num_dst: int, edges: int, loops: int, seed: int, same: bool) -> Graph:
    return probe_relation(num_src, num_dst, edges, loops, seed, same)


@functools.lru_cache(maxsize=None)
def _valued(nodes: int, edges: int, loops: int, dtype: torch.dtype) -> Graph:
    """The probe graph with adjacency values (``Graph.adj_values``) of ``dtype``: made-up
    weights in [0.5, 1.5), none of them 1."""
    g = _graph(nodes, edges, loops)
    valued = g._derive(g.src, g.dst, g.edge_ids)
    valued.adj_values = 0.5 + torch.rand(edges, generator=torch.Generator().manual_seed(edges), dtype=dtype)
    return valued


# Sizes unlikely to equal a feature width (23, 61, 58, 81 and 37, 83, 78, 115), so a row
# axis is recognisable; two probes, so a size that follows the row count is seen to change.
PROBES = (Probe(23, 61, 3, seed=1), Probe(37, 83, 5, seed=2))
ROW_COUNTS = frozenset().union(*(p.row_counts for p in PROBES))


def example(spec: Input, probe: Probe, device: torch.device) -> Any:
    """An example value of an input described by ``spec``, on ``probe``'s graph."""
    if spec.residency is Residency.GRAPH:
        if spec.of is not None:
            return probe.relation(spec.of)
        return probe.graph if spec.dtype is None else _valued(probe.nodes, probe.edges, probe.loops, spec.dtype)
    if spec.shape is None:
        return spec.value
    if spec.of is None:
        graph = probe.graph
        rows = {Residency.NODE: graph.num_nodes, Residency.EDGE: graph.num_edges}.get(spec.residency)
    elif spec.residency is Residency.NODE:
        rows = probe.type_rows(spec.of)
    else:
        rows = probe.relation(spec.of).num_edges if spec.residency is Residency.EDGE else None
    shape = spec.shape if rows is None else (rows, *spec.shape[1:])
    gen = torch.Generator().manual_seed(probe.seed)
    dtype = spec.dtype or torch.get_default_dtype()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=dtype).to(device)
    return torch.zeros(shape, dtype=dtype, device=device)


class Recorder(fx.Interpreter):
    """Runs a program, recording every value's shape (``shapes``, see :func:`summary`) and
    each IR op's arguments by name with its ``"result"`` (``ir_args``). After a failure
    they hold what was computed before it."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.shapes: dict[fx.Node, Any] = {}
        self.ir_args: dict[fx.Node, dict[str, Any]] = {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        self.shapes[n] = summary(out)
        op = definition(n)
        if op is not None:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            self.ir_args[n] = {**op.bind(args, kwargs), "result": out}
        return out


def summary(v: Any) -> Any:
    """A tensor's shape, a list of summaries for a tuple or list, or the type of anything else."""
    if isinstance(v, torch.Tensor):
        return tuple(v.shape)
    if isinstance(v, (tuple, list)) and not isinstance(v, torch.Size):
        return [summary(x) for x in v]
    return type(v)
