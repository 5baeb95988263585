"""The generated Triton aggregation kernels against the torch kernels they replace.

Every kernel of :mod:`sarcompile.codegen.triton_kernels` -- spmm, its transpose spmm_t,
the edge-weight gradient edge_dot, the max (MaxState folded over several blocks) and its
gradient max_grad -- on hypothesis blocks with empty rows, a row of >= 300 edges, isolated
sources, self-loops, multi-edges and sources that are another set than the destinations,
feature widths that are not a multiple of the kernels' block sizes, features ``[n, F]``
and ``[n, H, C]`` and edge weights ``None`` / ``[E]`` / ``[E, H]``.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set by
this folder's conftest), so the graphs are kept small. Compiled (on a GPU) they get CUDA
tensors (``devices.DEVICE``); the torch kernels always run on the CPU tensors.
"""

from __future__ import annotations

import pytest
import torch
from devices import DEVICE, back, to_dev
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarcompile.codegen import torch_kernels as T
from sarcompile.codegen import triton_kernels as K
from sarcompile.graph.graph import Block, Graph

pytest.importorskip("triton")
pytestmark = pytest.mark.interpreter

SETTINGS = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Widths around the kernels' feature blocks (64, or the next power of two below it).
WIDTHS = [1, 7, 70, 130]
LONG_ROW = (300, 340)  # in-degree of the long row some blocks get
EXACT = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12)}
# One ulp of the half types: the kernels accumulate in fp32 and round once at the end.
HALF_ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


@st.composite
def blocks(draw, num_dst: int | None = None, max_nodes: int = 9, max_edges: int = 40, long_row: bool = True) -> Block:
    """A block: square (sources are the destinations, as a one-worker graph's block) or
    with its own sources (``num_src != num_dst`` in general, sorted distinct global ids);
    always some rows without in-edges and sources without out-edges available, often
    multi-edges, self-loops (square blocks) and sometimes one row of >= 300 edges."""
    square = num_dst is None and draw(st.booleans())
    nd = draw(st.integers(1, max_nodes)) if num_dst is None else num_dst
    ns = nd if square else draw(st.integers(0, max_nodes))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    pairs: list[tuple[int, int]] = []
    if ns:
        # The last rows get no in-edges and the last sources no out-edges.
        k_dst = nd - draw(st.integers(0, min(2, nd - 1)))
        k_src = ns - draw(st.integers(0, min(2, ns - 1)))
        edge = st.tuples(st.integers(0, k_src - 1), st.integers(0, k_dst - 1))
        pairs = draw(st.lists(edge, max_size=max_edges))
        if pairs and draw(st.booleans()):
            pairs += draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=5))  # multi-edges
        if square and draw(st.booleans()):
            pairs += [(v, v) for v in draw(st.lists(st.integers(0, nd - 1), min_size=1, max_size=3))]
        if long_row and draw(st.integers(0, 3)) == 0:
            hub = draw(st.integers(0, k_dst - 1))
            deg = draw(st.integers(*LONG_ROW))
            pairs += [(int(u), hub) for u in torch.randint(0, k_src, (deg,), generator=gen)]
        draw(st.randoms(use_true_random=False)).shuffle(pairs)
    src = torch.tensor([p[0] for p in pairs], dtype=torch.long).reshape(-1)
    dst = torch.tensor([p[1] for p in pairs], dtype=torch.long).reshape(-1)
    if square and draw(st.booleans()):
        return Graph.from_edges(src, dst, nd).block
    order = torch.sort(dst, stable=True).indices
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(torch.bincount(dst, minlength=nd), 0)])
    gids = torch.arange(ns) if square else torch.randperm(3 * ns + 1, generator=gen)[:ns].sort().values
    return Block(indptr, src[order], ns, gids)


# Trailing feature shape: [F] or [H, C].
tails = st.one_of(
    st.sampled_from(WIDTHS).map(lambda f: (f,)),
    st.tuples(st.integers(1, 8), st.sampled_from([1, 3, 9, 16])),
)


@st.composite
def weight_kinds(draw, tail: tuple[int, ...]) -> str:
    """None, one weight per edge, or (for [n, H, C] features) one per edge and head."""
    return draw(st.sampled_from(["none", "edge", "head"] if len(tail) == 2 else ["none", "edge"]))


def make_weight(kind: str, block: Block, tail: tuple[int, ...], dtype, gen) -> torch.Tensor | None:
    if kind == "none":
        return None
    shape = (block.num_edges,) if kind == "edge" else (block.num_edges, tail[0])
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def weight_shape(kind: str, block: Block, tail: tuple[int, ...]) -> torch.Size:
    return torch.Size((block.num_edges,) if kind in ("none", "edge") else (block.num_edges, tail[0]))


def randn(shape, dtype, gen) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def abs_or_none(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.abs().double()


def assert_sum_close(actual, expected, magnitude, rtol: float, atol: float) -> None:
    """``actual`` within ``rtol * |expected| + atol * max(1, magnitude)`` of ``expected``,
    entry by entry, where ``magnitude`` is the same sum taken over absolute values: a sum's
    rounding error scales with it, not with the (possibly cancelled) result."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (actual.shape, expected.shape, actual.dtype)
    scale = magnitude.to(torch.float64).clamp(min=1.0)
    torch.testing.assert_close(actual.double() / scale, expected.double() / scale, rtol=rtol, atol=atol)


@SETTINGS
@given(data=st.data(), block=blocks(), tail=tails, dtype=st.sampled_from([torch.float32, torch.float64]))
def test_spmm(data, block, tail, dtype):
    kind = data.draw(weight_kinds(tail))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    x = randn((block.num_src, *tail), dtype, gen)
    w = make_weight(kind, block, tail, dtype, gen)
    out = back(K.spmm(block, to_dev(x), to_dev(w)))
    assert_sum_close(out, T.spmm(block, x, w), T.spmm(block, x.abs().double(), abs_or_none(w)), *EXACT[dtype])


@SETTINGS
@given(data=st.data(), block=blocks(), tail=tails, dtype=st.sampled_from([torch.float32, torch.float64]))
def test_spmm_into_adds_to_the_buffer_it_returns(data, block, tail, dtype):
    """Both executors' ``spmm(..., into=buf)``: ``buf + spmm(...)``, in ``buf`` itself."""
    kind = data.draw(weight_kinds(tail))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    x = randn((block.num_src, *tail), dtype, gen)
    w = make_weight(kind, block, tail, dtype, gen)
    base = randn((block.num_dst, *tail), dtype, gen)
    want = base + T.spmm(block, x, w)
    magnitude = base.abs().double() + T.spmm(block, x.abs().double(), abs_or_none(w))
    for spmm, dev, undev in ((T.spmm, lambda t: t, lambda t: t), (K.spmm, to_dev, back)):
        buf = dev(base.clone())
        out = spmm(block, dev(x), dev(w), into=buf)
        assert out is buf
        assert_sum_close(undev(out), want, magnitude, *EXACT[dtype])


def test_block_indices_are_int32_where_they_fit():
    b = Block(torch.tensor([0, 2, 3]), torch.tensor([1, 0, 1]), 2, torch.tensor([4, 9]))
    t = b.tiles(transposed=True, split=False, with_order=True)  # the CSC view the Triton kernels read
    assert {x.dtype for x in (b.indptr, b.col, t.indptr[0], t.col, t.order)} == {torch.int32}
    assert t.col.tolist() == [0, 0, 1] and t.indptr[0].tolist() == [0, 1, 3] and t.order.tolist() == [1, 0, 2]


@SETTINGS
@given(data=st.data(), block=blocks(), tail=tails, dtype=st.sampled_from([torch.float32, torch.float64]))
def test_spmm_t(data, block, tail, dtype):
    """The transpose runs over the CSC view and reads the weights through its permutation."""
    kind = data.draw(weight_kinds(tail))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    g = randn((block.num_dst, *tail), dtype, gen)
    w = make_weight(kind, block, tail, dtype, gen)
    out = back(K.spmm_t(block, to_dev(g), to_dev(w)))
    assert_sum_close(out, T.spmm_t(block, g, w), T.spmm_t(block, g.abs().double(), abs_or_none(w)), *EXACT[dtype])


@SETTINGS
@given(data=st.data(), block=blocks(), tail=tails, dtype=st.sampled_from([torch.float32, torch.float64]))
def test_edge_dot(data, block, tail, dtype):
    kind = data.draw(st.sampled_from(["edge", "head"] if len(tail) == 2 else ["edge"]))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    g = randn((block.num_dst, *tail), dtype, gen)
    x = randn((block.num_src, *tail), dtype, gen)
    shape = weight_shape(kind, block, tail)
    out = back(K.edge_dot(block, to_dev(g), to_dev(x), shape))
    expected = T.edge_dot(block, g, x, shape)
    assert_sum_close(out, expected, T.edge_dot(block, g.abs().double(), x.abs().double(), shape), *EXACT[dtype])


@pytest.mark.parametrize("nd, ns", [(5, 7), (40, 50)], ids=["more-edges-than-pairs", "sampled"])
@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("kernels", [K, T], ids=["triton", "torch"])
def test_spmm_is_the_gradient_pair(kernels, heads, nd, ns):
    """spmm_t and edge_dot are spmm's gradients (autograd through a dense form), on a
    block with a long row and F not a multiple of the block size; with one head and
    several (each head's products and permuted weights go through one reused buffer),
    and with fewer (torch's sampled product) or more edges than the block has pairs."""
    gen = torch.Generator().manual_seed(0)
    src = torch.cat([torch.randint(0, ns, (310,), generator=gen), torch.tensor([0, 0, 6])])
    dst = torch.cat([torch.full((310,), 2), torch.tensor([0, 0, 4])])  # rows 1, 3 empty
    order = torch.sort(dst, stable=True).indices
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(torch.bincount(dst, minlength=nd), 0)])
    block = Block(indptr, src[order], ns, torch.arange(ns) * 2)
    x = torch.randn(ns, heads, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(block.num_edges, heads, generator=gen, dtype=torch.float64, requires_grad=True)
    dense = torch.zeros(nd, ns, heads, dtype=torch.float64).index_put((block.row, block.col), w, accumulate=True)
    out = torch.einsum("vuh,uhc->vhc", dense, x)
    g = torch.randn_like(out)
    gx, gw = torch.autograd.grad(out, (x, w), g)
    xd, wd = to_dev(x.detach()), to_dev(w.detach())
    torch.testing.assert_close(back(kernels.spmm(block, xd, wd)), out.detach())
    torch.testing.assert_close(back(kernels.spmm_t(block, to_dev(g), wd)), gx)
    torch.testing.assert_close(back(kernels.edge_dot(block, to_dev(g), xd, w.shape)), gw)


@st.composite
def max_folds(draw, max_blocks: int = 3):
    """2-3 blocks into the same destination rows, each with its own sources, whose global
    ids interleave across blocks (ties between blocks go to the smallest global id)."""
    nd = draw(st.integers(1, 8))
    parts = [draw(blocks(num_dst=nd, max_edges=30, long_row=i == 0)) for i in range(draw(st.integers(2, max_blocks)))]
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    total = sum(b.num_src for b in parts)
    gids = torch.randperm(total, generator=gen) * 2 + 1
    out, start = [], 0
    for b in parts:
        out.append(Block(b.indptr, b.col, b.num_src, gids[start : start + b.num_src].sort().values))
        start += b.num_src
    return nd, out, seed


def fold(module, nd: int, parts: list[Block], xs: list[torch.Tensor], tail, dtype):
    """MaxState folded over the blocks: the Triton one (``module`` K) on DEVICE, its state
    (``value``, ``gid``, ``pos``) left there; the torch one on the CPU."""
    device = DEVICE if module is K else torch.device("cpu")
    state = module.MaxState(nd, tail, dtype, device=device)
    offset = 0
    for b, x in zip(parts, xs):
        state.update(b, x.to(device), offset)
        offset += b.num_src
    return state


@SETTINGS
@given(fold_case=max_folds(), tail=tails, dtype=st.sampled_from([torch.float32, torch.float64]))
def test_max_fold_and_grad(fold_case, tail, dtype):
    """Value, winner (global id and position) exactly, on integer-valued features with
    many ties; then each block's gradient from the saved winners."""
    nd, parts, seed = fold_case
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randint(-2, 3, (b.num_src, *tail), generator=gen).to(dtype) for b in parts]
    got, want = fold(K, nd, parts, xs, tail, dtype), fold(T, nd, parts, xs, tail, dtype)
    assert torch.equal(got.pos.cpu(), want.pos), (got.pos, want.pos)
    assert torch.equal(got.gid.cpu(), want.gid)
    assert torch.equal(got.value.cpu(), want.value)
    assert torch.equal(got.result().cpu(), want.result())
    g = randn((nd, *tail), dtype, gen)
    offset = 0
    for b in parts:
        out = back(K.max_grad(got.pos, to_dev(g), offset, b.num_src))
        magnitude = T.max_grad(want.pos, g.abs(), offset, b.num_src)
        assert_sum_close(out, T.max_grad(want.pos, g, offset, b.num_src), magnitude, *EXACT[dtype])
        offset += b.num_src


def test_max_ties_across_and_within_blocks():
    """Hand-made ties: within a block the smallest source row wins, across blocks the
    smallest global id, whichever block comes first; an empty row gives 0 and no winner."""
    # Block A: sources with global ids 5, 8; block B: global ids 2, 9. Rows: 0, 1, 2 (empty).
    a = Block(torch.tensor([0, 2, 3, 3]), torch.tensor([1, 0, 1]), 2, torch.tensor([5, 8]))
    b = Block(torch.tensor([0, 1, 3, 3]), torch.tensor([1, 0, 1]), 2, torch.tensor([2, 9]))
    xa = torch.tensor([[1.0, 3.0], [1.0, 2.0]])
    xb = torch.tensor([[1.0, 3.0], [1.0, 3.0]])
    state = fold(K, 3, [a, b], [xa, xb], (2,), torch.float32)
    # Row 0: A offers rows 0, 1 (ids 5, 8) -> 1.0 at id 5, 3.0 at id 5; B offers row 1 (id 9).
    # Row 1: A offers row 1 (id 8); B offers rows 0, 1 (ids 2, 9): 1.0 -> id 2, 3.0 -> id 2.
    assert state.gid.cpu().tolist() == [[5, 5], [2, 2], [T._NO_ROW, T._NO_ROW]]
    assert state.pos.cpu().tolist() == [[0, 0], [2, 2], [-1, -1]]
    assert state.result().cpu().tolist() == [[1.0, 3.0], [1.0, 3.0], [0.0, 0.0]]
    g = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], device=DEVICE)
    assert K.max_grad(state.pos, g, 0, 2).cpu().tolist() == [[1.0, 2.0], [0.0, 0.0]]
    assert K.max_grad(state.pos, g, 2, 2).cpu().tolist() == [[3.0, 4.0], [0.0, 0.0]]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), block=blocks(), tail=tails)
def test_half_types(dtype, data, block, tail):
    """Half inputs: every kernel within one ulp (plus fp32 accumulation error) of the fp32
    torch kernels on the same (rounded) inputs. The torch kernels themselves have no
    bf16/fp16 sparse matmul on CPU, hence the fp32 reference."""
    kind = data.draw(weight_kinds(tail))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    ulp, f32 = HALF_ULP[dtype], torch.float32
    x = randn((block.num_src, *tail), dtype, gen)
    g = randn((block.num_dst, *tail), dtype, gen)
    w = make_weight(kind, block, tail, dtype, gen)
    wf = None if w is None else w.to(f32)

    xd, gd, wd = to_dev(x), to_dev(g), to_dev(w)
    out = back(K.spmm(block, xd, wd))
    assert out.dtype == dtype
    magnitude = T.spmm(block, x.abs().double(), abs_or_none(w))
    assert_sum_close(out.to(f32), T.spmm(block, x.to(f32), wf), magnitude, ulp, 1e-5)

    out = back(K.spmm_t(block, gd, wd))
    magnitude = T.spmm_t(block, g.abs().double(), abs_or_none(w))
    assert_sum_close(out.to(f32), T.spmm_t(block, g.to(f32), wf), magnitude, ulp, 1e-5)

    shape = weight_shape("edge" if kind == "none" else kind, block, tail)
    out = back(K.edge_dot(block, gd, xd, shape))
    magnitude = T.edge_dot(block, g.abs().double(), x.abs().double(), shape)
    assert_sum_close(out.to(f32), T.edge_dot(block, g.to(f32), x.to(f32), shape), magnitude, ulp, 1e-5)

    xi = torch.randint(-2, 3, (block.num_src, *tail), generator=gen)
    got, want = fold(K, block.num_dst, [block], [xi.to(dtype)], tail, dtype), fold(T, block.num_dst, [block], [xi.to(f32)], tail, f32)
    assert torch.equal(got.pos.cpu(), want.pos)
    assert torch.equal(got.value.cpu().to(f32), want.value)
    out = back(K.max_grad(got.pos, gd, 0, block.num_src))
    assert out.dtype == dtype
    magnitude = T.max_grad(want.pos, g.abs().double(), 0, block.num_src)
    assert_sum_close(out.to(f32), T.max_grad(want.pos, g.to(f32), 0, block.num_src), magnitude, ulp, 1e-5)
