"""The plan's example shard (plan/probe.py): its sizes are distinct (primes where they are
chosen), its inputs have the example's trailing shape, dtype and requires_grad, and each
of its sizes maps onto a worker's as the worker's real shard has them -- checked against
the shards of a small graph partitioned on disk and loaded as a worker loads it."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import sarcompile as sc
from sarcompile.compile.call_shape import CallShape, typed_call
from sarcompile.graph.shard import ShardGraph
from sarcompile.plan.probe import ShardProbe, TypedShardProbe, probe_for
from sarcompile.plan.sizes import worker_stats

W, R, C = ("author", "writes", "paper"), ("paper", "rev_writes", "author"), ("paper", "cites", "paper")


def _prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))


def _loops(shard: ShardGraph) -> int:
    return int(shard.loop_mask.sum())


# What a worker's size is, read off a shard: the probe maps its own onto a worker's.
MEASURES = {
    "nodes": lambda s: s.num_nodes,
    "edges": lambda s: s.num_edges,
    "edges without self-loops": lambda s: s.remove_self_loops().num_edges,
    "edges with one self-loop per node": lambda s: s.with_self_loops().num_edges,
}


class Sage(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = sc.nn.SAGEConv(3, 2)

    def forward(self, g, x):
        return self.conv(g, x)


def _program(model: nn.Module, x, workers=None):
    """The partitioned program a plan probes, for the example ``x`` (per type, with ``workers``)."""
    call = CallShape.default(model.forward, x=x) if workers is None else typed_call(model.forward, workers, x)
    return sc.distribute(model).program(partitioned=True, call=call).module


def _graph(n: int = 30, e: int = 120) -> sc.Graph:
    gen = torch.Generator().manual_seed(1)
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    src[:5], dst[:5] = torch.arange(5), torch.arange(5)  # some self-loops, on one worker's nodes and the other's
    src[5], dst[5] = n - 1, n - 1
    return sc.Graph.from_edges(src, dst, n)


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_type_shard_and_its_inputs(grad, dtype):
    x = torch.randn(7, 3, dtype=dtype, requires_grad=grad)
    gm = _program(Sage().to(dtype), x)
    probe = probe_for(gm, x)
    assert type(probe) is ShardProbe
    shard, rows = probe.inputs()
    assert (shard.num_nodes, shard.num_edges, _loops(shard)) == (101, 307, 7)
    sizes = [m(shard) for m in MEASURES.values()]
    assert sizes == [101, 307, 300, 401] and len(set(sizes)) == 4
    assert _prime(101) and _prime(307)
    assert rows.shape == (101, 3) and rows.dtype == dtype and rows.requires_grad == grad
    assert torch.equal(rows.detach(), torch.zeros(101, 3, dtype=dtype))
    assert probe.features([shard, rows]) == [rows]
    # fresh inputs each time (a run may write into them)
    assert probe.inputs()[1] is not rows
    # the example may be on meta: the probe's rows are where the program computes
    assert probe_for(gm, torch.empty(7, 3, device="meta")).inputs()[1].device == torch.device("cpu")


def test_one_type_sizes_map_onto_each_workers_real_shard(tmp_path):
    g = _graph()
    method = (torch.arange(g.num_nodes) >= 12).long()  # 12 and 18 nodes
    sc.partition(g, 2, tmp_path, node_data={"x": torch.zeros(g.num_nodes, 3)}, method=method)
    x = torch.zeros(1, 3)
    probe = ShardProbe(_program(Sage(), x), x)
    own = probe.inputs()[0]
    for w, r in zip(worker_stats(tmp_path), range(2)):
        real = sc.load_partition(tmp_path, rank=r, world_size=2).graph
        assert _loops(real) > 0
        mapped = probe.sizes(w)
        assert mapped == {m(own): m(real) for m in MEASURES.values()}, r
    # the stats of the graph partitioned in memory are the same
    assert [(a.nodes, a.edges, a.self_loops, a.halo, a.block_edges) for a in worker_stats(g, 2, method)] == [
        (b.nodes, b.edges, b.self_loops, b.halo, b.block_edges) for b in worker_stats(tmp_path)]


def test_one_type_refusals_and_defaults():
    x = torch.zeros(4, 3)

    gm = _program(Sage(), x)
    with pytest.raises(sc.CompileError, match="planned with an example tensor x, got dict"):
        ShardProbe(gm, {"paper": x})

    class Optional(Sage):
        def forward(self, g, x, mask=None):
            return self.conv(g, x) if mask is None else self.conv(g, x) * mask

    gm = _program(Optional(), x)
    assert probe_for(gm, x).inputs()[2:] == [None]


def _typed(counts: dict[str, int]) -> sc.HeteroGraph:
    gen = torch.Generator().manual_seed(2)
    edges = {}
    for rel, e in ((W, 40), (R, 40), (C, 50)):
        s, d = torch.randint(0, counts[rel[0]], (e,), generator=gen), torch.randint(0, counts[rel[2]], (e,), generator=gen)
        if rel == C:
            s[:4], d[:4] = torch.tensor([0, 3, 9, 14]), torch.tensor([0, 3, 9, 14])
        edges[rel] = (s, d)
    return sc.HeteroGraph.from_edges(edges, counts)


class TypedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.author = nn.Parameter(torch.randn(10, 4))  # the authors' node table (named by their type)
        self.writes, self.cites, self.rev = nn.Linear(4, 2), nn.Linear(3, 2), nn.Linear(3, 4)

    def forward(self, g, x):
        paper = self.writes(sc.spmm(g[W], self.author, "mean")) + sc.spmm(g[C].with_self_loops(), self.cites(x["paper"]))
        return {"paper": paper, "author": self.rev(sc.spmm(g[R], x["paper"], "sum")) + self.author}


def test_typed_shard_sizes_are_distinct_primes_and_inputs_follow_the_example():
    counts = {"paper": 16, "author": 10}
    g = _typed(counts)
    workers = worker_stats(g, 2, "contiguous")
    x = {"paper": torch.randn(3, 3, dtype=torch.float64, requires_grad=True)}
    model = TypedNet().double()
    gm = _program(model, x, workers)
    probe = probe_for(gm, x)
    assert type(probe) is TypedShardProbe
    # node counts from 101, edge counts from 307: primes, and every size a graph brings distinct
    assert set(probe.counts) == {"paper", "author"} and set(probe.edges) == {W, R, C}
    assert all(_prime(n) and n >= 101 for n in probe.counts.values())
    assert all(_prime(e) and e >= 307 for e in probe.edges.values())
    sizes = list(probe.counts.values())
    for rel, e in probe.edges.items():
        k = 7 if rel[0] == rel[2] else 0
        sizes += [e] + ([e - k, e - k + probe.counts[rel[2]]] if k else [])
    assert len(sizes) == len(set(sizes)), sizes
    # the graphs, per relation
    for rel, shard in probe.graphs.items():
        assert (shard.num_nodes, shard.num_src_nodes, shard.num_edges) == (
            probe.counts[rel[2]], probe.counts[rel[0]], probe.edges[rel])
    assert _loops(probe.graphs[C]) == 7  # (a bipartite relation's edges join two types: none is a loop)
    # the inputs: each placeholder's, features and the table with their type's rows
    args = probe.inputs()
    by_shape = {tuple(a.shape): a for a in args if isinstance(a, torch.Tensor)}
    paper, author = by_shape[(probe.counts["paper"], 3)], by_shape[(probe.counts["author"], 4)]
    assert paper.dtype == torch.float64 and paper.requires_grad  # as the example
    assert author.dtype == torch.float64 and author.requires_grad  # a table is a parameter
    assert probe.features(args) == [paper]
    assert probe.tables == [("author", "author", 4 * 8)]
    assert sorted(id(a) for a in args if isinstance(a, ShardGraph)) == sorted(map(id, probe.graphs.values()))
    # features that do not require grad give rows that do not
    x = {"paper": torch.randn(3, 3, dtype=torch.float64)}
    args = probe_for(gm, x).inputs()
    assert not next(a for a in args if isinstance(a, torch.Tensor) and a.shape[1:] == (3,)).requires_grad


def test_typed_sizes_map_onto_each_workers_real_shards(tmp_path):
    counts = {"paper": 16, "author": 10}
    g = _typed(counts)
    sc.partition(g, 2, tmp_path, node_data={"paper": {"x": torch.zeros(16, 3)}}, method="contiguous")
    x = {"paper": torch.zeros(1, 3)}
    model = TypedNet()
    workers = worker_stats(tmp_path)
    probe = TypedShardProbe(_program(model, x, workers), x)
    for r, w in enumerate(workers):
        real = sc.load_partition(tmp_path, rank=r, world_size=2).graph
        mapped = probe.sizes(w)
        for rel, own in probe.graphs.items():
            shard = real.relations[rel]
            measures = MEASURES if rel[0] == rel[2] else {"nodes": MEASURES["nodes"], "edges": MEASURES["edges"]}
            for what, m in measures.items():
                assert mapped[m(own)] == m(shard), (r, rel, what)
            assert mapped[own.num_src_nodes] == shard.num_src_nodes, (r, rel)  # a source type's rows
        for t in counts:  # a type's rows: those of a relation into it
            into = next(rel for rel in probe.graphs if rel[2] == t)
            assert mapped[probe.counts[t]] == real.relations[into].num_nodes == w.nodes[t], (r, t)


def test_typed_probe_refuses_a_tensor_example():
    model = TypedNet()
    g = _typed({"paper": 16, "author": 10})
    x = {"paper": torch.zeros(1, 3)}
    gm = _program(model, x, worker_stats(g, 2, "contiguous"))
    with pytest.raises(sc.CompileError, match=r"dict of example features per node type"):
        probe_for(gm, torch.zeros(1, 3))
