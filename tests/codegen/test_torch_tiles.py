"""The torch kernels' products by source-row tiles (``Block.tiles``) against brute-force
dense products. Real graphs get tiles only past ``TILE_ROWS`` (16k) rows, so here the
bound is forced down to a few rows: every block splits into several tiles, some of them
empty, with empty rows, isolated sources and sources that are another set than the
destinations. The same tests run once more with no tiles and the CPU kernel of our own
taking every product (``cpu_spmm.MIN_ENTRIES`` and ``MIN_OPERAND_BYTES`` forced to 0: real
graphs give it only untiled products of 64k entries and more over 16 MiB of rows), where a
C compiler is found. Whole tensors are compared: forward values, accumulation ``into`` a buffer,
the transposed product, weights in CSR order and in tile order (the mean's ``1/deg``),
one per edge and one per edge and head; then the ops built on them (sum, mean, mean into
a buffer, attention) with their gradients, against dense sums and PyG's GAT layer."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import graphs
from gat_cases import compare_gat_with_pyg, make_gat
from test_torch_attention_chunks import block_from

import sarcompile as sc
from sarcompile.codegen import cpu_spmm
from sarcompile.codegen import torch_kernels as T
from sarcompile.graph import graph as graph_module

DT = torch.float64
SETTINGS = settings(max_examples=25, deadline=None)


@pytest.fixture(params=[1, 2, 3, "cpu kernel"], autouse=True)
def tile_rows(request, monkeypatch):
    """Tiles of 1, 2 or 3 rows; or one tile, and the CPU kernel on every product."""
    kernel = request.param == "cpu kernel"
    if kernel and not cpu_spmm.enabled():
        pytest.skip("no C compiler: the CPU kernel is not used here")
    monkeypatch.setattr(cpu_spmm, "MIN_ENTRIES", 0 if kernel else 1 << 62)
    monkeypatch.setattr(cpu_spmm, "MIN_OPERAND_BYTES", 0)
    monkeypatch.setattr(graph_module, "TILE_ROWS", 1 << 30 if kernel else request.param)
    monkeypatch.setattr(graph_module, "TILE_OFFSETS", 1e9)  # tiny graphs: as many tiles as the rows give
    return None if kernel else request.param


@st.composite
def blocks(draw):
    num_dst, num_src = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    pairs = draw(st.lists(st.tuples(st.integers(0, num_dst - 1), st.integers(0, num_src - 1)), max_size=40))
    return block_from(pairs, num_dst, num_src), draw(st.integers(0, 2**31 - 1))


def dense(block, weight=None) -> torch.Tensor:
    """``A[v, u]``: the sum of the weights of the edges u->v (``weight [E]`` or ``[E, H]``, CSR order)."""
    heads = () if weight is None or weight.dim() == 1 else (weight.shape[1],)
    out = torch.zeros(block.num_dst, block.num_src, *heads, dtype=DT)
    for v in range(block.num_dst):
        for e in range(int(block.indptr[v]), int(block.indptr[v + 1])):
            out[v, int(block.col[e])] += 1.0 if weight is None else weight[e]
    return out


@given(blocks())
@SETTINGS
def test_products_by_tiles_equal_the_dense_product(case):
    block, seed = case
    gen = torch.Generator().manual_seed(seed)
    E, H = block.num_edges, 3
    x = torch.randn(block.num_src, 4, generator=gen, dtype=DT)
    g = torch.randn(block.num_dst, 4, generator=gen, dtype=DT)
    w = torch.rand(E, generator=gen, dtype=DT)
    close = torch.testing.assert_close
    for weight in (None, w):
        A = dense(block, weight)
        close(T.spmm(block, x, weight), A @ x)
        close(T.spmm_t(block, g, weight), A.T @ g)
        base = torch.randn(block.num_dst, 4, generator=gen, dtype=DT)
        close(T.spmm(block, x, weight, into=base.clone()), base + A @ x)
    # The mean's weights, made in the order each product reads them
    inv_deg = 1.0 / torch.arange(1, block.num_dst + 1, dtype=DT)
    A = dense(block) * inv_deg[:, None]
    close(T.spmm(block, x, T.dst_weights(block, inv_deg), ordered=True), A @ x)
    close(T.spmm_t(block, g, T.dst_weights(block, inv_deg, transposed=True), ordered=True), A.T @ g)
    # A weight per edge and head: one product per head
    wh = torch.rand(E, H, generator=gen, dtype=DT)
    xh, gh = torch.randn(block.num_src, H, 2, generator=gen, dtype=DT), torch.randn(block.num_dst, H, 2, generator=gen, dtype=DT)
    Ah = dense(block, wh)
    close(T.spmm(block, xh, wh), torch.einsum("vuk,ukc->vkc", Ah, xh))
    close(T.spmm_t(block, gh, wh), torch.einsum("vuk,vkc->ukc", Ah, gh))


def test_tiles_are_split_as_the_bound_says(tile_rows):
    if tile_rows is None:
        pytest.skip("one tile: nothing is split")
    block = block_from([(v, u) for v in range(5) for u in range(7)], 5, 7)
    assert len(block.tiles().indptr) == -(-7 // tile_rows)
    assert len(block.tiles(transposed=True).indptr) == -(-5 // tile_rows)
    assert len(block.tiles(split=False).indptr) == 1


@pytest.mark.parametrize("kernel", [True, False], ids=["cpu kernel", "no cpu kernel"])
def test_tiles_stop_where_their_row_offsets_would_outweigh_the_edges(monkeypatch, kernel):
    """Each tile has an offset per row: a block gets no more tiles than TILE_OFFSETS
    offsets per edge pay for. Where the rows need more tiles of TILE_ROWS than that, the
    product stays whole for the CPU kernel; without one, it takes fewer, larger tiles, up
    to twice TILE_ROWS rows (and none past that)."""
    monkeypatch.setattr(graph_module, "whole_product_kernel", lambda: kernel)
    monkeypatch.setattr(graph_module, "TILE_OFFSETS", 0.5)
    monkeypatch.setattr(graph_module, "TILE_ROWS", 25)
    ring = block_from([(v, (v + 1) % 100) for v in range(100)], 100, 100)  # one edge per row
    assert len(ring.tiles().indptr) == len(ring.tiles(transposed=True).indptr) == 1
    pairs = [(v, (v + k) % 100) for v in range(100) for k in range(10)]
    dense = block_from(pairs, 100, 100)  # 0.5 * 1000 / 101: up to 4 tiles pay for their offsets
    assert len(dense.tiles().indptr) == len(dense.tiles(transposed=True).indptr) == 4
    # Five tiles of 20 rows would be needed, four are allowed: four of 25 rows without the
    # kernel, one with it
    monkeypatch.setattr(graph_module, "TILE_ROWS", 20)
    dense = block_from(pairs, 100, 100)
    assert len(dense.tiles().indptr) == len(dense.tiles(transposed=True).indptr) == (1 if kernel else 4)
    # Four tiles of 25 rows, past twice TILE_ROWS (8 here): none either way
    monkeypatch.setattr(graph_module, "TILE_ROWS", 8)
    dense = block_from(pairs, 100, 100)
    assert len(dense.tiles().indptr) == len(dense.tiles(transposed=True).indptr) == 1


def test_the_kernels_package_tells_the_tiles_whether_the_cpu_kernel_runs(monkeypatch):
    from sarcompile.codegen import cpu_spmm

    assert graph_module.whole_product_kernel is cpu_spmm.enabled
    monkeypatch.setenv("SARCOMPILE_CPU_KERNEL", "0")
    assert not graph_module.whole_product_kernel()


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_ops_on_tiles_equal_dense_sums_with_gradients(reduce):
    gen = torch.Generator().manual_seed(0)
    n = 11
    src, dst = torch.randint(0, n, (60,), generator=gen), torch.randint(0, n - 2, (60,), generator=gen)  # 2 rows empty
    g = sc.Graph.from_edges(src, dst, n)
    A = torch.zeros(n, n, dtype=DT).index_put_((dst, src), torch.ones(60, dtype=DT), accumulate=True)
    if reduce == "mean":
        A = A / A.sum(1, keepdim=True).clamp(min=1)
    x = torch.randn(n, 5, generator=gen, dtype=DT, requires_grad=True)
    r = torch.randn(n, 5, generator=gen, dtype=DT, requires_grad=True)
    gy = torch.randn(n, 5, generator=gen, dtype=DT)
    want = A @ x + r
    want_grads = torch.autograd.grad(want, (x, r), gy)
    for got in (sc.ops.spmm(g, x, reduce) + r, sc.ops.spmm(g, x, reduce, into=r * 1.0)):  # into: the mean's 1/deg on the edges
        torch.testing.assert_close(got, want)
        for a, b in zip(torch.autograd.grad(got, (x, r), gy), want_grads):
            torch.testing.assert_close(a, b)


@given(graphs(), st.integers(1, 3))
@settings(max_examples=10, deadline=None)
def test_gat_on_tiles_matches_pyg(data, heads):
    src, dst, n, seed = data
    ours, theirs = make_gat(4, 2, heads, True, 0.2, False, seed)
    compare_gat_with_pyg(ours, theirs, src, dst, n, 4, seed)
