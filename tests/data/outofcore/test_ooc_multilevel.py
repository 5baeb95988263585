"""sarcompile.data.outofcore.adjacency and .multilevel: the buckets hold exactly METIS's graph, and
the multilevel partition is valid on any graph and close to METIS's on graphs with blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sarcompile as sc
from sarcompile.data.outofcore import open_edges
from sarcompile.data.outofcore.adjacency import build_buckets
from sarcompile.data.outofcore.budget import MARGIN, Budget
from sarcompile.data.outofcore.multilevel import IMBALANCE, multilevel_partition, refine
from sarcompile.data.assign import _symmetric_csr, assign
from sarcompile.data.synthetic_stream import write_sbm


@st.composite
def edge_lists(draw, max_nodes=60):
    """Graphs with isolated nodes, self-loops, repeated edges and skewed degrees."""
    n = draw(st.integers(1, max_nodes))
    m = draw(st.integers(0, 4 * n))
    hub = draw(st.integers(0, n - 1))
    ends = st.one_of(st.integers(0, n - 1), st.just(hub))  # a hub: skewed degrees
    src = draw(st.lists(ends, min_size=m, max_size=m))
    dst = draw(st.lists(ends, min_size=m, max_size=m))
    return n, np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)


def _edges(tmp_path, n, src, dst):
    np.save(tmp_path / "src.npy", src), np.save(tmp_path / "dst.npy", dst)
    return open_edges(tmp_path / "src.npy", tmp_path / "dst.npy", n)


def _cut(src, dst, parts):
    return int((parts[src] != parts[dst]).sum())


settings.register_profile("ooc", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings(settings.get_profile("ooc"))
@given(graph=edge_lists(), chunk=st.integers(1, 50), bucket=st.integers(1, 40))
def test_buckets_hold_the_symmetric_simple_graph(tmp_path, graph, chunk, bucket):
    n, src, dst = graph
    buckets = build_buckets(_edges(tmp_path, n, src, dst), tmp_path, chunk, bucket)
    blocks = list(buckets.blocks())
    assert [b.lo for b in blocks] == buckets.bounds[:-1].tolist() and blocks[-1].hi == n
    for b in blocks:  # each bucket: its node range's entries only, sorted
        assert ((b.a >= b.lo) & (b.a < b.hi)).all()
    a = np.concatenate([b.a for b in blocks])
    adj = np.concatenate([b.b for b in blocks])
    xadj, want = _symmetric_csr(sc.Graph.from_edges(torch.from_numpy(src), torch.from_numpy(dst), n))
    np.testing.assert_array_equal(adj, want)
    np.testing.assert_array_equal(np.bincount(a, minlength=n), np.diff(xadj))


@settings(settings.get_profile("ooc"))
@given(graph=edge_lists(max_nodes=400), k=st.integers(1, 5), room=st.integers(1, 64), seed=st.integers(0, 3))
def test_every_node_gets_one_part_whatever_the_graph(tmp_path, graph, k, room, seed):
    n, src, dst = graph
    buckets = build_buckets(_edges(tmp_path, n, src, dst), tmp_path, 64, 32)
    budget = Budget(limit=MARGIN + room * 2**14, baseline=0)  # METIS takes only small graphs
    try:
        parts = multilevel_partition(buckets.blocks, n, k, budget, seed)
    except sc.PartitionError as e:  # a graph that cannot be coarsened enough: said so, never wrong
        assert "coarsening stalled" in str(e) and "--memory-limit" in str(e)
        return
    assert parts.shape == (n,) and parts.dtype == np.int64
    assert parts.min() >= 0 and parts.max() < k
    again = multilevel_partition(buckets.blocks, n, k, budget, seed)
    np.testing.assert_array_equal(parts, again)


@settings(settings.get_profile("ooc"))
@given(graph=edge_lists(max_nodes=200), k=st.integers(2, 5), seed=st.integers(0, 100))
def test_refinement_never_raises_the_cut_nor_breaks_balance(tmp_path, graph, k, seed):
    n, src, dst = graph
    buckets = build_buckets(_edges(tmp_path, n, src, dst), tmp_path, 64, 32)
    parts = np.random.default_rng(seed).integers(0, k, n)
    keep = src != dst
    before, sizes = _cut(src[keep], dst[keep], parts), np.bincount(parts, minlength=k)
    cap = max(int(np.ceil(n / k * IMBALANCE)), int(sizes.max()))
    refine(buckets.blocks, parts, k)
    # Duplicate edges count once in what refinement sees: judge it on the simple graph.
    simple = np.unique(np.stack([np.minimum(src, dst), np.maximum(src, dst)])[:, keep], axis=1)
    start = np.random.default_rng(seed).integers(0, k, n)
    assert _cut(*simple, parts) <= _cut(*simple, start), (before, _cut(src[keep], dst[keep], parts))
    assert np.bincount(parts, minlength=k).max() <= cap


@pytest.fixture(scope="module")
def blocks_graph(tmp_path_factory):
    """20k nodes in 8 planted blocks (90% of edges inside one), ids interleaving the blocks."""
    out = tmp_path_factory.mktemp("sbm")
    g = write_sbm(out, num_nodes=20_000, avg_degree=10, num_blocks=8, p_in=0.9, seed=1)
    return g, np.load(g.files["src"]), np.load(g.files["dst"])


def test_on_planted_blocks_the_cut_is_close_to_metis_and_far_below_random(tmp_path, blocks_graph):
    g, src, dst = blocks_graph
    k = 8
    buckets = build_buckets(open_edges(*g.edges(), g.num_nodes), tmp_path, 1 << 14, 1 << 14)
    budget = Budget(limit=MARGIN + 2**24, baseline=0)  # 16 MiB: METIS sees only a coarse graph
    parts = multilevel_partition(buckets.blocks, g.num_nodes, k, budget, seed=0)
    whole = sc.Graph.from_edges(torch.from_numpy(src), torch.from_numpy(dst), g.num_nodes)
    metis = assign(whole, k, "metis").numpy()
    rand = assign(whole, k, "random").numpy()
    ours, theirs, random = _cut(src, dst, parts), _cut(src, dst, metis), _cut(src, dst, rand)
    assert ours <= 1.3 * theirs, (ours, theirs)
    assert 2 * ours <= random, (ours, random)
    assert np.bincount(parts, minlength=k).max() <= np.ceil(g.num_nodes / k * IMBALANCE)
