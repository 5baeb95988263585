"""The torch attention kernels work through a block in destination-row ranges of a
bounded number of edges (``Block.row_chunks``). With the bound forced down to a few edges
they must compute what one pass over the whole block computes, and what a dense
brute-force softmax computes: empty rows, a row longer than the bound, isolated sources,
dropout multipliers and per-edge score terms."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sarcompile.codegen import torch_kernels as T
from sarcompile.graph.graph import Block

DT = torch.float64


def block_from(pairs: list[tuple[int, int]], num_dst: int, num_src: int) -> Block:
    dst = torch.tensor([p[0] for p in pairs], dtype=torch.long).reshape(-1)
    src = torch.tensor([p[1] for p in pairs], dtype=torch.long).reshape(-1)
    order = torch.argsort(dst, stable=True)
    counts = torch.bincount(dst, minlength=num_dst)
    return Block(torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(counts, 0)]), src[order], num_src,
                 torch.arange(num_src))


@st.composite
def cases(draw):
    num_dst, num_src = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    pairs = draw(st.lists(st.tuples(st.integers(0, num_dst - 1), st.integers(0, num_src - 1)), max_size=40))
    if draw(st.booleans()):  # one row longer than any chunk
        pairs += [(0, i % num_src) for i in range(25)]
    return pairs, num_dst, num_src, draw(st.sampled_from([1, 3])), draw(st.booleans()), draw(st.booleans()), \
        draw(st.integers(0, 2**31 - 1))


def run(block, heads, dropout, edge_score, seed):
    gen = torch.Generator().manual_seed(seed)
    c = 4
    h = torch.randn(block.num_src, heads, c, generator=gen, dtype=DT)
    a_src = torch.randn(block.num_src, heads, generator=gen, dtype=DT)
    a_dst = torch.randn(block.num_dst, heads, generator=gen, dtype=DT)
    a_edge = torch.randn(block.num_edges, heads, generator=gen, dtype=DT) if edge_score else None
    keep = (torch.rand(block.num_edges, heads, generator=gen) > 0.3).to(DT) / 0.7 if dropout else None
    state = T.AttentionState(block.num_dst, heads, c, DT)
    state.update(block, h, a_src, a_dst, 0.2, keep, a_edge)
    out, lse = state.result()
    d_out = torch.randn(out.shape, generator=gen, dtype=DT)
    delta = (d_out * out).sum(-1)
    grads = T.attention_grads(block, h, a_src, a_dst, 0.2, keep, lse, d_out, delta, a_edge)
    return (h, a_src, a_dst, a_edge, keep), out, lse, grads


def dense(block, h, a_src, a_dst, a_edge, keep):
    """out[v] = sum_u softmax(leaky_relu(a_src[u] + a_dst[v] + a_edge)) * keep * h[u], one edge at a time."""
    out = torch.zeros(block.num_dst, *h.shape[1:], dtype=DT)
    for v in range(block.num_dst):
        lo, hi = int(block.indptr[v]), int(block.indptr[v + 1])
        if hi == lo:
            continue
        u = block.col[lo:hi]
        s = a_src[u] + a_dst[v]
        s = s if a_edge is None else s + a_edge[lo:hi]
        p = torch.softmax(torch.nn.functional.leaky_relu(s, 0.2), 0)
        p = p if keep is None else p * keep[lo:hi]
        out[v] = (p.unsqueeze(-1) * h[u]).sum(0)
    return out


@settings(max_examples=40, deadline=None)
@given(cases())
def test_row_ranges_compute_what_one_pass_computes(case):
    pairs, num_dst, num_src, heads, dropout, edge_score, seed = case
    block = block_from(pairs, num_dst, num_src)
    inputs, out, lse, grads = run(block, heads, dropout, edge_score, seed)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(T, "EDGE_CHUNK_ELEMENTS", 4 * heads)  # 4 edges a range
        _, out_c, lse_c, grads_c = run(Block(block.indptr, block.col, num_src, block.src_gids), heads, dropout,
                                       edge_score, seed)
    torch.testing.assert_close(out_c, out, rtol=0, atol=0)  # rows are independent: the same arithmetic
    torch.testing.assert_close(lse_c, lse, rtol=0, atol=0)
    torch.testing.assert_close(out, dense(block, *inputs[:4], inputs[4]))
    for a, b in zip(grads_c, grads):
        if a is None:
            assert b is None
        else:
            torch.testing.assert_close(a, b)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 12), max_size=30), st.integers(1, 10))
def test_row_chunks_cover_every_row_once_within_the_bound(degrees, bound):
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(torch.tensor(degrees, dtype=torch.long), 0)])
    block = Block(indptr, torch.zeros(int(indptr[-1]), dtype=torch.long), 1, torch.arange(1))
    chunks = block.row_chunks(bound)
    rows = [r for a, b in chunks for r in range(a, b)]
    assert rows == (list(range(len(degrees))) if block.num_edges else rows)
    if block.num_edges:
        top = max(degrees)
        assert all(int(indptr[b] - indptr[a]) <= bound + top for a, b in chunks)
        assert chunks[0][0] == 0 and chunks[-1][1] == len(degrees)


@settings(max_examples=20, deadline=None)
@given(cases())
def test_gradients_written_into_a_payload_are_the_same(case):
    """``into``: the source gradients land in the columns of the payload a worker pushes
    (features, then scores), equal to the ones made in buffers of their own."""
    pairs, num_dst, num_src, heads, dropout, edge_score, seed = case
    block = block_from(pairs, num_dst, num_src)
    (h, a_src, a_dst, a_edge, keep), out, lse, grads = run(block, heads, dropout, edge_score, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    d_out = torch.randn(out.shape, generator=gen, dtype=DT)
    delta = (d_out * out).sum(-1)
    want = T.attention_grads(block, h, a_src, a_dst, 0.2, keep, lse, d_out, delta, a_edge)
    into = torch.full((num_src, heads * 4 + heads), float("nan"), dtype=DT)  # nothing may be read from it
    got = T.attention_grads(block, h, a_src, a_dst, 0.2, keep, lse, d_out, delta, a_edge, into)
    assert got[0]._base is into and got[1]._base is into
    torch.testing.assert_close(into, torch.cat([want[0].reshape(num_src, -1), want[1]], 1), rtol=0, atol=0)
    for a, b in zip(got[2:], want[2:]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
