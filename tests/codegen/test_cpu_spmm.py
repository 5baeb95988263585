"""The CPU sparse kernel of our own (``codegen.cpu_spmm``) against brute-force dense
products: random CSR matrices with empty rows and a heavy row, int32 and int64 indices,
float32 and float64, weights or none, written or added into strided outputs, on one and
two threads; its build (cached per source, flags and CPU; a failed build warns once and
leaves products to torch) and its switch. The ops built on it are tested with the tiles'
tests (tests/codegen/test_torch_tiles.py, "cpu kernel")."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sarcompile.codegen import cpu_spmm

pytestmark = pytest.mark.skipif(not cpu_spmm.enabled(), reason="no C compiler: the CPU kernel is not used here")


@st.composite
def products(draw):
    rows, cols = draw(st.integers(0, 12)), draw(st.integers(1, 12))
    degrees = draw(st.lists(st.integers(0, 5), min_size=rows, max_size=rows))
    if rows and draw(st.booleans()):
        degrees[draw(st.integers(0, rows - 1))] = 300  # one heavy row: the thread split by entries
    return rows, cols, degrees, draw(st.sampled_from([1, 3, 17, 64])), draw(st.integers(0, 2**31 - 1))


@given(products(), st.sampled_from([torch.float32, torch.float64]), st.sampled_from([torch.int32, torch.int64]),
       st.booleans(), st.booleans(), st.sampled_from([1, 2]))
@settings(max_examples=60, deadline=None)
def test_product_equals_the_dense_product(case, dtype, index, weighted, accumulate, threads):
    rows, cols, degrees, width, seed = case
    gen = torch.Generator().manual_seed(seed)
    indptr = torch.tensor([0, *degrees]).cumsum(0).to(index)
    col = torch.randint(0, cols, (int(indptr[-1]),), generator=gen).to(index)
    values = torch.randn(col.numel(), generator=gen, dtype=dtype) if weighted else None
    # Strided views on both sides: rows of a wider buffer, as a head of [n, H, C] is
    x = torch.randn(cols, width + 2, generator=gen, dtype=dtype)[:, 1 : width + 1]
    base = torch.randn(rows, 2 * width, generator=gen, dtype=dtype)
    out = base.clone()[:, :width]
    A = torch.zeros(rows, cols, dtype=torch.float64)
    row = torch.repeat_interleave(torch.arange(rows), torch.tensor(degrees, dtype=torch.long), output_size=col.numel())
    A.index_put_((row, col.long()), torch.ones(col.numel(), dtype=torch.float64) if values is None else values.double(),
                 accumulate=True)
    want = A @ x.double() + (base[:, :width].double() if accumulate else 0)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_spmm.spmm_into(indptr, col, values, x, out, accumulate)
    finally:
        torch.set_num_threads(before)
    assert got is out
    tol = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-12, 1e-12)}[dtype]
    torch.testing.assert_close(out.double(), want, rtol=tol[0], atol=tol[1])


def test_usable_only_where_it_runs(monkeypatch):
    monkeypatch.setattr(cpu_spmm, "MIN_ENTRIES", 10)
    monkeypatch.setattr(cpu_spmm, "MIN_OPERAND_BYTES", 40)
    x, index = torch.randn(4, 3), torch.zeros(1, dtype=torch.int32)
    assert cpu_spmm.usable(x, None, None, index, 10)
    assert not cpu_spmm.usable(x, None, None, index, 9)  # few entries: torch's product
    assert not cpu_spmm.usable(x[:3], None, None, index, 10)  # rows that fit the cache: torch's product
    assert not cpu_spmm.usable(torch.randn(8, 3).half(), None, None, index, 10)
    assert not cpu_spmm.usable(x.t(), None, None, index, 10)  # rows not of unit stride
    assert not cpu_spmm.usable(x, None, torch.ones(10, dtype=torch.float64), index, 10)  # mixed dtypes
    assert not cpu_spmm.usable(x.requires_grad_(), None, None, index, 10)  # autograd takes torch's
    with torch.no_grad():
        assert cpu_spmm.usable(x, None, None, index, 10)
    monkeypatch.setenv("SARCOMPILE_CPU_KERNEL", "0")
    assert not cpu_spmm.enabled() and not cpu_spmm.usable(torch.randn(4, 3), None, None, index, 10)


def test_build_is_cached_and_a_failed_build_warns_once(monkeypatch, tmp_path):
    monkeypatch.setenv("SARCOMPILE_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_spmm._library, "_lib", None)
    monkeypatch.setattr(cpu_spmm._library, "_failed", False)
    path = cpu_spmm._build()
    assert path.parent == tmp_path and path.name.startswith("cpu_spmm-")
    stamp = path.stat().st_mtime_ns
    assert cpu_spmm._build() == path and path.stat().st_mtime_ns == stamp  # reused, not built again
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left
    # Another compiler is another library; one that fails leaves products to torch
    monkeypatch.setenv("CC", "false")
    with pytest.warns(RuntimeWarning, match="could not be built.*SARCOMPILE_CPU_KERNEL=0"):
        assert cpu_spmm._library.get() is None
    x, index = torch.randn(4, 3), torch.zeros(1, dtype=torch.int32)
    assert not cpu_spmm.usable(x, None, None, index, 1 << 20)  # and says nothing more
