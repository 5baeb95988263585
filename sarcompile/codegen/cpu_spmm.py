"""A CPU sparse product of our own, in C, compiled on first use.

``out[r] (+)= sum over the row's entries e of v[e] * x[col[e]]`` for a CSR matrix and a
dense ``x``, with the source row eight entries ahead prefetched. torch's CSR product
(MKL's) reads ``x``'s rows in entry order and waits for each one: once ``x`` outgrows the
cache (a 128-wide float ``x`` of more than about 60k rows here) nearly every row is a
miss. Measured on SBM graphs of average degree 20 (docs/kernels.md): 400k nodes, 251 ms
against MKL's 457 at 128 features and 440 against 778 at 256. Where the source rows split
into a few cache-sized tiles (:meth:`sarcompile.graph.graph.Block.tiles`) MKL's product tile
by tile is as fast (100k nodes: 81 ms against this kernel's 86 at 256 features, 53 against
38 at 128), so the kernel takes the products of one tile: those too small for tiles and
those too large (``tile_count``), of at least :data:`MIN_ENTRIES` entries, whose dense
operand outgrows the cache (:data:`MIN_OPERAND_BYTES`).

The source below is compiled with the system's C compiler (``$CC``, else ``cc``) into the
kernel cache (``$SARCOMPILE_KERNEL_CACHE``, else ``~/.cache/sarcompile/kernels``), under a
name that hashes the source, the flags and the CPU (``-march=native``: a cache shared by
machines of different CPUs must not hand one's code to another), written to a temporary
name and renamed. Rows are split into ``torch.get_num_threads()`` ranges of equal entry
counts, run on Python threads (ctypes lets go of the GIL): no second OpenMP runtime beside
torch's. Where no compiler works, or ``SARCOMPILE_CPU_KERNEL=0``, products stay with
torch's (in tiles); a failed build is reported once, as a warning.
"""

from __future__ import annotations

import ctypes
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from sarcompile.codegen import native

__all__ = ["MIN_ENTRIES", "MIN_OPERAND_BYTES", "enabled", "spmm_into", "usable"]

# Products of fewer entries stay with torch's: a first small product (a test's, a tiny
# graph's) should not wait for a compiler.
MIN_ENTRIES = 1 << 16
# And so do products whose dense operand fits the cache (as a tile's rows do): MKL reads
# it from there without waiting, and the kernel's prefetches and threads cost more than
# they save. A 131k-entry product over 100k rows took 1.24 ms here against MKL's 0.45 at
# 16 features (6 MB), 3.6 against 3.4 at 48; 2.5 against 3.9 at 64 (26 MB).
MIN_OPERAND_BYTES = 16 << 20
PREFETCH = 8  # entries ahead (4: 10-25% slower on 100k-400k nodes, 16: no faster)

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#define KERNEL(NAME, VAL, IDX)                                                              \
void NAME(int64_t r0, int64_t r1, int64_t width, const IDX* indptr, const IDX* col,        \
          const VAL* v, const VAL* x, int64_t ldx, VAL* out, int64_t ldo, int accumulate) { \
    int64_t last = indptr[r1];                                                              \
    for (int64_t r = r0; r < r1; r++) {                                                     \
        VAL* o = out + r * ldo;                                                             \
        if (!accumulate) memset(o, 0, sizeof(VAL) * width);                                 \
        int64_t end = indptr[r + 1];                                                        \
        for (int64_t e = indptr[r]; e < end; e++) {                                         \
            if (e + PREFETCH < last) {                                                      \
                const char* q = (const char*)(x + (int64_t)col[e + PREFETCH] * ldx);        \
                for (int64_t b = 0; b < width * (int64_t)sizeof(VAL); b += 64)              \
                    __builtin_prefetch(q + b);                                              \
            }                                                                               \
            const VAL* xr = x + (int64_t)col[e] * ldx;                                      \
            VAL w = v ? v[e] : (VAL)1;                                                      \
            _Pragma("omp simd")                                                             \
            for (int64_t k = 0; k < width; k++) o[k] += w * xr[k];                          \
        }                                                                                   \
    }                                                                                       \
}
KERNEL(spmm_float_int, float, int32_t)
KERNEL(spmm_float_long, float, int64_t)
KERNEL(spmm_double_int, double, int32_t)
KERNEL(spmm_double_long, double, int64_t)
"""
_FLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-shared", "-fPIC", f"-DPREFETCH={PREFETCH}"]
_VALUES = {torch.float32: "float", torch.float64: "double"}
_INDICES = {torch.int32: "int", torch.int64: "long"}

_pool: tuple[int, int, ThreadPoolExecutor] | None = None  # (the pid that made it, its threads, the pool)


def enabled() -> bool:
    """Whether CPU products may use this kernel: not turned off, on Linux, with a
    compiler. (Cheap: it builds nothing.)"""
    if os.environ.get("SARCOMPILE_CPU_KERNEL", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    return native.found(os.environ.get("CC", "cc"))


def usable(x: torch.Tensor, out: torch.Tensor | None, values: torch.Tensor | None, index: torch.Tensor,
           entries: int) -> bool:
    """Whether a product of ``entries`` entries with these operands runs here: large
    enough (entries, and ``x``'s bytes), on the CPU, float32 or float64 rows with unit
    stride, and nothing to differentiate through (autograd takes torch's product)."""
    tensors = [t for t in (x, out, values) if t is not None]
    return (
        entries >= MIN_ENTRIES
        and x.shape[0] * x.shape[1] * x.element_size() >= MIN_OPERAND_BYTES
        and x.dtype in _VALUES
        and index.dtype in _INDICES
        and all(t.device.type == "cpu" and t.dtype == x.dtype for t in tensors)
        and x.stride(-1) == 1
        and (out is None or out.stride(-1) == 1)
        and (values is None or values.is_contiguous())
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
        and enabled()
        and _library.get() is not None
    )


def spmm_into(indptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor | None, x: torch.Tensor,
              out: torch.Tensor, accumulate: bool) -> torch.Tensor:
    """``out = A @ x`` (``accumulate``: ``out += A @ x``) for the CSR ``A`` of ``indptr``,
    ``col`` and ``values`` (ones if None), ``x`` ``[cols, F]`` and ``out`` ``[rows, F]``, both
    with rows of unit stride (strided views are fine). Call only where :func:`usable`."""
    lib = _library.get()
    fn = getattr(lib, f"spmm_{_VALUES[x.dtype]}_{_INDICES[col.dtype]}")
    indptr, col = indptr.to(col.dtype).contiguous(), col.contiguous()
    pointers = (indptr.data_ptr(), col.data_ptr(), None if values is None else values.data_ptr(), x.data_ptr())
    args = (x.shape[1], *pointers, x.stride(0), out.data_ptr(), out.stride(0), int(accumulate))
    ranges = _row_ranges(indptr, torch.get_num_threads())
    if len(ranges) == 1:
        fn(*ranges[0], *args)
    else:
        for done in [_threads().submit(fn, lo, hi, *args) for lo, hi in ranges]:
            done.result()
    return out


def _row_ranges(indptr: torch.Tensor, parts: int) -> list[tuple[int, int]]:
    """Up to ``parts`` consecutive row ranges of about equal entry counts."""
    rows = indptr.numel() - 1
    marks = torch.linspace(0, int(indptr[-1]), parts + 1, device=indptr.device)[1:-1].to(indptr.dtype)
    cuts = [0, *torch.searchsorted(indptr, marks).clamp(max=rows).tolist(), rows]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a] or [(0, rows)]


def _threads() -> ThreadPoolExecutor:
    """A pool of torch's thread count, made again in a forked child (a parent's threads
    do not survive a fork)."""
    global _pool
    key = (os.getpid(), torch.get_num_threads())
    if _pool is None or _pool[:2] != key:
        _pool = (*key, ThreadPoolExecutor(key[1], thread_name_prefix="sarcompile-spmm"))
    return _pool[2]


def _build() -> Path:
    return native.build("cpu_spmm", _SOURCE, os.environ.get("CC", "cc"), _FLAGS, depends=native.cpu())


def _declare(lib: ctypes.CDLL) -> None:
    for values in _VALUES.values():
        for index in _INDICES.values():
            fn = getattr(lib, f"spmm_{values}_{index}")
            fn.argtypes = [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.c_void_p,
                                                                          ctypes.c_int64, ctypes.c_int]
            fn.restype = None


# Built (once per machine) and loaded on first use.
_library = native.Library(_build, _declare, "sarcompile's CPU sparse kernel",
                          "sparse products use torch's instead (slower on large graphs). Install a C compiler (cc, "
                          "or set CC) or set SARCOMPILE_CPU_KERNEL=0 to silence this.")
