"""sc.Graph: constructors, queries, the CSR block, and the errors bad input gets."""

from __future__ import annotations

from collections import Counter
from unittest.mock import patch

import networkx as nx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.data import Data

import sarcompile as sc
from sarcompile.errors import GraphError
from sarcompile.graph import graph as graph_module
from sarcompile.graph.graph import Block


def T(values):
    return torch.tensor(values, dtype=torch.long)


def edge_list(g: sc.Graph) -> list[tuple[int, int]]:
    return list(zip(g.src.tolist(), g.dst.tolist()))


@st.composite
def edges(draw, max_nodes: int = 30, max_edges: int = 120):
    n = draw(st.integers(1, max_nodes))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=max_edges))
    if pairs and draw(st.booleans()):  # explicit multi-edges and self-loops
        pairs += draw(st.lists(st.sampled_from(pairs), max_size=5))
        pairs += [(v, v) for v in draw(st.lists(st.integers(0, n - 1), max_size=3))]
    src = T([p[0] for p in pairs]) if pairs else torch.empty(0, dtype=torch.long)
    dst = T([p[1] for p in pairs]) if pairs else torch.empty(0, dtype=torch.long)
    return src, dst, n


# -- from_edges and the basic queries -----------------------------------------------------------


def test_docstring_example():
    g = sc.Graph.from_edges(T([0, 1, 2]), T([1, 2, 1]), num_nodes=4)
    assert (g.num_nodes, g.num_edges) == (4, 3)
    assert g.in_degrees().tolist() == [0, 2, 1, 0]


def test_from_edges_keeps_edges_as_given():
    src, dst = T([2, 0, 0, 3, 3, 1]), T([2, 1, 1, 0, 0, 1])  # self-loop, multi-edges
    g = sc.Graph.from_edges(src, dst, 6)  # nodes 4 and 5 are isolated
    assert g.num_nodes == 6 and g.num_edges == 6
    assert torch.equal(g.src, src) and torch.equal(g.dst, dst)
    assert g.src.dtype == torch.long and g.dst.dtype == torch.long
    assert g.in_degrees().tolist() == [2, 3, 1, 0, 0, 0]
    assert g.in_degrees().dtype == torch.long


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.int8, torch.uint8])
def test_from_edges_accepts_other_integer_dtypes(dtype):
    g = sc.Graph.from_edges(torch.tensor([0, 1], dtype=dtype), torch.tensor([1, 2], dtype=dtype), 3)
    assert g.src.dtype == torch.long and edge_list(g) == [(0, 1), (1, 2)]


def test_from_edges_accepts_python_int_lists():
    g = sc.Graph.from_edges([0, 1], [1, 1], 2)
    assert edge_list(g) == [(0, 1), (1, 1)]


def test_from_edges_accepts_empty_python_lists():
    g = sc.Graph.from_edges([], [], 3)
    assert g.num_nodes == 3 and g.num_edges == 0


def test_empty_graph():
    g = sc.Graph.from_edges(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), 3)
    assert g.num_nodes == 3 and g.num_edges == 0
    assert g.in_degrees().tolist() == [0, 0, 0]
    assert g.block.indptr.tolist() == [0, 0, 0, 0]
    assert g.block.col.numel() == 0 and g.block.row.numel() == 0
    g0 = sc.Graph.from_edges(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), 0)
    assert g0.num_nodes == 0 and g0.in_degrees().numel() == 0


@given(edges())
@settings(max_examples=30, deadline=None)
def test_in_degrees_count_every_in_edge(e):
    src, dst, n = e
    g = sc.Graph.from_edges(src, dst, n)
    expected = Counter(dst.tolist())
    assert g.in_degrees().tolist() == [expected[v] for v in range(n)]
    assert g.num_edges == src.numel()


# -- remove_self_loops --------------------------------------------------------------------------


def test_remove_self_loops():
    g = sc.Graph.from_edges(T([0, 1, 1, 2, 2, 0]), T([0, 1, 2, 2, 0, 1]), 4)
    h = g.remove_self_loops()
    assert isinstance(h, sc.Graph)
    assert h.num_nodes == 4
    assert edge_list(h) == [(1, 2), (2, 0), (0, 1)]  # order of the remaining edges kept
    assert h.in_degrees().tolist() == [1, 1, 1, 0]
    # The original is untouched and the result is cached.
    assert g.num_edges == 6
    assert g.remove_self_loops() is h
    assert h.remove_self_loops().num_edges == 3


@given(edges())
@settings(max_examples=30, deadline=None)
def test_remove_self_loops_random(e):
    src, dst, n = e
    g = sc.Graph.from_edges(src, dst, n)
    h = g.remove_self_loops()
    assert edge_list(h) == [(u, v) for u, v in edge_list(g) if u != v]


# -- from_pyg -----------------------------------------------------------------------------------


def test_from_pyg():
    ei = T([[0, 1, 1, 3, 3], [1, 2, 2, 3, 0]])
    data = Data(edge_index=ei, num_nodes=6)
    g = sc.Graph.from_pyg(data)
    assert g.num_nodes == 6 and g.num_edges == 5
    assert edge_list(g) == [(0, 1), (1, 2), (1, 2), (3, 3), (3, 0)]  # edge_index[0] -> edge_index[1]
    assert g.in_degrees().tolist() == [1, 1, 2, 1, 0, 0]


def test_from_pyg_num_nodes_from_x():
    data = Data(edge_index=T([[0], [1]]), x=torch.randn(5, 2))
    g = sc.Graph.from_pyg(data)
    assert g.num_nodes == 5 and edge_list(g) == [(0, 1)]


def test_from_pyg_errors():
    with pytest.raises(GraphError, match="edge_index"):
        sc.Graph.from_pyg(Data(x=torch.randn(3, 2)))
    with pytest.raises(GraphError, match="integer"):
        sc.Graph.from_pyg(Data(edge_index=torch.tensor([[0.0], [1.0]]), num_nodes=2))
    with pytest.raises(GraphError, match=r"\[0, 2\)"):
        sc.Graph.from_pyg(Data(edge_index=T([[0], [5]]), num_nodes=2))


# -- from_networkx ------------------------------------------------------------------------------


def test_from_networkx_directed_as_is():
    G = nx.DiGraph()
    G.add_nodes_from(range(5))
    G.add_edges_from([(0, 1), (1, 0), (2, 2), (3, 1)])
    g = sc.Graph.from_networkx(G)
    assert g.num_nodes == 5 and g.num_edges == 4
    assert Counter(edge_list(g)) == Counter([(0, 1), (1, 0), (2, 2), (3, 1)])
    assert g.in_degrees().tolist() == [1, 2, 1, 0, 0]


def test_from_networkx_undirected_both_ways_self_loops_once():
    G = nx.Graph()
    G.add_nodes_from(range(5))  # node 4 isolated
    G.add_edges_from([(0, 1), (1, 2), (3, 3)])
    g = sc.Graph.from_networkx(G)
    assert g.num_nodes == 5
    assert Counter(edge_list(g)) == Counter([(0, 1), (1, 0), (1, 2), (2, 1), (3, 3)])
    assert g.num_edges == 5
    assert g.in_degrees().tolist() == [1, 2, 1, 1, 0]


def test_from_networkx_numbers_nodes_in_node_order():
    G = nx.DiGraph()
    G.add_nodes_from(["c", "a", "b"])
    G.add_edges_from([("a", "b"), ("c", "a")])
    g = sc.Graph.from_networkx(G)
    ids = {"c": 0, "a": 1, "b": 2}
    assert Counter(edge_list(g)) == Counter([(ids["a"], ids["b"]), (ids["c"], ids["a"])])


def test_from_networkx_multigraph_keeps_parallel_edges():
    G = nx.MultiDiGraph()
    G.add_nodes_from(range(3))
    G.add_edges_from([(0, 1), (0, 1), (2, 2)])
    g = sc.Graph.from_networkx(G)
    assert Counter(edge_list(g)) == Counter([(0, 1), (0, 1), (2, 2)])
    U = nx.MultiGraph()
    U.add_nodes_from(range(3))
    U.add_edges_from([(0, 1), (0, 1), (2, 2)])
    gu = sc.Graph.from_networkx(U)
    assert Counter(edge_list(gu)) == Counter([(0, 1), (0, 1), (1, 0), (1, 0), (2, 2)])


def test_from_networkx_empty():
    G = nx.Graph()
    G.add_nodes_from(range(3))
    g = sc.Graph.from_networkx(G)
    assert g.num_nodes == 3 and g.num_edges == 0


@given(edges(max_nodes=15, max_edges=40))
@settings(max_examples=30, deadline=None)
def test_from_networkx_undirected_random(e):
    src, dst, n = e
    G = nx.Graph()
    G.add_nodes_from(range(n))
    G.add_edges_from(zip(src.tolist(), dst.tolist()))
    g = sc.Graph.from_networkx(G)
    expected = Counter()
    for u, v in G.edges():
        expected[(u, v)] += 1
        if u != v:
            expected[(v, u)] += 1
    assert Counter(edge_list(g)) == expected
    assert g.num_edges == 2 * G.number_of_edges() - nx.number_of_selfloops(G)


# -- the CSR block ------------------------------------------------------------------------------


@given(edges())
@settings(max_examples=30, deadline=None)
def test_block_is_csr_by_destination(e):
    src, dst, n = e
    g = sc.Graph.from_edges(src, dst, n)
    b, perm = g.block, g.csr_perm
    E = src.numel()
    assert b.num_dst == n and b.num_src == n and b.num_edges == E
    assert torch.equal(b.src_gids, torch.arange(n))
    # csr_perm: a permutation of the edge ids, sorted by destination, stable.
    assert sorted(perm.tolist()) == list(range(E))
    keyed = [(int(dst[i]), int(i)) for i in perm]
    assert keyed == sorted(keyed)
    # indptr: in-degree prefix sums.
    assert b.indptr.tolist()[0] == 0 and b.indptr.numel() == n + 1
    assert torch.equal(b.indptr[1:] - b.indptr[:-1], g.in_degrees())
    # col / row: the edges in CSR order.
    assert torch.equal(b.col, src[perm]) and torch.equal(b.row, dst[perm])
    for v in range(n):
        lo, hi = int(b.indptr[v]), int(b.indptr[v + 1])
        assert b.col[lo:hi].tolist() == [int(src[i]) for i in range(E) if int(dst[i]) == v]
        assert b.row[lo:hi].tolist() == [v] * (hi - lo)
    # As a sparse matrix: the dense adjacency-count matrix A[v, u] = #edges u->v.
    A = torch.zeros(n, n, dtype=torch.float64)
    for u, v in zip(src.tolist(), dst.tolist()):
        A[v, u] += 1
    w = torch.arange(E, dtype=torch.float64) + 1
    W = torch.zeros(n, n, dtype=torch.float64)
    for i, (u, v) in enumerate(zip(src.tolist(), dst.tolist())):
        W[v, u] += w[i]
    scale = torch.arange(n, dtype=torch.float64) + 2  # one value per destination row
    # As tiles of any width: the same matrix, weights in tile order (forward tiles keep
    # no order: they take weights spread per row; unsplit, they take the CSR's order).
    for width in (1, 2, 3, n + 1):
        with patch.object(graph_module, "TILE_ROWS", width), patch.object(graph_module, "TILE_OFFSETS", 1e9):
            b = sc.Graph.from_edges(src, dst, n).block  # (tiles are kept per block)
            fwd, bwd = b.tiles(), b.tiles(transposed=True, with_order=True)
            assert len(fwd.indptr) == len(bwd.indptr) == (max(-(-n // width), 1) if E else 1)  # (no edges: no offsets paid for)
            assert torch.equal(_dense(fwd), A) and torch.equal(_dense(bwd), A.T)
            assert torch.equal(_dense(bwd, w[perm][bwd.order.long()]), W.T)
            assert torch.equal(_dense(fwd, fwd.per_row(scale)), scale[:, None] * A)
            assert torch.equal(_dense(bwd, bwd.per_col(scale)), (scale[:, None] * A).T)
            assert torch.equal(_dense(b.tiles(split=False), w[perm]), W)
            assert sc.Graph.from_edges(src, dst, n).block.tiles(transposed=True).order is None  # (kept only when asked)


def _dense(tiles, values=None) -> torch.Tensor:
    out = torch.zeros(tiles.shape, dtype=torch.float64)
    for rows, a in tiles.matrices(values, torch.float64):
        out[:, rows] += a.to_dense()
    return out


# -- errors -------------------------------------------------------------------------------------


def test_error_float_ids():
    with pytest.raises(GraphError, match=r"src must be an integer tensor.*float") as ei:
        sc.Graph.from_edges(torch.tensor([0.0, 1.0]), T([1, 0]), 2)
    assert isinstance(ei.value, ValueError)  # GraphError is also a ValueError
    with pytest.raises(GraphError, match=r"dst must be an integer tensor.*float"):
        sc.Graph.from_edges(T([1, 0]), torch.tensor([0.0, 1.0], dtype=torch.float64), 2)
    with pytest.raises(GraphError, match=r"integer.*bool"):
        sc.Graph.from_edges(torch.tensor([True]), torch.tensor([False]), 2)


def test_error_2d_ids():
    with pytest.raises(GraphError, match=r"src must be 1-D.*\(2, 3\)"):
        sc.Graph.from_edges(torch.zeros(2, 3, dtype=torch.long), T([0, 0, 0]), 2)
    with pytest.raises(GraphError, match=r"dst must be 1-D.*\(3, 1\)"):
        sc.Graph.from_edges(T([0, 0, 0]), torch.zeros(3, 1, dtype=torch.long), 2)
    with pytest.raises(GraphError, match=r"src must be 1-D"):
        sc.Graph.from_edges(torch.tensor(0), torch.tensor(0), 2)


def test_error_mismatched_lengths():
    with pytest.raises(GraphError, match=r"src has 3 entries but dst has 2"):
        sc.Graph.from_edges(T([0, 1, 2]), T([0, 1]), 3)


def test_error_ids_out_of_range():
    with pytest.raises(GraphError, match=r"\[0, 3\).*from 0 to 3.*num_nodes"):
        sc.Graph.from_edges(T([0, 1]), T([3, 0]), 3)
    with pytest.raises(GraphError, match=r"\[0, 3\).*to 7"):
        sc.Graph.from_edges(T([7]), T([0]), 3)
    with pytest.raises(GraphError, match=r"\[0, 0\)"):
        sc.Graph.from_edges(T([0]), T([0]), 0)


def test_error_negative_ids():
    with pytest.raises(GraphError, match=r"\[0, 3\).*from -1"):
        sc.Graph.from_edges(T([0, -1]), T([1, 2]), 3)
    with pytest.raises(GraphError, match=r"from -5"):
        sc.Graph.from_edges(T([0, 1]), T([-5, 2]), 3)


def test_error_negative_num_nodes():
    with pytest.raises(GraphError, match=r"num_nodes must be >= 0, got -1"):
        sc.Graph.from_edges(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), -1)
    with pytest.raises(GraphError, match=r"num_nodes.*-2"):
        sc.Graph.from_edges(T([0]), T([0]), -2)


@pytest.mark.parametrize("upto", [None, 3])
@pytest.mark.parametrize("method", ["plus_self_loops", "with_self_loops", "remove_self_loops"])
def test_derived_graphs_agree_on_a_graph_and_its_shards(method, upto):
    """The edges (source, destination, edge id) of a derived graph are those of the whole
    graph's, split by destination over the shards; loops added twice get distinct ids."""
    from sarcompile.graph.shard import ShardGraph, split_graph

    g = sc.Graph.from_edges([0, 1, 2, 2, 4, 1], [1, 1, 2, 2, 0, 3], num_nodes=6)
    args = () if method == "remove_self_loops" else (upto,)
    whole = getattr(g, method)(*args)
    want = Counter(zip(whole.src.tolist(), whole.dst.tolist(), whole.edge_ids.tolist()))
    if method == "plus_self_loops":
        assert sum(s == d for s, d, _ in want.elements()) == 3 + (6 if upto is None else 3)
        twice = whole.plus_self_loops()
        assert twice.edge_ids.unique().numel() == twice.num_edges
    got = Counter()
    for r, part in enumerate(split_graph(g, torch.tensor([0, 1, 0, 1, 1, 0]), 2)):
        shard = getattr(ShardGraph.from_part(part, r, 2, g.num_nodes, g.num_edges), method)(*args)
        for q, block in enumerate(shard.blocks):
            lo = shard.edge_ptr[q]
            for i in range(block.num_edges):
                got[(int(block.src_gids[block.col[i]]), int(shard.global_ids[block.row[i]]),
                     int(shard.edge_ids[lo + i]))] += 1
        assert torch.equal(shard.loop_mask, torch.cat([b.src_gids[b.col] for b in shard.blocks])
                           == shard.global_ids[shard.dst_index])
    assert got == want


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 6), st.integers(0, 5), st.data())
def test_block_per_edge_values_and_transpose_without_keeping_rows(num_dst, num_src, data):
    edges = data.draw(st.lists(st.tuples(st.integers(0, max(num_dst - 1, 0)), st.integers(0, max(num_src - 1, 0))),
                               max_size=12 if num_dst and num_src else 0))
    edges.sort(key=lambda e: e[0])  # CSR by destination, rows with no edges included
    dst, src = T([e[0] for e in edges]), T([e[1] for e in edges])
    indptr = torch.cat([T([0]), torch.cumsum(torch.bincount(dst, minlength=num_dst), 0)])
    values = torch.randn(num_dst, 3)
    b = Block(indptr, src, num_src, torch.arange(num_src))
    assert torch.equal(b.per_edge(values), values[dst])
    # The transpose's rows without the per-edge destination index made and kept for it.
    order = sorted(range(len(edges)), key=lambda i: (edges[i][1], i))
    t = b.tiles(transposed=True, split=False, with_order=True)
    assert t.col.tolist() == [edges[i][0] for i in order] and t.order.tolist() == order
    assert "row" not in vars(b)
    assert b.row.tolist() == dst.tolist()
