"""The generated attention kernels (forward online softmax, two-pass backward) against
the torch kernels, their oracle, on random blocks: empty rows, a 300-edge row, isolated
sources, heads and channels that are not powers of two, dropout, per-edge score terms
(GATConv's edge features) and their gradient, and several blocks folded in sequence with
the max jumping from ~-50 to ~+50 between them.

Without a GPU the kernels run in Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``,
set before triton is imported); compiled (on a GPU) they get CUDA tensors
(``devices.DEVICE``), and the torch kernels keep the CPU ones.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from devices import DEVICE, to_dev
from hypothesis import given, settings
from hypothesis import strategies as st

from sarcompile.codegen import torch_kernels as T
from sarcompile.codegen import triton_kernels as K
from sarcompile.codegen.attention_gen import AttentionBackwardSpec, AttentionForwardSpec
from sarcompile.graph.graph import Block

pytestmark = pytest.mark.interpreter

LONG_ROW = 300  # edges into one row: many BLOCK_E chunks, each possibly raising the max
RTOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def make_block(pairs: list[tuple[int, int]], num_dst: int, num_src: int) -> Block:
    """A CSR block from (dst, src) pairs (any order; multi-edges kept)."""
    dst = torch.tensor([p[0] for p in pairs], dtype=torch.long).reshape(-1)
    src = torch.tensor([p[1] for p in pairs], dtype=torch.long).reshape(-1)
    order = torch.argsort(dst, stable=True)
    counts = torch.bincount(dst, minlength=num_dst)
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(counts, 0)])
    return Block(indptr, src[order], num_src, torch.arange(num_src))


@st.composite
def attention_cases(draw):
    """(blocks, a_dst, negative_slope, dtype, heads, channels, seed); each block is (Block,
    h, a_src, keep or None, a_edge or None)."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    heads = draw(st.sampled_from([1, 2, 3, 5, 8]))
    channels = draw(st.sampled_from([1, 4, 7, 16, 70]))
    dropout = draw(st.booleans())
    edge_score = draw(st.booleans())
    slope = draw(st.sampled_from([0.2, 0.01]))
    num_dst = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    # The last row of the first block's destination range may be left empty on purpose.
    dst_hi = num_dst - 1 if num_dst > 1 and draw(st.booleans()) else num_dst
    blocks = []
    for _ in range(draw(st.integers(1, 3))):
        used_src = draw(st.integers(1, 6))
        num_src = used_src + draw(st.integers(0, 2))  # sources past used_src are isolated
        pairs = draw(
            st.lists(st.tuples(st.integers(0, dst_hi - 1), st.integers(0, used_src - 1)), max_size=20)
        )
        if draw(st.integers(0, 3)) == 0:  # one very long row
            row = draw(st.integers(0, dst_hi - 1))
            pairs += [(row, int(u)) for u in torch.randint(0, used_src, (LONG_ROW,), generator=gen)]
        block = make_block(pairs, num_dst, num_src)
        # Scores ~-50, ~0 or ~+50: a later block may raise a row's max by ~100 (so that a
        # missing rescale of what was accumulated is not lost in rounding).
        shift = draw(st.sampled_from([-50.0, 0.0, 50.0]))
        h = torch.randn(num_src, heads, channels, generator=gen, dtype=torch.float64).to(dtype)
        a_src = (torch.randn(num_src, heads, generator=gen, dtype=torch.float64) + shift).to(dtype)
        keep = None
        if dropout:
            mask = torch.rand(block.num_edges, heads, generator=gen, dtype=torch.float64) > 0.3
            keep = (mask / 0.7).to(dtype)
        a_edge = 3 * torch.randn(block.num_edges, heads, generator=gen, dtype=torch.float64).to(dtype) if edge_score else None
        blocks.append((block, h, a_src, keep, a_edge))
    a_dst = torch.randn(num_dst, heads, generator=gen, dtype=torch.float64).to(dtype)
    return blocks, a_dst, slope, dtype, heads, channels, seed


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, what: str) -> None:
    """Elementwise within ``rtol`` of the tensor's scale (sums of signed terms cancel)."""
    actual = actual.cpu()
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * scale, msg=lambda m: f"{what}: {m}")


on = to_dev


def run_both(blocks, a_dst, slope, dtype, heads, channels, seed, rtol):
    """Fold the blocks with both implementations, then take every block's gradients;
    compare everything."""
    num_dst = a_dst.shape[0]
    ref = T.AttentionState(num_dst, heads, channels, dtype)
    gen = K.AttentionState(num_dst, heads, channels, dtype, device=DEVICE)
    for block, h, a_src, keep, a_edge in blocks:
        ref.update(block, h, a_src, a_dst, slope, keep, a_edge)
        gen.update(block, on(h), on(a_src), on(a_dst), slope, on(keep), on(a_edge))
    (out, lse), (out_k, lse_k) = ref.result(), gen.result()
    assert_close(out_k, out, rtol, "out")
    assert_close(lse_k, lse, rtol, "lse")
    d_out = torch.randn(num_dst, heads, channels, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    d_out = d_out.to(dtype)
    delta = (d_out * out).sum(-1)
    for i, (block, h, a_src, keep, a_edge) in enumerate(blocks):
        expected = T.attention_grads(block, h, a_src, a_dst, slope, keep, lse, d_out, delta, a_edge)
        actual = K.attention_grads(
            block, on(h), on(a_src), on(a_dst), slope, on(keep), on(lse), on(d_out), on(delta), on(a_edge)
        )
        for name, a, e in zip(("d_h", "d_src", "d_dst", "d_edge"), actual, expected):
            if e is None:
                assert a is None, f"block {i} {name}"
            else:
                assert_close(a, e, rtol, f"block {i} {name}")
        # Into a payload's columns (what a worker pushes), as the torch kernels do
        into = on(torch.empty(block.num_src, heads * channels + heads, dtype=dtype))
        packed = K.attention_grads(
            block, on(h), on(a_src), on(a_dst), slope, on(keep), on(lse), on(d_out), on(delta), on(a_edge), into
        )
        assert packed[0]._base is into and packed[1]._base is into
        assert_close(packed[0], expected[0], rtol, f"block {i} d_h into")
        assert_close(packed[1], expected[1], rtol, f"block {i} d_src into")


@settings(max_examples=15, deadline=None)
@given(attention_cases())
def test_matches_torch_kernels(case):
    blocks, a_dst, slope, dtype, heads, channels, seed = case
    run_both(blocks, a_dst, slope, dtype, heads, channels, seed, RTOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("heads,channels,dropout,edge_score", [(3, 7, True, False), (5, 70, False, True),
                                                              (8, 16, True, True)])
def test_max_jumps_between_blocks(dtype, heads, channels, dropout, edge_score):
    """Scores ~-50 in the first block, ~+50 in the second (and back): the first block's
    sums must be rescaled by ~exp(-60) -- without the rescale ``out`` is off by far more
    than the tolerance. Row 0 gets a long row, row 3 only edges from the second block
    (its max is -inf when the first one is folded), row 4 none."""
    gen = torch.Generator().manual_seed(heads * 100 + channels)
    num_dst = 5
    blocks = []
    for shift, rows in ((-50.0, [0, 1, 2]), (50.0, [0, 1, 3]), (-50.0, [1, 2])):
        num_src = 4
        pairs = [(r, int(u)) for r in rows for u in torch.randint(0, num_src - 1, (3,), generator=gen)]  # source 3 isolated
        if rows[0] == 0:
            pairs += [(0, int(u)) for u in torch.randint(0, num_src - 1, (LONG_ROW // 3,), generator=gen)]
        block = make_block(pairs, num_dst, num_src)
        h = torch.randn(num_src, heads, channels, generator=gen, dtype=torch.float64).to(dtype)
        a_src = (torch.randn(num_src, heads, generator=gen, dtype=torch.float64) + shift).to(dtype)
        keep = (torch.rand(block.num_edges, heads, generator=gen, dtype=torch.float64) > 0.5).to(dtype) * 2 if dropout else None
        a_edge = torch.randn(block.num_edges, heads, generator=gen, dtype=torch.float64).to(dtype) if edge_score else None
        blocks.append((block, h, a_src, keep, a_edge))
    a_dst = torch.randn(num_dst, heads, generator=gen, dtype=torch.float64).to(dtype)
    with warnings.catch_warnings():
        # No nan or inf - inf even in the padding heads (3 and 5 are padded to 4 and 8):
        # in the interpreter they would show as numpy's invalid-value warning.
        warnings.simplefilter("error", RuntimeWarning)
        run_both(blocks, a_dst, 0.2, dtype, heads, channels, 7, RTOL[dtype])


def test_empty_block_changes_nothing():
    heads, channels, num_dst = 3, 7, 4
    state = K.AttentionState(num_dst, heads, channels, torch.float32, device=DEVICE)
    block = make_block([], num_dst, 2)
    h, a_src, a_dst = torch.randn(2, heads, channels), torch.randn(2, heads), torch.randn(num_dst, heads)
    state.update(block, on(h), on(a_src), on(a_dst), 0.2, None)
    assert torch.isinf(state.m).all() and (state.l == 0).all() and (state.acc == 0).all()
    out, lse = state.result()
    assert (out == 0).all() and (lse == 0).all()
    grads = K.attention_grads(
        block, on(h), on(a_src), on(a_dst), 0.2, None, on(lse), on(torch.randn(num_dst, heads, channels)), on(lse)
    )
    assert [tuple(g.shape) for g in grads[:3]] == [(2, heads, channels), (2, heads), (num_dst, heads)]
    assert all((g == 0).all() for g in grads[:3]) and grads[3] is None
    d_edge = K.attention_grads(
        block, on(h), on(a_src), on(a_dst), 0.2, None, on(lse), on(torch.randn(num_dst, heads, channels)), on(lse),
        on(torch.randn(0, heads)),
    )[3]
    assert tuple(d_edge.shape) == (0, heads)


def test_bfloat16_against_float64():
    """bfloat16 inputs (the interpreter handles them), fp32 accumulation: against the
    float64 oracle on the same rounded inputs, at bfloat16's precision."""
    gen = torch.Generator().manual_seed(3)
    heads, channels, num_dst, num_src = 3, 7, 5, 6
    pairs = [(int(v), int(u)) for v, u in zip(torch.randint(0, num_dst - 1, (40,), generator=gen), torch.randint(0, num_src, (40,), generator=gen))]
    block = make_block(pairs, num_dst, num_src)
    h = torch.randn(num_src, heads, channels, generator=gen).bfloat16()
    a_src, a_dst = torch.randn(num_src, heads, generator=gen).bfloat16(), torch.randn(num_dst, heads, generator=gen).bfloat16()
    keep = ((torch.rand(block.num_edges, heads, generator=gen) > 0.3) * 2.0).bfloat16()
    a_edge = torch.randn(block.num_edges, heads, generator=gen).bfloat16()
    d_out = torch.randn(num_dst, heads, channels, generator=gen).bfloat16()

    ref = T.AttentionState(num_dst, heads, channels, torch.float64)
    ref.update(block, h.double(), a_src.double(), a_dst.double(), 0.2, keep.double(), a_edge.double())
    out, lse = ref.result()
    delta = (d_out.double() * out).sum(-1)
    expected = T.attention_grads(
        block, h.double(), a_src.double(), a_dst.double(), 0.2, keep.double(), lse, d_out.double(), delta, a_edge.double()
    )

    state = K.AttentionState(num_dst, heads, channels, torch.bfloat16, device=DEVICE)
    state.update(block, on(h), on(a_src), on(a_dst), 0.2, on(keep), on(a_edge))
    out_k, lse_k = state.result()
    assert_close(out_k.double(), out, 3e-2, "out")
    assert_close(lse_k.double(), lse, 3e-2, "lse")
    actual = K.attention_grads(
        block, on(h), on(a_src), on(a_dst), 0.2, on(keep), on(lse.bfloat16()), on(d_out), on(delta.bfloat16()), on(a_edge)
    )
    for name, a, e in zip(("d_h", "d_src", "d_dst", "d_edge"), actual, expected):
        assert a.dtype == torch.bfloat16, name
        assert_close(a.double(), e, 5e-2, name)


def test_generated_source_contract():
    """CUDA autotuning re-runs the forward on the live state, so it must restore it; the
    backward must not race (no atomics), and neither kernel keeps an E x H tensor."""
    fwd = AttentionForwardSpec(5, 70, True, "float32").render("cuda")
    assert "restore_value=['m', 'l', 'acc']" in fwd
    bwd = AttentionBackwardSpec(5, 70, True, "float64").render("cuda")
    assert "tl.atomic" not in bwd and "def kernel_dst(" in bwd and "def kernel_src(" in bwd
    assert "negative_slope: tl.float64" in bwd  # a float64 slope, not an fp32 scalar
    edge = AttentionBackwardSpec(5, 70, False, "float32", edge_score=True).render("cuda")
    assert "tl.atomic" not in edge and "tl.store(d_edge + e[:, None] * 5" in edge  # one store per edge, CSR order
    assert "a_edge +" not in bwd and "d_edge +" not in bwd  # read and written only with edge scores
    for source in (fwd, bwd, edge, AttentionForwardSpec(1, 1, False, "bfloat16", True).render("interpreter")):
        compile(source, "<generated>", "exec")
