"""The example shard a plan runs the program on once, and how its sizes map onto each worker's.

:func:`sarcompile.plan.build.build_plan` learns every row width, saved tensor and op argument from
one run of the partitioned program on a small one-worker shard. The shard's sizes are all
distinct numbers, so a saved tensor with an axis of the probe's node count scales with
each worker's node count, one with an axis of an edge count with that graph's edges.

* :class:`ShardProbe`: a one-type program, ``forward(g, x)`` (or PyG's ``forward(x,
  edge_index)``) on one graph of 101 nodes and 307 edges, 7 of them self-loops.
* :class:`TypedShardProbe`: a program over a typed graph, whose inputs are leaves
  (:mod:`sarcompile.compile.leaves`): every node type gets a row count of its own and every
  relation an edge count of its own, and each op is priced on the sizes of the relation it
  aggregates over. Node tables (:mod:`sarcompile.graph.tables`) are inputs too: a worker holds its
  rows of each, which the plan counts per worker, apart from the replicated parameters.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Callable

import torch
import torch.fx as fx

from sarcompile.errors import CompileError
from sarcompile.graph.graph import Graph, probe_graph, probe_relation, tile_count
from sarcompile.graph.hetero import Relation
from sarcompile.graph.shard import DERIVED_GRAPHS, ShardGraph
from sarcompile.plan.sizes import TypedWorkerStats, WorkerStats
from sarcompile.ir.node_info import info
from sarcompile.ir.vocab import Residency

__all__ = ["ShardProbe", "TypedShardProbe", "graph_bytes", "probe_for"]

_LOOPS = 7  # self-loops of a probe graph within one node type
def _device(gm: fx.GraphModule, x: Any) -> torch.device | None:
    """Where the probe's example rows go: where the program computes, its parameters' (or
    buffers') device -- the example ``x`` gives only shapes and dtypes, and may be on
    ``meta`` -- else ``x``'s, else torch's default."""
    held = next((t.device for t in (*gm.parameters(), *gm.buffers())), None)
    return held if held is not None else (x.device if isinstance(x, torch.Tensor) else None)


def probe_for(gm: fx.GraphModule, x: Any) -> "ShardProbe | TypedShardProbe":
    """The probe of program ``gm``: typed when its graph inputs are relations."""
    typed = any(n.op == "placeholder" and _spec(n) is not None and _spec(n).of is not None for n in gm.graph.nodes)
    return TypedShardProbe(gm, x) if typed else ShardProbe(gm, x)


def _spec(node: fx.Node) -> Any:
    return info(node).input


def graph_input(node: fx.Node) -> fx.Node | None:
    """The placeholder an IR op's graph argument comes from (directly, or through graph
    methods such as ``with_self_loops()``)."""
    g = node.args[0] if node.args else None
    while isinstance(g, fx.Node) and g.op != "placeholder" and g.args:
        g = g.args[0]
    return g if isinstance(g, fx.Node) and g.op == "placeholder" else None


def _derived(gm: fx.GraphModule) -> dict[fx.Node | None, set[str]]:
    """Per graph input, the derived graphs (with self-loops, ...) the program makes of it."""
    out: dict[fx.Node | None, set[str]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_method" and node.target in DERIVED_GRAPHS:
            out.setdefault(graph_input(node), set()).add(node.target)
    return out


def graph_bytes(w: WorkerStats, r: int, derived: set[str]) -> int:
    """The shard's index tensors once a training step has built them all: node ids, the
    rows it sends and the remote source ids (int64); edge ids (int32, as ShardGraph keeps
    them where they fit); per block, int32 as graph.Block keeps them, the CSR (indptr,
    source rows), its transposed tiles (order, rows, an indptr per tile) and, where its
    source rows span more than one tile, its forward tiles (the source rows again, an
    indptr per tile; only sum and mean products make them); and the destination of every
    edge (int64). The destinations are kept only by kernels that gather by them across a
    whole block (max, messages); sum and mean products, and attention (one row range at a
    time), make none to keep, so for those this is 8 bytes per edge high (4 for a mean,
    which keeps its 1/deg per edge); the transposed tiles' order, 4 bytes per edge, only
    where weights come in CSR order. A derived graph (with self-loops, say) shares the
    remote blocks and adds a local block with one self-loop per node, and its own edge ids."""
    halo = sum(w.halo)
    sent = halo  # the rows peers read from us: about as many as we read from them
    wide = w.nodes + sent + halo + w.edges
    sources = [w.nodes if q == r else rows for q, rows in enumerate(w.halo)]
    narrow = 4 * w.edges + sum(_block_ints(w.nodes, src, edges) for src, edges in zip(sources, w.block_edges))
    local = w.block_edges[r] - w.self_loops + w.nodes if w.block_edges else w.nodes
    derived_edges = w.edges - w.self_loops + w.nodes
    wide_extra, narrow_extra = local, derived_edges + 3 * local + _block_ints(w.nodes, w.nodes, local)
    return 8 * (wide + len(derived) * wide_extra) + 4 * (narrow + len(derived) * narrow_extra)


def _block_ints(dst: int, src: int, edges: int) -> int:
    """A block's int32s beyond three per edge (its CSR's rows, the transposed tiles' order
    and rows): the CSR's indptr, the transposed tiles' indptrs, and the forward tiles
    where there is more than one (graph.Block.tiles)."""
    tiles, transposed = tile_count((dst, src), edges), tile_count((src, dst), edges)
    forward = edges + tiles * (dst + 1) if tiles > 1 else 0
    return (dst + 1) + transposed * (src + 1) + forward


def _graph_sizes(nodes: int, edges: int, loops: int, w: WorkerStats) -> dict[int, int]:
    """A probe graph's node count and the edge counts of its variants (without its
    self-loops, with one per node), each mapped to worker ``w``'s."""
    return {
        nodes: w.nodes,
        edges: w.edges,
        edges - loops: w.edges - w.self_loops,
        edges - loops + nodes: w.edges - w.self_loops + w.nodes,
    }


class ShardProbe:
    """A one-type program's probe (see the module docstring)."""

    NODES, EDGES = 101, 307

    def __init__(self, gm: fx.GraphModule, x: torch.Tensor):
        if not isinstance(x, torch.Tensor):
            raise CompileError(f"a one-type model is planned with an example tensor x, got {type(x).__name__}")
        self.gm, self.x, self.device = gm, x, _device(gm, x)
        self.shard = ShardGraph.single(probe_graph(self.NODES, self.EDGES, _LOOPS))
        self.tables: list[tuple[str, str, int]] = []  # a one-type graph has no node tables

    def inputs(self) -> list[Any]:
        """The probe's arguments in the program's order: the graph where the program takes
        it, ``x``'s rows for the first other input, defaults for optional ones."""
        graph = next((g for n in self.gm.graph.nodes if (g := _halo_graph(n)) is not None), None)
        x = torch.zeros((self.shard.num_nodes, *self.x.shape[1:]), dtype=self.x.dtype, device=self.device)
        x.requires_grad_(self.x.requires_grad)
        inputs, x_given = [], False
        for node in self.gm.graph.nodes:
            if node.op != "placeholder":
                continue
            if node is graph or _one_type_graph(node):  # (another graph of a list, a graph kept on the model)
                inputs.append(self._shard(_spec(node)))
            elif not x_given:
                inputs.append(x)
                x_given = True
            else:
                inputs.append(_default(node))
        return inputs

    def _shard(self, spec: Any) -> ShardGraph:
        """The example shard; with adjacency values where the program's graph has them (its
        input's ``dtype``, see :func:`~sarcompile.ir.probe.example`)."""
        if spec is None or spec.dtype is None:
            return self.shard
        g = probe_graph(self.NODES, self.EDGES, _LOOPS)
        g.adj_values = torch.ones(g.num_edges, dtype=spec.dtype)
        return ShardGraph.single(g)

    def features(self, inputs: list[Any]) -> list[torch.Tensor]:
        """Of :meth:`inputs`, what :meth:`node_data_bytes` counts: ``x``'s rows, the first
        input that is not a graph."""
        graph = next((g for n in self.gm.graph.nodes if (g := _halo_graph(n)) is not None), None)
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        return next(([a] for a, n in zip(inputs, placeholders) if n is not graph and not _one_type_graph(n)), [])

    def sizes(self, w: WorkerStats) -> dict[int, int]:
        return _graph_sizes(self.NODES, self.EDGES, _LOOPS, w)

    def stats(self, node: fx.Node, workers: list[WorkerStats]) -> list[WorkerStats]:
        """The sizes per worker of the graph IR op ``node`` aggregates over."""
        return workers

    def relation(self, node: fx.Node) -> Relation | None:
        return None

    def graph_bytes(self, w: WorkerStats, r: int) -> int:
        derived = set().union(*_derived(self.gm).values())
        return graph_bytes(w, r, derived)

    def node_data_bytes(self, w: WorkerStats) -> int:
        # planned without a partition's files: the features alone
        return w.node_data_bytes or w.nodes * math.prod(self.x.shape[1:]) * self.x.element_size()

    def table_bytes(self, w: WorkerStats) -> int:
        return 0


def _halo_graph(node: fx.Node) -> fx.Node | None:
    op = info(node).ir_op
    return None if op is None or op.exchange is None else graph_input(node)


def _one_type_graph(node: fx.Node) -> bool:
    spec = _spec(node)
    return spec is not None and spec.residency is Residency.GRAPH and spec.of is None


def _default(node: fx.Node) -> Any:
    """The value a plain Python argument was traced with, an optional input's default, or a
    refusal naming it."""
    if info(node).constant is not None:
        return info(node).constant[0]
    if node.args:
        return node.args[0]
    raise CompileError(
        f"plan() runs the model on an example shard with a graph and node features only, but its forward "
        f"also needs {node.target!r}; give it a default (e.g. None) or plan a model without it"
    )


class TypedShardProbe:
    """A typed program's probe (see the module docstring). ``x`` gives the example
    features per node type (only their trailing shapes, dtypes and whether they require
    grad count); a per-node input of another type gets its call's trailing shape."""

    def __init__(self, gm: fx.GraphModule, x: dict[str, torch.Tensor] | None):
        if x is not None and not isinstance(x, dict):
            raise CompileError(f"a model over a typed graph is planned with a dict of example features per node "
                               f"type (x={{'paper': ...}}), got {type(x).__name__}")
        self.gm, self.x = gm, dict(x or {})
        self.device = _device(gm, next(iter(self.x.values()), None))
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        relations = [_spec(n).of for n in placeholders if _spec(n) is not None and _spec(n).residency is Residency.GRAPH]
        types = list(dict.fromkeys([t for s, _, d in relations for t in (s, d)]
                                   + [_spec(n).of for n in placeholders
                                      if _spec(n) is not None and _spec(n).residency is Residency.NODE]
                                   + list(self.x)))
        # Every size distinct: node counts from 101, edge counts (with their variants) from 307.
        taken: set[int] = set()
        self.counts = {t: _fresh(taken, 101, lambda n: {n}) for t in types}
        self.edges: dict[Relation, int] = {}
        for rel in relations:
            loops = _LOOPS if rel[0] == rel[2] else 0
            self.edges[rel] = _fresh(taken, 307, lambda e, d=self.counts[rel[2]], k=loops: {e, e - k, e - k + d})
        self.graphs = {
            rel: ShardGraph.single(_relation_graph(rel, self.counts[rel[0]], self.counts[rel[2]], e))
            for rel, e in self.edges.items()
        }
        # (parameter path, node type, bytes of one row) of each node table
        self.tables = [(info(n).table, _spec(n).of, _row_bytes(_spec(n))) for n in placeholders
                       if info(n).table is not None]

    def inputs(self) -> list[Any]:
        inputs = []
        for node in self.gm.graph.nodes:
            if node.op != "placeholder":
                continue
            spec = _spec(node)
            if spec is None:
                inputs.append(_default(node))
            elif spec.shape is None and spec.residency is not Residency.GRAPH:
                inputs.append(spec.value)
            elif spec.residency is Residency.GRAPH:
                inputs.append(self.graphs[spec.of])
            else:
                inputs.append(self._rows(node, spec))
        return inputs

    def features(self, inputs: list[Any]) -> list[torch.Tensor]:
        """Of :meth:`inputs`, what :meth:`node_data_bytes` counts: the rows of the node
        types ``x`` gives features for (not node tables: those are parameters)."""
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        return [a for a, n in zip(inputs, placeholders) if (spec := _spec(n)) is not None
                and spec.residency is Residency.NODE and info(n).table is None and spec.of in self.x]

    def _rows(self, node: fx.Node, spec: Any) -> torch.Tensor:
        """An example tensor for a per-node, per-edge or constant input."""
        example = self.x.get(spec.of) if spec.residency is Residency.NODE and info(node).table is None else None
        dtype = example.dtype if example is not None else (spec.dtype or torch.get_default_dtype())
        tail = tuple(example.shape[1:]) if example is not None else tuple(spec.shape[1:])
        rows = {Residency.NODE: lambda: self.counts[spec.of], Residency.EDGE: lambda: self.edges[spec.of]}
        if spec.residency not in rows:
            return torch.zeros(spec.shape, dtype=dtype, device=self.device)
        t = torch.zeros((rows[spec.residency](), *tail), dtype=dtype, device=self.device)
        # A node table is a parameter; features require grad as the example does.
        grad = info(node).table is not None or (example is not None and example.requires_grad)
        return t.requires_grad_(grad and dtype.is_floating_point)

    def sizes(self, w: TypedWorkerStats) -> dict[int, int]:
        out = {self.counts[t]: w.nodes.get(t, 0) for t in self.counts}
        for rel, e in self.edges.items():
            out |= _graph_sizes(self.counts[rel[2]], e, _LOOPS if rel[0] == rel[2] else 0, w.relations[rel])
        return out

    def relation(self, node: fx.Node) -> Relation | None:
        """The relation IR op ``node`` aggregates over."""
        g = graph_input(node)
        spec = _spec(g) if g is not None else None
        if spec is None or spec.residency is not Residency.GRAPH:
            raise CompileError(f"the plan cannot tell which relation {node.name} aggregates over")
        return spec.of

    def stats(self, node: fx.Node, workers: list[TypedWorkerStats]) -> list[WorkerStats]:
        rel = self.relation(node)
        return [w.relations[rel] for w in workers]

    def graph_bytes(self, w: TypedWorkerStats, r: int) -> int:
        derived = {_spec(g).of: names for g, names in _derived(self.gm).items() if g is not None}
        return sum(graph_bytes(s, r, derived.get(rel, set())) for rel, s in w.relations.items())

    def node_data_bytes(self, w: TypedWorkerStats) -> int:
        if w.node_data_bytes:
            return w.node_data_bytes
        return sum(w.nodes.get(t, 0) * math.prod(x.shape[1:]) * x.element_size() for t, x in self.x.items())

    def table_bytes(self, w: TypedWorkerStats) -> int:
        """The worker's rows of every node table."""
        return sum(w.nodes.get(t, 0) * row for _, t, row in self.tables)


def _row_bytes(spec: Any) -> int:
    return math.prod(spec.shape[1:]) * torch.empty(0, dtype=spec.dtype).element_size()


def _fresh(taken: set[int], start: int, variants: Callable[[int], set[int]]) -> int:
    """The smallest prime from ``start`` (no feature width is likely to equal it) whose
    ``variants`` -- the sizes it brings, e.g. a graph's edge counts with and without its
    self-loops -- are all new; they are added to ``taken``."""
    n = start
    while not (all(n % d for d in range(2, math.isqrt(n) + 1)) and not variants(n) & taken):
        n += 1
    taken |= variants(n)
    return n


def _relation_graph(rel: Relation, num_src: int, num_dst: int, edges: int) -> Graph:
    same = rel[0] == rel[2]
    return probe_relation(num_src, num_dst, edges, _LOOPS if same else 0, zlib.crc32("__".join(rel).encode()), same)
