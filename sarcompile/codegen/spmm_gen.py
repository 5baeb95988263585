"""Triton source for the aggregation kernels: SpMM (sum, weighted or not), its transpose,
the max with its winner, the max's gradient, and the edge-weight gradient (edge_dot).

Node tensors are seen flat, ``[rows, F]``; an edge weight has ``W`` columns (1 for one
weight per edge, ``H`` for one per head) and feature ``f`` is scaled by column ``f // C``
with ``C = F // W``. The mean is a sum the runtime divides by the in-degree.

How each backward avoids races:

* SpMM's transpose is the same SpMM kernel run over the block's CSC view (edges sorted by
  source, ``perm`` mapping them back to CSR positions to read the weights): every output
  row is owned by one program, so no atomics and a deterministic result.
* The max's gradient goes to one winner per (row, feature). Walking the CSC view would
  need to tell repeated edges u->v apart; instead each destination row adds its gradient
  to its winner with an fp32 atomic add (fp16 atomics are unreliable). Only ``F`` values
  per row move, so contention is low.
"""

from __future__ import annotations

from dataclasses import dataclass

from sarcompile.codegen.kernel_cache import KernelSpec, autotune, configs_line, header

__all__ = ["EdgeDotSpec", "MaxGradSpec", "MaxSpec", "SpmmSpec", "acc_type", "pow2"]


def pow2(n: int) -> int:
    """The smallest power of two >= n (Triton's block shapes must be powers of two)."""
    p = 1
    while p < n:
        p *= 2
    return p


def acc_type(dtype: str) -> str:
    """Accumulate half types in fp32; float64 stays float64."""
    return "tl.float64" if dtype == "float64" else "tl.float32"


def _feature_configs(width: int, block_e: list[int]) -> list[tuple[dict[str, int], int]]:
    """A small autotune space: edge chunk x feature block, two warp counts; the first
    entry is the interpreter's fixed choice."""
    blocks_f = sorted({min(b, pow2(width)) for b in (64, 32, 128)}, key=lambda b: (b != min(64, pow2(width)), b))
    return [({"BLOCK_E": e, "BLOCK_F": f}, w) for f in blocks_f for e in block_e for w in (4, 2)][:8]


@dataclass(frozen=True)
class SpmmSpec(KernelSpec):
    """``out[v, f] = sum_{e in row v} w[e, f // C] * x[col[e], f]`` over a CSR (or, with
    ``permuted``, the CSC view of a block, reading weights at ``perm[e]``)."""

    family = "spmm_sum"
    width: int  # F
    weight_cols: int  # W; 0 when there is no edge weight
    dtype: str
    permuted: bool = False

    def render(self, target: str) -> str:
        f, w = self.width, self.weight_cols
        weight = ""
        if w:
            at = "tl.load(perm + e, mask=e_ok, other=0).to(tl.int64)" if self.permuted else "e"
            weight = (
                f"        w_at = {at}\n"
                f"        w = tl.load(weight + w_at[:, None] * {w} + (f // {f // w})[None, :], mask=ok, other=0.0)\n"
                f"        vals = vals * w.to({acc_type(self.dtype)})\n"
            )
        configs = _feature_configs(f, [16, 32])
        return (
            header(self, target, f"Sum aggregation over a CSR, F={f}, {'W=' + str(w) if w else 'unweighted'}, {self.dtype}.")
            + configs_line(configs)
            + "\n\n"
            + autotune(target, configs, ["num_rows"])
            + f'''@triton.jit
def kernel(indptr, col, perm, weight, x, out, num_rows, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    v = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = f < {f}
    start = tl.load(indptr + v).to(tl.int64)
    end = tl.load(indptr + v + 1).to(tl.int64)
    acc = tl.zeros([BLOCK_F], dtype={acc_type(self.dtype)})
    for e0 in range(start, end, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        e_ok = e < end
        ok = e_ok[:, None] & f_ok[None, :]
        u = tl.load(col + e, mask=e_ok, other=0).to(tl.int64)
        vals = tl.load(x + u[:, None] * {f} + f[None, :], mask=ok, other=0.0).to({acc_type(self.dtype)})
{weight}        acc += tl.sum(vals, axis=0)
    tl.store(out + v * {f} + f, acc.to(out.dtype.element_ty), mask=f_ok)
'''
        )


@dataclass(frozen=True)
class MaxSpec(KernelSpec):
    """Per destination row and feature of one block: the max over in-edges and the
    smallest source row reaching it (int64 max for a row without in-edges); the runtime
    merges blocks by global id."""

    family = "spmm_max"
    width: int
    dtype: str

    def render(self, target: str) -> str:
        f = self.width
        configs = _feature_configs(f, [16, 32])
        return (
            header(self, target, f"Max aggregation with the winning source row, F={f}, {self.dtype}.")
            + configs_line(configs)
            + "\n\n"
            + autotune(target, configs, ["num_rows"])
            + f'''@triton.jit
def kernel(indptr, col, x, best_out, row_out, num_rows, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    v = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = f < {f}
    start = tl.load(indptr + v).to(tl.int64)
    end = tl.load(indptr + v + 1).to(tl.int64)
    best = tl.full([BLOCK_F], float("-inf"), {acc_type(self.dtype)})
    arg = tl.full([BLOCK_F], 9223372036854775807, tl.int64)  # no candidate (int64 max): larger than any row
    for e0 in range(start, end, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        e_ok = e < end
        ok = e_ok[:, None] & f_ok[None, :]
        u = tl.load(col + e, mask=e_ok, other=0).to(tl.int64)
        vals = tl.load(x + u[:, None] * {f} + f[None, :], mask=ok, other=float("-inf")).to({acc_type(self.dtype)})
        chunk_best = tl.max(vals, axis=0)
        # Ties go to the smallest source row (rows are sorted by global id).
        cand = tl.where(ok & (vals == chunk_best[None, :]), u[:, None], 9223372036854775807)
        chunk_arg = tl.min(cand, axis=0)
        take = (chunk_best > best) | ((chunk_best == best) & (chunk_arg < arg))
        best = tl.where(take, chunk_best, best)
        arg = tl.where(take, chunk_arg, arg)
    tl.store(best_out + v * {f} + f, best.to(best_out.dtype.element_ty), mask=f_ok)
    tl.store(row_out + v * {f} + f, arg, mask=f_ok)
'''
        )


@dataclass(frozen=True)
class MaxGradSpec(KernelSpec):
    """Gradient of the max for one block's source rows: each destination row adds its
    gradient to its winner if the winner is in this block (``offset <= pos < offset +
    num_src``), with an fp32 atomic add (see the module docstring)."""

    family = "spmm_max_grad"
    width: int
    dtype: str

    def render(self, target: str) -> str:
        f = self.width
        configs = [({"BLOCK_F": b}, w) for b in sorted({min(64, pow2(f)), min(128, pow2(f))}) for w in (4, 2)]
        return (
            header(self, target, f"Gradient of the max aggregation, F={f}, {self.dtype}, accumulated in fp32.")
            + configs_line(configs)
            + "\n\n"
            + autotune(target, configs, ["num_rows"], reset_to_zero=("out",))
            + f'''@triton.jit
def kernel(pos, g, out, offset, num_src, num_rows, BLOCK_F: tl.constexpr):
    v = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = f < {f}
    winner = tl.load(pos + v * {f} + f, mask=f_ok, other=-1)
    hit = f_ok & (winner >= offset) & (winner < offset + num_src)
    grad = tl.load(g + v * {f} + f, mask=hit, other=0.0).to({acc_type(self.dtype)})
    tl.atomic_add(out + (winner - offset) * {f} + f, grad, mask=hit)
'''
        )


@dataclass(frozen=True)
class EdgeDotSpec(KernelSpec):
    """Gradient of an SpMM's edge weights: ``out[e, k] = sum_c g[row[e], k*C + c] *
    x[col[e], k*C + c]`` for each of the ``W`` weight columns, one program per chunk of
    edges and column; nothing per edge and feature is materialised."""

    family = "edge_dot"
    width: int
    weight_cols: int
    dtype: str

    def render(self, target: str) -> str:
        f, w = self.width, self.weight_cols
        c = f // w
        configs = [({"BLOCK_E": e, "BLOCK_C": b}, 4) for b in sorted({min(32, pow2(c)), min(64, pow2(c))}) for e in (32, 64)]
        return (
            header(self, target, f"Per-edge dot products for edge-weight gradients, F={f}, W={w}, {self.dtype}.")
            + configs_line(configs)
            + "\n\n"
            + autotune(target, configs, ["num_edges"])
            + f'''@triton.jit
def kernel(row, col, g, x, out, num_edges, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr):
    e = tl.program_id(0).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
    k = tl.program_id(1)
    e_ok = e < num_edges
    v = tl.load(row + e, mask=e_ok, other=0).to(tl.int64)
    u = tl.load(col + e, mask=e_ok, other=0).to(tl.int64)
    acc = tl.zeros([BLOCK_E], dtype={acc_type(self.dtype)})
    for c0 in range(0, {c}, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        ok = e_ok[:, None] & (c < {c})[None, :]
        feature = k * {c} + c
        gv = tl.load(g + v[:, None] * {f} + feature[None, :], mask=ok, other=0.0).to({acc_type(self.dtype)})
        xu = tl.load(x + u[:, None] * {f} + feature[None, :], mask=ok, other=0.0).to({acc_type(self.dtype)})
        acc += tl.sum(gv * xu, axis=1)
    tl.store(out + e * {w} + k, acc.to(out.dtype.element_ty), mask=e_ok)
'''
        )
