"""Compressed communication: the torch pack/unpack reference against the layout contract
(error bounds, sizes, exact bits), and the generated Triton kernels bit for bit against it."""

from __future__ import annotations

import math
import os

import pytest
import torch
from devices import DEVICE, back, to_dev
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarcompile.codegen import torch_kernels as T

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is imported

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TRITON_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = [torch.float32, torch.float64, torch.bfloat16]


@st.composite
def rows(draw, max_n: int = 40, max_width: int = 70, dtypes=DTYPES):
    """(x, bits): n rows of F values, some rows constant, some with integer values (which
    put ties of round-half-up on the grid), magnitudes from 1e-3 to 1e4."""
    n = draw(st.integers(0, max_n))
    width = draw(st.integers(1, max_width))
    bits = draw(st.sampled_from(T.QUANT_BITS))
    dtype = draw(st.sampled_from(dtypes))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(n, width, generator=gen, dtype=torch.float64) * 10.0 ** draw(st.integers(-3, 4))
    x = x + draw(st.floats(-100, 100))
    if draw(st.booleans()):
        x = torch.randint(-4, 5, (n, width), generator=gen).double()
    constant = draw(st.lists(st.integers(0, n - 1), max_size=3)) if n else []
    for r in constant:
        x[r] = x[r, 0]  # a constant row
    return x.to(dtype), bits


def decode(p: T.Packed) -> list[list[int]]:
    """The layout read back bit by bit, independently of the implementation: every slot of
    every byte, padding included."""
    per = 8 // p.bits
    return [
        [(byte >> (s * p.bits)) & (2**p.bits - 1) for byte in row for s in range(per)] for row in p.data.tolist()
    ]


def tolerance(x: torch.Tensor) -> torch.Tensor:
    """Float32 rounding slack per row (the subtraction, division and the float32 result)."""
    if x.shape[1] == 0:
        return torch.zeros(x.shape[0], dtype=torch.float64)
    return 1e-6 * x.double().abs().amax(dim=1) + 1e-30


def check_reference(x: torch.Tensor, bits: int, noise: torch.Tensor | None) -> T.Packed:
    p = T.pack(x, bits, noise)
    n = x.shape[0]
    width = math.prod(x.shape[1:])
    row_bytes = -(-width * bits // 8)
    assert p.data.dtype == torch.uint8 and p.data.shape == (n, row_bytes)
    assert p.lo.dtype == p.scale.dtype == torch.float32 and p.lo.shape == p.scale.shape == (n,)
    assert (p.bits, p.width) == (bits, width)
    assert p.nbytes == n * row_bytes + 8 * n

    x64 = x.reshape(n, width).double()
    if width:
        assert torch.equal(p.lo, x64.float().amin(dim=1))
        assert torch.equal(p.scale, (x64.float().amax(dim=1) - p.lo) / (2**bits - 1))

    # The bits: q in range, the padding 0, and q as the contract computes it.
    slots = decode(p)
    x32 = x64.float()
    safe = torch.where(p.scale > 0, p.scale, 1.0)[:, None]
    t = (x32 - p.lo[:, None]) / safe + (0.5 if noise is None else noise.reshape(n, width))
    expect_q = torch.where(p.scale[:, None] > 0, torch.floor(t).clamp(0, 2**bits - 1), 0.0)
    for r in range(n):
        assert slots[r][width:] == [0] * (len(slots[r]) - width), "padding bits must be 0"
        assert slots[r][:width] == expect_q[r].long().tolist()

    # The round trip.
    x_hat = T.unpack(p, torch.float64)
    bound = (p.scale.double() / 2 if noise is None else p.scale.double()) + tolerance(x64)
    assert ((x_hat - x64).abs() <= bound[:, None]).all()
    constant = p.scale == 0
    assert torch.equal(x_hat[constant], x32[constant].double())
    out = T.unpack(p, x.dtype)
    assert out.dtype == x.dtype and out.shape == (n, width)
    assert torch.equal(out, x_hat if x.dtype == torch.float64 else x_hat.float().to(x.dtype))
    return p


# -- torch reference -------------------------------------------------------------------


@SETTINGS
@given(rows())
def test_reference_round_half_up(case):
    x, bits = case
    check_reference(x, bits, None)


@SETTINGS
@given(rows(), st.integers(0, 2**31 - 1))
def test_reference_stochastic(case, seed):
    x, bits = case
    noise = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed))
    check_reference(x, bits, noise)


def test_bit_layout_by_hand():
    p = T.pack(torch.tensor([[0.0, 1, 1, 0, 1, 0, 0, 0, 1]]), 1)
    assert p.data.tolist() == [[0b00010110, 0b00000001]]
    assert (p.lo.item(), p.scale.item()) == (0.0, 1.0)
    # 2 bits: four values per byte, the first in the lowest bits; 0.5 and 1.5 round up.
    p = T.pack(torch.tensor([[0.0, 0.5, 1.5, 3, 3]]), 2)
    assert p.data.tolist() == [[0b11100100, 0b00000011]]
    # 4 bits: two per byte.
    p = T.pack(torch.tensor([[0.0, 15, 5]]), 4)
    assert p.data.tolist() == [[0xF0, 0x05]]
    assert T.unpack(p, torch.float32).tolist() == [[0.0, 15, 5]]


def test_round_half_up_not_to_even():
    # Grid 0, 1, 2, 3 (scale 1): 0.5 -> 1 and 2.5 -> 3 (round-half-even would give 0 and 2).
    p = T.pack(torch.tensor([[0.0, 0.5, 2.5, 3.0]]), 2)
    assert T.unpack(p, torch.float32).tolist() == [[0.0, 1.0, 3.0, 3.0]]


def test_bits8_within_half_a_step():
    x = torch.linspace(-7.0, 11.0, 1000, dtype=torch.float64).reshape(4, 250) ** 3
    p = T.pack(x, 8)
    assert p.data.shape == (4, 250)
    err = (T.unpack(p, torch.float64) - x).abs()
    assert (err <= p.scale.double()[:, None] / 2 + tolerance(x)[:, None]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_rows_exact(dtype):
    x = torch.tensor([[2.5] * 9, [-1e3] * 9, [0.0] * 9], dtype=dtype)
    for bits in T.QUANT_BITS:
        p = T.pack(x, bits)
        assert (p.scale == 0).all() and (p.data == 0).all()
        assert torch.equal(T.unpack(p, dtype), x)


def test_trailing_dims_flattened_and_empty():
    x = torch.randn(5, 2, 3)
    p = T.pack(x, 4)
    q = T.pack(x.reshape(5, 6), 4)
    assert p.width == 6 and torch.equal(p.data, q.data)
    for n, width in ((0, 5), (3, 0), (0, 0)):
        p = T.pack(torch.empty(n, width), 2)
        assert p.data.shape == (n, -(-width * 2 // 8)) and p.nbytes == p.data.numel() + 8 * n
        assert T.unpack(p, torch.float32).shape == (n, width)


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"\(1, 2, 4, 8\)"):
        T.pack(torch.randn(3, 4), 3)
    with pytest.raises(ValueError, match="noise"):
        T.pack(torch.randn(3, 4), 2, noise=torch.rand(3, 5))


# -- Triton kernels against the reference ---------------------------------------------


def triton_quantize():
    pytest.importorskip("triton")
    from sarcompile.codegen import triton_quantize as Q

    return Q


def assert_same_packed(a: T.Packed, b: T.Packed) -> None:
    assert (a.bits, a.width) == (b.bits, b.width)
    for name in ("data", "lo", "scale"):
        assert torch.equal(getattr(a, name).cpu(), getattr(b, name).cpu()), name


@pytest.mark.interpreter
@TRITON_SETTINGS
@given(rows(max_n=12, max_width=40, dtypes=[*DTYPES, torch.float16]), st.integers(0, 2**31 - 1), st.booleans())
def test_triton_matches_reference(case, seed, stochastic):
    Q = triton_quantize()
    x, bits = case
    noise = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed)) if stochastic else None
    ref = T.pack(x, bits, noise)
    x_dev = x.to(DEVICE)
    got = Q.pack(x_dev, bits, None if noise is None else noise.to(DEVICE))
    assert_same_packed(ref, got)
    for dtype in {x.dtype, torch.float32}:
        assert torch.equal(Q.unpack(got, dtype).cpu(), T.unpack(ref, dtype))


@pytest.mark.interpreter
def test_triton_edge_cases():
    Q = triton_quantize()
    x = torch.tensor([[0.0, 1, 1, 0, 1, 0, 0, 0, 1], [3.0] * 9], device=DEVICE)
    p = Q.pack(x, 1)
    assert p.data.cpu().tolist() == [[0b00010110, 0b00000001], [0, 0]]
    assert torch.equal(Q.unpack(p, torch.float32).cpu(), x.cpu())
    for n, width in ((0, 5), (3, 0)):
        p = Q.pack(torch.empty(n, width, device=DEVICE), 4)
        assert_same_packed(p, T.pack(torch.empty(n, width), 4))
        assert Q.unpack(p, torch.float32).shape == (n, width)


@pytest.mark.interpreter
def test_given_lo_and_scale_clamp_outside_values_the_same_in_torch_and_triton():
    """Error feedback packs rows + residual on the rows' own levels: values outside them clamp."""
    from sarcompile.codegen import triton_quantize

    x = torch.tensor([[-3.0, 0.0, 0.4, 1.0, 5.0], [0.2, 0.2, 0.3, 0.9, 1.0]])
    lo, scale = torch.tensor([0.0, 0.2]), torch.tensor([1.0 / 3, 0.8 / 3])
    want = T.pack(x, 2, lo_scale=(lo, scale))
    assert T.unpack(want, torch.float32)[0].tolist() == pytest.approx([0.0, 0.0, 1 / 3, 1.0, 1.0])
    got = triton_quantize.pack(to_dev(x), 2, lo_scale=(to_dev(lo), to_dev(scale)))
    assert torch.equal(back(got.data), want.data)
    assert torch.equal(back(got.lo), lo) and torch.equal(back(got.scale), scale)
