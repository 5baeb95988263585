"""Every kind of generated kernel compiles for A100 (sm_80) and H100 (sm_90) without a GPU,
within the architecture's registers, spills and shared memory
(:mod:`sarcompile.codegen.gpu_compile`), for every configuration its autotuner may pick.

A representative set, not the full product of widths and dtypes (about 1 s a spec and
architecture): each op kind in each dtype it takes (fp32, bf16, fp16), the feature
widths the plan produces from a narrow last layer (7) through 64/128 to a wide 512, one
and several heads with a narrow and a wide head dim (256), weights absent / per edge /
per head, dropout and edge scores, every bit width of the quantize kernels, and int64
indices (a block past 2^31 rows or edges).

This folder's conftest sets ``TRITON_INTERPRET=1``, under which Triton cannot compile, so
the compiles run in one child process per architecture without it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from sarcompile.codegen.attention_gen import AttentionBackwardSpec as AttBwd, AttentionForwardSpec as AttFwd
from sarcompile.codegen.gpu_compile import ARCHS, compiler_available
from sarcompile.codegen.quantize_gen import PackSpec, UnpackSpec
from sarcompile.codegen.spmm_gen import EdgeDotSpec, MaxGradSpec, MaxSpec, SpmmSpec

pytestmark = pytest.mark.skipif(compiler_available() is not None, reason=f"no CUDA compiler here: {compiler_available()}")

F32, BF16, F16 = "float32", "bfloat16", "float16"

# (spec, index dtype)
CASES = [
    *[(s, "int32") for s in (
        SpmmSpec(64, 0, F32), SpmmSpec(64, 1, BF16, permuted=True), SpmmSpec(128, 8, F16), SpmmSpec(7, 0, F32),
        SpmmSpec(512, 0, BF16), SpmmSpec(7, 1, F16, permuted=True),
        MaxSpec(64, F32), MaxSpec(7, BF16), MaxSpec(512, F16),
        MaxGradSpec(64, BF16), MaxGradSpec(7, F32), MaxGradSpec(512, F16),
        EdgeDotSpec(64, 1, F16), EdgeDotSpec(512, 8, BF16), EdgeDotSpec(7, 1, F32),
        AttFwd(8, 8, True, F32, True), AttBwd(8, 8, True, F32, True),
        AttFwd(1, 256, False, BF16), AttBwd(1, 256, False, BF16),
        AttFwd(8, 64, True, F16), AttBwd(8, 64, True, F16),
        AttFwd(1, 7, False, F16, True), AttBwd(1, 7, False, BF16, True),
        PackSpec(1, 64, F32), PackSpec(2, 7, BF16, stochastic=True), PackSpec(4, 128, F16), PackSpec(8, 512, BF16),
        UnpackSpec(1, 64, F32), UnpackSpec(2, 7, BF16), UnpackSpec(4, 128, F16), UnpackSpec(8, 512, BF16),
    )],
    (SpmmSpec(64, 1, F32, permuted=True), "int64"),
    (EdgeDotSpec(64, 1, BF16), "int64"),
    (AttBwd(8, 8, True, BF16, True), "int64"),
]

_CHILD = """
import json, sys
from sarcompile.codegen.attention_gen import AttentionBackwardSpec, AttentionForwardSpec
from sarcompile.codegen.gpu_compile import compile_spec
from sarcompile.codegen.quantize_gen import PackSpec, UnpackSpec
from sarcompile.codegen.spmm_gen import EdgeDotSpec, MaxGradSpec, MaxSpec, SpmmSpec
arch, cases = sys.argv[1], json.loads(sys.stdin.read())
out = []
for spec, index in cases:
    try:
        out.append([[c.function, c.config, c.n_regs, c.n_spills, c.shared] for c in compile_spec(eval(spec), arch, index)])
    except Exception as e:
        out.append(f"{type(e).__name__}: {e}")
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled() -> dict[str, list]:
    """arch -> per case, its compiled kernels' (function, config, regs, spills, shared) or
    the error; the architectures compile in parallel child processes."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silences triton 3.9's warning; fusion is its default
    cases = json.dumps([[repr(s), index] for s, index in CASES])
    procs = {
        arch: subprocess.Popen([sys.executable, "-c", _CHILD, arch], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
        for arch in ARCHS
    }
    results = {}
    for arch, proc in procs.items():
        stdout, stderr = proc.communicate(cases, timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        results[arch] = json.loads(stdout)
    return results


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_every_kernel_compiles_within_limits(compiled, arch):
    """Every case compiles for every configuration, with registers, no spills and shared
    memory within ``arch``'s limits (compile_spec raises otherwise, naming the kernel)."""
    errors = [f"{s.name} ({index}): {r}" for (s, index), r in zip(CASES, compiled[arch]) if isinstance(r, str)]
    assert not errors, "\n".join(errors)
    limits = ARCHS[arch]
    for (spec, _), kernels in zip(CASES, compiled[arch]):
        functions = {k[0] for k in kernels}
        assert functions == ({"kernel_dst", "kernel_src"} if isinstance(spec, AttBwd) else {"kernel"}), spec
        for function, config, regs, spills, shared in kernels:
            assert 0 < regs <= limits.max_regs and spills <= limits.max_spills and shared <= limits.shared_bytes


def test_interpreter_process_refuses_with_a_clear_error():
    """This process runs kernels in Triton's interpreter, which cannot compile for a GPU."""
    from sarcompile.codegen.gpu_compile import compile_spec
    from sarcompile.errors import KernelError

    with pytest.raises(KernelError, match="TRITON_INTERPRET=1"):
        compile_spec(SpmmSpec(64, 0, F32), "sm_90")


def test_past_a_limit_is_refused_naming_the_kernel_and_what_it_needs():
    """A kernel over the registers, spills or shared memory held is an error naming it."""
    from sarcompile.codegen.gpu_compile import Compiled, _check_limits
    from sarcompile.errors import KernelError

    spec = AttBwd(8, 64, True, F16)
    over = Compiled(spec, "kernel_src", (("BLOCK_E", 16),), 8, "sm_80", n_regs=256, n_spills=3, shared=200 * 1024)
    with pytest.raises(KernelError, match=r"attention_bwd_heads8_channels64.*256 registers per thread.*3 spilled.*204800 bytes"):
        _check_limits(over, ARCHS["sm_80"], spec.name)
    roomier = dataclasses.replace(ARCHS["sm_80"], max_regs=256, regs_per_block=1 << 20, max_spills=3, shared_bytes=256 * 1024)
    _check_limits(over, roomier, spec.name)  # within every bound: no error


# A papers100M-scale shard at small N: 3e9 edges into 1e8 rows (a shape class, not allocated).
HUGE = dict(rows=10**8, src=10**8, edges=3 * 10**9)


def test_index_width_follows_row_and_edge_numbers():
    """int64 exactly where a block's row or edge numbers reach 2^31; the width of its
    rows does not enter (offsets into rows are int64 in every kernel)."""
    from sarcompile.codegen.gpu_compile import BlockShape

    assert BlockShape(**HUGE, width=64).index == "int64"
    assert BlockShape(rows=10, src=10, edges=2**31 - 1, width=64).index == "int32"
    assert BlockShape(rows=10, src=10, edges=2**31, width=64).index == "int64"
    assert BlockShape(rows=10, src=2**31, edges=10, width=64).index == "int64"
    assert BlockShape(rows=2**26, src=2**26, edges=10, width=512).index == "int32"  # rows x width 2^35


def test_int32_indices_past_2_31_are_refused_naming_the_op_and_shape():
    """A kernel forced to int32 indices on a block of 3e9 edges is an error naming it and
    the shape; int64 indices, the width the block gets, pass."""
    from sarcompile.codegen.gpu_compile import BlockShape, check_index
    from sarcompile.errors import KernelError

    shape = BlockShape(**HUGE, width=64)
    for spec, _ in CASES:
        if not isinstance(spec, (PackSpec, UnpackSpec)):
            with pytest.raises(KernelError, match=rf"kernel {spec.name} on a block of 100000000 rows x 64 wide .*"
                                                   r"3000000000 edges: int32 indices cannot hold"):
                check_index(spec, "int32", shape)
        check_index(spec, shape.index, shape)


def test_offsets_past_2_31_are_int64_in_every_kernel():
    """Where rows x width reaches 2^31 on int32 indices, every kernel widens its row ids and
    the indices it loads before forming offsets; one that does not is refused naming it,
    the shape and the line."""
    from sarcompile.codegen.gpu_compile import BlockShape, check_index
    from sarcompile.errors import KernelError

    wide = BlockShape(rows=2**26, src=2**26, edges=2**30, width=512)
    for spec, _ in CASES:
        check_index(spec, "int32", wide)

    @dataclasses.dataclass(frozen=True)
    class Narrow(SpmmSpec):
        def render(self, target: str) -> str:
            return super().render(target).replace("tl.program_id(0).to(tl.int64)", "tl.program_id(0)")

    with pytest.raises(KernelError, match=r"spmm_sum_width512.* on a block of 67108864 rows x 512 wide.*"
                                          r"offsets in int32 in: v = tl.program_id\(0\)"):
        check_index(Narrow(512, 0, F32), "int32", wide)


def test_without_triton_or_ptxas_the_error_says_what_to_install(monkeypatch):
    """Where the compiler is missing, resources_tables (``plan --show-kernels --gpu``)
    says what to install, before doing anything else."""
    from sarcompile.codegen import gpu_compile
    from sarcompile.errors import KernelError

    monkeypatch.setattr(gpu_compile, "compiler_available", lambda: "triton is not installed (pip install 'sarcompile[triton]')")
    with pytest.raises(KernelError, match=r"cannot compile kernels for sm_90: triton is not installed \(pip install"):
        gpu_compile.resources_tables([SpmmSpec(64, 0, F32)], "sm_90")
