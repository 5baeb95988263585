"""Triton source for fused graph attention (GAT): the forward's online softmax over
blocks and the backward's two race-free passes.

An edge ``e = u -> v`` of a block has, per head ``k``, the score ``s = leaky_relu(a_src[u, k]
+ a_dst[v, k] [+ a_edge[e, k]])`` (the edge term, GATConv's edge features, only with
``edge_score``); the output is ``out[v, k] = sum_e softmax_v(s)_e * keep_e * h[u, k]``
over all of ``v``'s in-edges, which may be spread over several blocks (one per source
partition).

Forward (FlashAttention's online softmax, one program per destination row and all heads
in the program): the row keeps a running max ``m``, a running sum ``l`` of ``exp(s - m)``
and a running weighted sum ``acc`` -- the state of
:class:`~sarcompile.codegen.torch_kernels.AttentionState`, updated in place. Each chunk
of ``BLOCK_E`` in-edges may raise the max, and what was accumulated is then rescaled by
``exp(m_old - m_new)``; so a block is folded in one pass over its edges and the state
carries over to the next block.

Backward recomputes ``P = exp(s - lse[v])`` per edge from the saved log-sum-exp, and uses
``delta[v] = sum_c dOut[v] * Out[v]`` (FlashAttention's D) for the softmax's row term:

* ``kernel_dst`` walks the CSR, one program per destination row: ``d_a_dst[v]`` (and
  the edge term's gradient ``d_a_edge[e]``, one store per edge).
* ``kernel_src`` walks the CSC view (edges sorted by source, ``t_perm`` giving each
  edge's CSR position to read its dropout multiplier and edge term), one program per source row:
  ``d_h[u]`` and ``d_a_src[u]``.

Every output row is owned by one program, so there are no atomics and the result is
deterministic. Neither direction keeps a tensor with one entry per edge and head: the
probabilities, the per-edge dot products and the score gradients live only in a chunk's
registers, which is what lets attention scale to graphs whose ``E x H`` would not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from sarcompile.errors import KernelError
from sarcompile.codegen.kernel_cache import KernelSpec, autotune, configs_line, header
from sarcompile.codegen.spmm_gen import acc_type, pow2

__all__ = ["AttentionBackwardSpec", "AttentionForwardSpec"]

# Elements of the largest [BLOCK_E, HP, CP] tile a config may use: bounds registers.
_TILE_ELEMENTS = 8192


def _edge_configs(heads: int, channels: int) -> list[tuple[dict[str, int], int]]:
    """Two edge-chunk sizes whose ``[BLOCK_E, HP, CP]`` tile fits :data:`_TILE_ELEMENTS`,
    two warp counts each; the first entry is the interpreter's fixed choice."""
    tile = pow2(heads) * pow2(channels)
    blocks = ([b for b in (16, 32, 8, 4, 2, 1) if b * tile <= _TILE_ELEMENTS] or [1])[:2]
    return [({"BLOCK_E": b}, w) for b in blocks for w in ((4, 8) if b * tile >= 4096 else (4, 2))]


def _slope_type(dtype: str) -> str:
    """The type of the runtime ``negative_slope`` argument: a plain Python float becomes an
    fp32 scalar on CUDA, which would perturb float64 scores by ~1e-8 relative."""
    return acc_type(dtype)


def _check(heads: int, channels: int, dtype: str) -> None:
    if heads < 1 or channels < 0:
        raise KernelError(f"attention kernels need heads >= 1 and channels >= 0, got {heads}, {channels}")
    if dtype not in ("float16", "bfloat16", "float32", "float64"):
        raise KernelError(f"attention kernels take floating dtypes, got {dtype}")


@dataclass(frozen=True)
class _AttentionSpec(KernelSpec):
    """What both attention kernels are specialised on."""

    heads: int
    channels: int
    dropout: bool
    dtype: str
    edge_score: bool = False  # a per-edge term a_edge [E, H] is added to the scores

    def _options(self) -> str:
        return ", ".join(
            ("dropout" if self.dropout else "no dropout", "edge scores" if self.edge_score else "no edge scores")
        )

    def _edge_term(self, pos: str, acc_t: str) -> str:
        """The line adding the edge term of the edges at CSR positions ``pos`` to ``pre``
        (after the node terms, as the torch kernels and PyG add them), or nothing."""
        if not self.edge_score:
            return ""
        return f"        pre = pre + tl.load(a_edge + {pos}[:, None] * {self.heads} + hh[None, :], mask=eh_ok, other=0.0).to({acc_t})\n"


@dataclass(frozen=True)
class AttentionForwardSpec(_AttentionSpec):
    """Fold one block into the online-softmax state, in place.

    Contract of ``kernel(indptr, col, keep, a_edge, h, a_src, a_dst, m, l, acc,
    negative_slope, num_rows, BLOCK_E)``, grid ``(num_rows,)``: for every destination row
    ``v`` of the block (CSR ``indptr``/``col``) and head ``k``, with ``s_e =
    leaky_relu(a_src[col[e], k] + a_dst[v, k] [+ a_edge[e, k]])`` over ``v``'s in-edges
    ``e``::

        m_new = max(m[v, k], max_e s_e)
        l[v, k]   = l[v, k] * exp(m[v, k] - m_new) + sum_e exp(s_e - m_new)
        acc[v, k] = acc[v, k] * exp(m[v, k] - m_new) + sum_e exp(s_e - m_new) * keep[e, k] * h[col[e], k]
        m[v, k]   = m_new

    (``keep`` is read only with ``dropout``, ``a_edge [E, H]`` only with ``edge_score``;
    ``e`` is the CSR position). Rows without in-edges are left as they were;
    a row whose max is still ``-inf`` gets no nan. Shapes: ``h [num_src, H, C]``, ``a_src
    [num_src, H]``, ``a_dst``/``m``/``l [num_rows, H]``, ``acc [num_rows, H, C]``,
    ``keep [E, H]``, all contiguous. Accumulates in fp32 (fp64 for float64).
    """

    family = "attention_fwd"

    def render(self, target: str) -> str:
        H, C = self.heads, self.channels
        _check(H, C, self.dtype)
        acc_t = acc_type(self.dtype)
        configs = _edge_configs(H, C)
        weight = "p"
        keep = ""
        if self.dropout:
            weight = "p * drop"
            keep = (
                "        # Dropout scales an edge's message, not its share of the softmax's sum.\n"
                f"        drop = tl.load(keep + e[:, None] * {H} + hh[None, :], mask=eh_ok, other=0.0).to({acc_t})\n"
            )
        doc = f"Attention forward (online softmax over blocks), H={H}, C={C}, {self._options()}, {self.dtype}."
        return (
            header(self, target, doc)
            + configs_line(configs)
            + "\n\n"
            + autotune(target, configs, ["num_rows"], restore_value=("m", "l", "acc"))
            + f'''@triton.jit
def kernel(indptr, col, keep, a_edge, h, a_src, a_dst, m, l, acc, negative_slope: {_slope_type(self.dtype)}, num_rows, BLOCK_E: tl.constexpr):
    v = tl.program_id(0).to(tl.int64)
    # Heads and channels padded to powers of two ({pow2(H)} x {pow2(C)}), masked.
    hh = tl.arange(0, {pow2(H)})
    cc = tl.arange(0, {pow2(C)})
    h_ok = hh < {H}
    hc_ok = h_ok[:, None] & (cc < {C})[None, :]
    start = tl.load(indptr + v).to(tl.int64)
    end = tl.load(indptr + v + 1).to(tl.int64)
    # The row's running state: max, sum of exp(score - max), weighted sum.
    m_run = tl.load(m + v * {H} + hh, mask=h_ok, other=float("-inf")).to({acc_t})
    l_run = tl.load(l + v * {H} + hh, mask=h_ok, other=0.0).to({acc_t})
    acc_run = tl.load(acc + v * {H * C} + hh[:, None] * {C} + cc[None, :], mask=hc_ok, other=0.0).to({acc_t})
    a_v = tl.load(a_dst + v * {H} + hh, mask=h_ok, other=0.0).to({acc_t})
    for e0 in range(start, end, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        e_ok = e < end
        eh_ok = e_ok[:, None] & h_ok[None, :]
        u = tl.load(col + e, mask=e_ok, other=0).to(tl.int64)
        pre = tl.load(a_src + u[:, None] * {H} + hh[None, :], mask=eh_ok, other=0.0).to({acc_t}) + a_v[None, :]
{self._edge_term("e", acc_t)}        score = tl.where(pre > 0, pre, pre * negative_slope)
        score = tl.where(eh_ok, score, float("-inf"))  # padding takes no share
        m_new = tl.maximum(m_run, tl.max(score, axis=0))
        # A head that has seen no score yet (padding) keeps m = -inf: subtract 0 there,
        # not -inf, so that exp gives 0 rather than nan.
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        rescale = tl.exp(m_run - m_ref)  # what was accumulated under the old max
        p = tl.exp(score - m_ref[None, :])
{keep}        x = tl.load(
            h + u[:, None, None] * {H * C} + hh[None, :, None] * {C} + cc[None, None, :],
            mask=e_ok[:, None, None] & hc_ok[None, :, :],
            other=0.0,
        ).to({acc_t})
        l_run = l_run * rescale + tl.sum(p, axis=0)
        acc_run = acc_run * rescale[:, None] + tl.sum(({weight})[:, :, None] * x, axis=0)
        m_run = m_new
    tl.store(m + v * {H} + hh, m_run.to(m.dtype.element_ty), mask=h_ok)
    tl.store(l + v * {H} + hh, l_run.to(l.dtype.element_ty), mask=h_ok)
    tl.store(acc + v * {H * C} + hh[:, None] * {C} + cc[None, :], acc_run.to(acc.dtype.element_ty), mask=hc_ok)
'''
        )


@dataclass(frozen=True)
class AttentionBackwardSpec(_AttentionSpec):
    """Gradients of one block's attention from the saved log-sum-exp: two kernels.

    Per edge ``e = u -> v`` and head ``k`` both recompute ``pre = a_src[u] + a_dst[v]
    [+ a_edge[e]]``,
    ``P = exp(leaky_relu(pre) - lse[v])``, ``dw = <d_out[v, k], h[u, k]>``, ``d_score = P *
    (keep_e * dw - delta[v])`` and ``d_pre = d_score`` if ``pre > 0`` else ``negative_slope
    * d_score`` (``keep_e = 1`` without ``dropout``).

    * ``kernel_dst(indptr, col, keep, a_edge, h, a_src, a_dst, lse, d_out, delta, d_dst,
      d_edge, negative_slope, num_rows, BLOCK_E)``, grid ``(num_dst,)``: ``d_dst[v] = sum_e
      d_pre`` over ``v``'s in-edges (CSR), and with ``edge_score`` ``d_edge[e] = d_pre`` for
      each of them.
    * ``kernel_src(t_indptr, t_row, t_perm, keep, a_edge, h, a_src, a_dst, lse, d_out,
      delta, d_h, d_src, negative_slope, num_rows, BLOCK_E)``, grid ``(num_src,)``: over
      ``u``'s out-edges (CSC view; ``t_perm`` gives each edge's CSR position, where ``keep``
      and ``a_edge`` are indexed), ``d_h[u, k] = sum_e P * keep_e * d_out[v, k]`` and
      ``d_src[u] = sum_e d_pre``.

    Every row of ``d_dst``, ``d_h`` and ``d_src`` is written (0 for rows without edges), and
    with ``edge_score`` every row of ``d_edge`` once;
    nothing is accumulated into, so no atomics and no zeroing. Shapes as for
    :class:`AttentionForwardSpec`, ``lse``/``delta [num_dst, H]``, ``d_out [num_dst, H, C]``.
    """

    family = "attention_bwd"

    def render(self, target: str) -> str:
        H, C = self.heads, self.channels
        _check(H, C, self.dtype)
        acc_t = acc_type(self.dtype)
        configs = _edge_configs(H, C)
        slope = f"negative_slope: {_slope_type(self.dtype)}"
        doc = f"Attention backward (two passes, no atomics), H={H}, C={C}, {self._options()}, {self.dtype}."

        def keep_at(pos: str) -> str:
            if not self.dropout:
                return ""
            return f"        drop = tl.load(keep + {pos}[:, None] * {H} + hh[None, :], mask=eh_ok, other=0.0).to({acc_t})\n"

        dropped_p, dropped_dw = ("(p * drop)", "drop * dw") if self.dropout else ("p", "dw")

        # The per-edge recomputation both passes share (their operands differ in shape:
        # per row in one pass, per edge in the other).
        def edge_terms(a_src_at: str, a_dst_at: str, lse_at: str, pos: str) -> str:
            return (
                f"        pre = {a_src_at} + {a_dst_at}\n"
                + self._edge_term(pos, acc_t)
                + "        score = tl.where(pre > 0, pre, pre * negative_slope)\n"
                "        # P <= 1: lse is the log of the row's full softmax sum. Padding gets 0.\n"
                f"        p = tl.where(eh_ok, tl.exp(score - {lse_at}), 0.0)\n"
            )

        d_pre = (
            f"        d_score = p * ({dropped_dw} - delta_v)\n"
            "        d_pre = tl.where(pre > 0, d_score, d_score * negative_slope)\n"
        )
        # The CSR position of the CSC walk's edges: where keep and a_edge are indexed.
        position = (
            "        pos = tl.load(t_perm + e, mask=e_ok, other=0).to(tl.int64)  # CSR position\n"
            if self.dropout or self.edge_score else ""
        )
        store_edge = (
            f"        tl.store(d_edge + e[:, None] * {H} + hh[None, :], d_pre.to(d_edge.dtype.element_ty), mask=eh_ok)\n"
            if self.edge_score else ""
        )
        common = f'''    # Heads and channels padded to powers of two ({pow2(H)} x {pow2(C)}), masked.
    hh = tl.arange(0, {pow2(H)})
    cc = tl.arange(0, {pow2(C)})
    h_ok = hh < {H}
    hc_ok = h_ok[:, None] & (cc < {C})[None, :]
'''
        dst = f'''@triton.jit
def kernel_dst(indptr, col, keep, a_edge, h, a_src, a_dst, lse, d_out, delta, d_dst, d_edge, {slope}, num_rows, BLOCK_E: tl.constexpr):
    v = tl.program_id(0).to(tl.int64)
{common}    start = tl.load(indptr + v).to(tl.int64)
    end = tl.load(indptr + v + 1).to(tl.int64)
    a_v = tl.load(a_dst + v * {H} + hh, mask=h_ok, other=0.0).to({acc_t})
    lse_v = tl.load(lse + v * {H} + hh, mask=h_ok, other=0.0).to({acc_t})
    delta_v = tl.load(delta + v * {H} + hh, mask=h_ok, other=0.0).to({acc_t})
    g = tl.load(d_out + v * {H * C} + hh[:, None] * {C} + cc[None, :], mask=hc_ok, other=0.0).to({acc_t})
    d_a = tl.zeros([{pow2(H)}], dtype={acc_t})
    for e0 in range(start, end, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        e_ok = e < end
        eh_ok = e_ok[:, None] & h_ok[None, :]
        u = tl.load(col + e, mask=e_ok, other=0).to(tl.int64)
        a_u = tl.load(a_src + u[:, None] * {H} + hh[None, :], mask=eh_ok, other=0.0).to({acc_t})
{edge_terms("a_u", "a_v[None, :]", "lse_v[None, :]", "e")}        x = tl.load(
            h + u[:, None, None] * {H * C} + hh[None, :, None] * {C} + cc[None, None, :],
            mask=e_ok[:, None, None] & hc_ok[None, :, :],
            other=0.0,
        ).to({acc_t})
        dw = tl.sum(x * g[None, :, :], axis=2)  # <d_out[v], h[u]> per edge and head
{keep_at("e")}{d_pre}{store_edge}        d_a += tl.sum(d_pre, axis=0)
    tl.store(d_dst + v * {H} + hh, d_a.to(d_dst.dtype.element_ty), mask=h_ok)
'''
        src = f'''@triton.jit
def kernel_src(t_indptr, t_row, t_perm, keep, a_edge, h, a_src, a_dst, lse, d_out, delta, d_h, d_src, {slope}, num_rows, BLOCK_E: tl.constexpr):
    u = tl.program_id(0).to(tl.int64)
{common}    start = tl.load(t_indptr + u).to(tl.int64)
    end = tl.load(t_indptr + u + 1).to(tl.int64)
    a_u = tl.load(a_src + u * {H} + hh, mask=h_ok, other=0.0).to({acc_t})
    x = tl.load(h + u * {H * C} + hh[:, None] * {C} + cc[None, :], mask=hc_ok, other=0.0).to({acc_t})
    d_x = tl.zeros([{pow2(H)}, {pow2(C)}], dtype={acc_t})
    d_a = tl.zeros([{pow2(H)}], dtype={acc_t})
    for e0 in range(start, end, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)  # positions in CSC order
        e_ok = e < end
        eh_ok = e_ok[:, None] & h_ok[None, :]
        v = tl.load(t_row + e, mask=e_ok, other=0).to(tl.int64)
        a_v = tl.load(a_dst + v[:, None] * {H} + hh[None, :], mask=eh_ok, other=0.0).to({acc_t})
        lse_v = tl.load(lse + v[:, None] * {H} + hh[None, :], mask=eh_ok, other=0.0).to({acc_t})
        delta_v = tl.load(delta + v[:, None] * {H} + hh[None, :], mask=eh_ok, other=0.0).to({acc_t})
{position}{edge_terms("a_u[None, :]", "a_v", "lse_v", "pos")}        g = tl.load(
            d_out + v[:, None, None] * {H * C} + hh[None, :, None] * {C} + cc[None, None, :],
            mask=e_ok[:, None, None] & hc_ok[None, :, :],
            other=0.0,
        ).to({acc_t})
        dw = tl.sum(g * x[None, :, :], axis=2)  # <d_out[v], h[u]> per edge and head
{keep_at("pos")}        d_x += tl.sum({dropped_p}[:, :, None] * g, axis=0)
{d_pre}        d_a += tl.sum(d_pre, axis=0)
    tl.store(d_h + u * {H * C} + hh[:, None] * {C} + cc[None, :], d_x.to(d_h.dtype.element_ty), mask=hc_ok)
    tl.store(d_src + u * {H} + hh, d_a.to(d_src.dtype.element_ty), mask=h_ok)
'''
        return (
            header(self, target, doc)
            + configs_line(configs, "CONFIGS_DST")
            + configs_line(configs, "CONFIGS_SRC")
            + "\n\n"
            + autotune(target, configs, ["num_rows"])
            + dst
            + "\n\n"
            + autotune(target, configs, ["num_rows"])
            + src
        )
