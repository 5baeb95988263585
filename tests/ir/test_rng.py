"""Counter-based dropout draws: the integer comparison equals the float draw, and keys below
2^32 (whose high half is hashed once) give what the general path gives."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sarcompile.ir.rng import _MASK32, keep, mix32, uniform


def _reference(keys: torch.Tensor, salt: torch.Tensor) -> torch.Tensor:
    """The draw as defined: both halves of every key hashed with the salt, per key."""
    salted = mix32((keys >> 32) ^ mix32(salt & _MASK32))
    return mix32((keys & _MASK32) ^ salted).to(torch.float64) / 2.0**32


@given(keys=st.lists(st.integers(0, 2**40), min_size=1, max_size=200), salt=st.integers(0, 2**62),
       p=st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9, 1 / 3, 0.999999]), small=st.booleans())
@settings(max_examples=60, deadline=None)
def test_keep_is_the_float_draw_compared_with_p(keys, salt, p, small):
    keys = torch.tensor(keys, dtype=torch.long)
    if small:  # every key below 2^32: the scalar path
        keys = keys & _MASK32
    salt = torch.tensor(salt, dtype=torch.long)
    want = _reference(keys, salt)
    assert torch.equal(uniform(keys, salt), want)
    assert torch.equal(keep(keys, salt, p), want >= p)


def test_a_threshold_exactly_on_a_draw_keeps_it():
    keys, salt = torch.arange(1000), torch.tensor(7)
    h = uniform(keys, salt)
    p = float(h[17])  # a draw equal to p is kept (u >= p)
    assert bool(keep(keys, salt, p)[17]) and torch.equal(keep(keys, salt, p), h >= p)
