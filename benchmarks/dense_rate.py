"""How fast this CPU runs the dense products of SAGE's step, against what its cores can do.

    python benchmarks/dense_rate.py              # 100k rows, as in the DGL comparison
    python benchmarks/dense_rate.py --rows 20000 --repeats 3    # a quick look

On one process most of SAGE's step is dense products (`docs/benchmarks.md`), the same FLOPs
on both sides of the DGL comparison, run by torch's BLAS (MKL on x86 builds). Whether such
a step can be made much faster than DGL's therefore depends on how close those products
already run to the CPU's peak. This script measures both:

* the cores' **peak**: a loop of independent fused multiply-adds (AVX-512 where the compiler
  targets it, else AVX2), on one core and on all of torch's threads at once, with the clock
  read from a chain of dependent integer adds (one a cycle). It is C, built with the
  system's compiler through :mod:`sarcompile.codegen.native` (skipped where none works, or off x86);
* the **products** of SAGE's layers at ``--rows`` rows: the 256-wide layer's forward
  ``x W^T``, input gradient ``g W`` and weights' gradient ``g^T x``, and the first layer's
  128-wide forward and weights' gradient, by ``torch.mm`` into a buffer made once, and the
  forward ones also by oneDNN (``torch.ops.mkldnn._linear_pointwise``, where torch has it;
  it makes its output, so preload tcmalloc for a fair comparison). Each engine's products
  take turns with the other's, ``--repeats`` times; medians.

Prints a table and writes benchmarks/results/dense_rate.json and .png.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from harness import figure, results_dir, write_result  # (this directory is on the path: the script's)
from sarcompile.codegen import native
from sarcompile.dist.memory import active_allocator


_PEAK_SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
/* Cycles a second: a chain of dependent adds runs at one a cycle. */
double clock_hz(int64_t n) {
    uint64_t a = 0; double t = now();
    for (int64_t i = 0; i < n; i++) __asm__ volatile("add $1, %0" : "+r"(a));
    return n / (now() - t);
}
/* FLOP a second of 12 independent FMA chains, one vector wide each. */
#ifdef __AVX512F__
#define VEC __m512
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define LANES 16
#else
#define VEC __m256
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define LANES 8
#endif
int lanes(void) { return LANES; }
double fma_flops(int64_t n, float* sink) {
    VEC acc[12], x = SET1(0.9999f), y = SET1(1e-5f);
    for (int j = 0; j < 12; j++) acc[j] = SET1(j * 1e-3f);
    double t = now();
    for (int64_t i = 0; i < n; i++) {
        #pragma GCC unroll 12
        for (int j = 0; j < 12; j++) acc[j] = FMA(acc[j], x, y);
    }
    double seconds = now() - t;
    float s[LANES]; VEC total = acc[0];
    for (int j = 1; j < 12; j++) total = FMA(total, x, acc[j]);
    __builtin_memcpy(s, &total, sizeof s);
    *sink = s[0];
    return n * 12.0 * LANES * 2 / seconds;
}
"""


def peak(threads: int) -> dict | None:
    """The clock and the FMA peak of one core and of ``threads`` at once, or None where the
    loop cannot be built here."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        lib = ctypes.CDLL(str(native.build("fma_peak", _PEAK_SOURCE, os.environ.get("CC", "cc"),
                                           ["-O2", "-march=native", "-shared", "-fPIC"], depends=native.cpu())))
    except (OSError, subprocess.SubprocessError) as e:  # no compiler, or one that cannot target FMA
        print(f"peak not measured: {e}")
        return None
    lib.clock_hz.restype = lib.fma_flops.restype = ctypes.c_double
    lib.clock_hz.argtypes = [ctypes.c_int64]
    lib.fma_flops.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_float)]
    steps = 100_000_000

    def fma() -> float:
        return lib.fma_flops(steps, ctypes.byref(ctypes.c_float()))

    one = fma()
    # (ctypes lets go of the GIL: the loops run on all cores at once)
    with ThreadPoolExecutor(threads) as pool:
        each = list(pool.map(lambda _: fma(), range(threads)))
    return {"clock_ghz": lib.clock_hz(1_000_000_000) / 1e9, "vector_lanes": lib.lanes(),
            "one_core_gflops": one / 1e9, "all_threads_gflops": sum(each) / 1e9}


def products(rows: int, repeats: int) -> list[dict]:
    """Each product by each engine: milliseconds and GFLOP/s, medians of ``repeats``."""
    gen = torch.Generator().manual_seed(0)
    x, g = torch.randn(rows, 256, generator=gen), torch.randn(rows, 256, generator=gen)
    x1, w = torch.randn(rows, 128, generator=gen), torch.randn(256, 256, generator=gen)
    w1, w_t = torch.randn(256, 128, generator=gen), w.t().contiguous()
    out, grad_w, grad_w1 = torch.empty(rows, 256), torch.empty(256, 256), torch.empty(256, 128)
    try:
        onednn = torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        onednn = None
    cases = [  # (product, FLOP, engine, call)
        ("forward [n,256] x [256,256]", 2 * rows * 256 * 256, "torch.mm", lambda: torch.mm(x, w.t(), out=out)),
        ("input gradient [n,256] x [256,256]", 2 * rows * 256 * 256, "torch.mm", lambda: torch.mm(g, w, out=out)),
        ("weights' gradient [256,n] x [n,256]", 2 * rows * 256 * 256, "torch.mm",
         lambda: torch.mm(g.t(), x, out=grad_w)),
        ("forward [n,128] x [128,256]", 2 * rows * 128 * 256, "torch.mm", lambda: torch.mm(x1, w1.t(), out=out)),
        ("weights' gradient [256,n] x [n,128]", 2 * rows * 256 * 128, "torch.mm",
         lambda: torch.mm(g.t(), x1, out=grad_w1)),
    ]
    if onednn is not None:
        cases += [
            ("forward [n,256] x [256,256]", 2 * rows * 256 * 256, "oneDNN", lambda: onednn(x, w, None, "none", [], "")),
            ("input gradient [n,256] x [256,256]", 2 * rows * 256 * 256, "oneDNN",
             lambda: onednn(g, w_t, None, "none", [], "")),
            ("forward [n,128] x [128,256]", 2 * rows * 128 * 256, "oneDNN", lambda: onednn(x1, w1, None, "none", [], "")),
        ]
    for _, _, _, call in cases:  # warm-up: first calls set up threads and primitives
        call()
    seconds: list[list[float]] = [[] for _ in cases]
    for _ in range(repeats):
        for i, (_, _, _, call) in enumerate(cases):
            start = time.perf_counter()
            call()
            seconds[i].append(time.perf_counter() - start)
    return [{"product": name, "engine": engine, "ms": statistics.median(s) * 1e3,
             "gflops": flop / statistics.median(s) / 1e9} for (name, flop, engine, _), s in zip(cases, seconds)]


def table(summary: dict) -> str:
    p = summary["peak"]
    head = [f"{summary['cpu']}, {summary['threads']} threads, {summary['rows']:,} rows"]
    if p:
        head.append(f"clock {p['clock_ghz']:.2f} GHz; FMA peak {p['one_core_gflops']:.0f} GFLOP/s on one core, "
                    f"{p['all_threads_gflops']:.0f} on {summary['threads']} threads ({p['vector_lanes']} lanes)")
    lines = [*head, "", "| product | engine | ms | GFLOP/s | of peak |", "| --- | --- | ---: | ---: | ---: |"]
    for r in summary["products"]:
        share = f"{r['gflops'] / p['all_threads_gflops']:.0%}" if p else "-"
        lines.append(f"| {r['product']} | {r['engine']} | {r['ms']:.1f} | {r['gflops']:.0f} | {share} |")
    return "\n".join(lines)


def _plot(summary: dict, path: Path) -> None:
    rows = summary["products"]
    with figure(path, size=(9, 0.45 * len(rows) + 1.5)) as (ax,):
        ax.barh([f"{r['product']} ({r['engine']})" for r in rows], [r["gflops"] for r in rows])
        if summary["peak"]:
            ax.axvline(summary["peak"]["all_threads_gflops"], color="k", linestyle="--", label="FMA peak")
            ax.legend(loc="lower right")
        ax.invert_yaxis()
        ax.set_xlabel("GFLOP/s (median)")
        ax.set_title(f"{summary['cpu']}, {summary['threads']} threads, {summary['rows']:,} rows")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--out", type=Path, default=results_dir() / "dense_rate", help="results path, without .json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    summary = {"cpu": _cpu_name(), "threads": a.threads, "rows": a.rows, "torch": torch.__version__,
               "allocator": active_allocator(), "peak": peak(a.threads), "products": products(a.rows, a.repeats)}
    print(table(summary))
    out = write_result(a.out.name.removesuffix(".json"), summary, a.out.parent)
    _plot(summary, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def _cpu_name() -> str:
    names = [line.split(":", 1)[1].strip() for line in native.cpu().splitlines() if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
