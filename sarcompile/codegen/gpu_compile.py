"""Compile generated kernels for a real GPU architecture, without a GPU, and check their
resources against the architecture's limits.

Triton compiles to PTX and, through the ``ptxas`` its wheel ships, to a cubin on any
machine. :func:`compile_spec` does so for every kernel function of a spec's module and
every configuration its autotuner may pick (any of them may be chosen on the first
launch), then reads what the cubin needs:

* registers per thread and local memory, from ``cuobjdump -res-usage`` on the cubin
  (shipped beside ``ptxas``). Spills are ``LOCAL / 4``, as Triton's launcher counts them
  (``CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES / 4``);
* shared memory, from the compiled kernel's metadata (Triton allocates it dynamically).

Limits held (:data:`ARCHS`): 255 registers per thread and 64K registers per block (the
register file of one SM), **no spills** (the kernels are small streaming loops; a spill
means a block size that should not be offered), and shared memory per block of 163 KiB
on sm_80 and 227 KiB on sm_90 (the opt-in maximum per block; the SM has 164 / 228 KiB,
1 KiB of which is reserved per block).

Index width (:func:`check_index`): a block's index arrays are int32 unless its row or
edge numbers reach 2^31 (:func:`sarcompile.graph.graph.index_dtype`); offsets into feature
rows, row x width, are formed in int64 by every kernel whatever the index width (they widen
the program id and every index they load before multiplying). A shape class -- a
:class:`BlockShape`, nothing allocated -- checked against an index width is refused, naming
the kernel and the shape, where either does not hold.

A process with ``TRITON_INTERPRET=1`` cannot compile: the interpreter replaces Triton's
code generator in it. The tests (which run kernels in the interpreter) compile in a
child process without it, as :func:`resources_tables` does.
"""

from __future__ import annotations

import functools
import os
import pickle
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from sarcompile.errors import KernelError
from sarcompile.graph.graph import INDEX_LIMIT, index_dtype
from sarcompile.codegen.kernel_cache import KernelSpec, current_target, load

__all__ = ["ARCHS", "Arch", "BlockShape", "Compiled", "check_index", "compile_spec", "compiler_available",
           "resources_table", "resources_tables"]


@dataclass(frozen=True)
class Arch:
    """A CUDA architecture and the per-kernel limits held against it."""

    name: str  # "sm_90"
    capability: int  # 90
    shared_bytes: int  # shared memory one block may use
    max_regs: int = 255  # per thread
    regs_per_block: int = 65536
    max_spills: int = 0  # 4-byte words of local memory per thread


ARCHS = {
    "sm_80": Arch("sm_80", 80, 163 * 1024),  # A100
    "sm_90": Arch("sm_90", 90, 227 * 1024),  # H100
}


@dataclass(frozen=True)
class Compiled:
    """One kernel function of a spec, compiled for one architecture with one autotuner
    configuration, and what it needs."""

    spec: KernelSpec
    function: str  # "kernel", "kernel_dst", ...
    meta: tuple[tuple[str, int], ...]  # the configuration's constexprs, e.g. (("BLOCK_E", 16), ...)
    num_warps: int
    arch: str
    n_regs: int
    n_spills: int
    shared: int  # bytes

    @property
    def config(self) -> str:
        return ", ".join([f"{k}={v}" for k, v in self.meta] + [f"warps={self.num_warps}"])


@dataclass(frozen=True)
class BlockShape:
    """The sizes of the block (or, for the quantize kernels, the rows) a kernel runs on: a
    shape class, checked without allocating it."""

    rows: int  # destination rows (rows packed, for quantize)
    src: int  # source rows
    edges: int
    width: int  # values per row

    @property
    def index(self) -> str:
        """The index width the block gets (:func:`sarcompile.graph.graph.index_dtype`)."""
        return "int64" if index_dtype(self.rows, self.src, self.edges) == torch.int64 else "int32"

    def __str__(self) -> str:
        return f"{self.rows} rows x {self.width} wide from {self.src} source rows over {self.edges} edges"


# A line of generated source that forms a row's offset from a 32-bit number: the program id
# of the row axis, or an index loaded, not widened to int64 before use.
_ROW_ID = re.compile(r"tl\.program_id\(0\)(?!\.to\(tl\.int64\))")
_INDEX_LOAD = re.compile(r"tl\.load\((?:indptr|col|perm|row|t_indptr|t_row|t_perm)\b")


def _narrow_offsets(source: str) -> list[str]:
    """The lines of ``source`` that would form row x width offsets in int32."""
    code = [line.split("#")[0].strip() for line in source.splitlines()]
    return [line for line in code if _ROW_ID.search(line) or (_INDEX_LOAD.search(line) and not line.endswith(".to(tl.int64)"))]


def check_index(spec: KernelSpec, index: str, shape: BlockShape) -> None:
    """Raise :class:`~sarcompile.errors.KernelError`, naming the kernel and ``shape``,
    where ``spec``'s kernel with ``index`` (``"int32"`` or ``"int64"``) indices would
    overflow on a block of ``shape``: int32 indices for row or edge numbers that reach
    2^31, or an offset formed in int32 where rows x width reaches it."""
    where = f"kernel {spec.name} on a block of {shape}"
    if index == "int32" and shape.index == "int64":
        raise KernelError(
            f"{where}: int32 indices cannot hold its row and edge numbers (at most 2^31 - 1); such a block "
            "takes int64 indices"
        )
    if max(shape.rows, shape.src) * shape.width >= INDEX_LIMIT:
        narrow = _narrow_offsets(spec.render("cuda"))
        if narrow:
            raise KernelError(
                f"{where}: rows x width reaches 2^31, but the kernel forms offsets in int32 in: "
                f"{'; '.join(narrow)}. Report it: they must be widened with .to(tl.int64)"
            )


def _nvidia_bin() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def compiler_available() -> str | None:
    """None when kernels can be compiled here for CUDA targets, else why not."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed (pip install 'sarcompile[triton]')"
    missing = [tool for tool in ("ptxas", "cuobjdump") if not (_nvidia_bin() / tool).exists()]
    if missing:
        return f"this triton wheel ships no {' or '.join(missing)} in {_nvidia_bin()}"
    return None


# Pointer arguments, by parameter name, whose type is not the spec's dtype. The generated
# kernels name their parameters consistently across families; an unknown scalar name is an
# error (below), so a new kernel cannot be compiled with a guessed signature.
_INDEX_POINTERS = {"indptr", "col", "perm", "row", "t_indptr", "t_row", "t_perm"}  # a Block's index dtype
_INT64_POINTERS = {"pos", "row_out"}  # winner rows: torch.long
_FP32_POINTERS = {"lo", "scale", "noise"}  # quantize row parameters (torch_kernels.pack_prepare)
_FAMILY_POINTERS = {  # (family, name) -> type
    ("spmm_max_grad", "out"): "acc",  # accumulated in fp32 (fp64 for float64)
    ("pack", "out"): "u8",
    ("unpack", "data"): "u8",
}
_COUNTS = {"num_rows", "num_edges", "num_src", "offset"}  # row / edge counts: the index width
_FLOAT_SCALARS = {"negative_slope"}  # the accumulator's type (attention_gen._slope_type)
_TYPES = {"float32": "fp32", "float64": "fp64", "float16": "fp16", "bfloat16": "bf16"}


def _signature(spec: KernelSpec, arg_names: list[str], constexprs: set[str], index: str) -> dict[str, str]:
    """Triton's signature for ``spec``'s kernel as the runtime launches it, with ``index``
    (``"int32"`` or ``"int64"``) the block's index dtype."""
    dtype = getattr(spec, "dtype")
    data, acc = _TYPES[dtype], "fp64" if dtype == "float64" else "fp32"
    idx = {"int32": "i32", "int64": "i64"}[index]
    sig = {}
    for name in arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in _COUNTS:
            sig[name] = idx
        elif name in _FLOAT_SCALARS:
            sig[name] = acc
        elif name in _INDEX_POINTERS:
            sig[name] = "*" + idx
        elif name in _INT64_POINTERS:
            sig[name] = "*i64"
        elif name in _FP32_POINTERS:
            sig[name] = "*fp32"
        else:
            kind = _FAMILY_POINTERS.get((spec.family, name), "data")
            sig[name] = "*" + {"data": data, "acc": acc}.get(kind, kind)
    return sig


def _functions(module) -> dict[str, object]:
    """The module's kernel functions (``kernel``, ``kernel_dst``, ...), each Triton's
    autotuner over its configurations."""
    return {name: fn for name, fn in vars(module).items() if name.startswith("kernel") and hasattr(fn, "configs")}


@functools.lru_cache(maxsize=None)
def compile_spec(
    spec: KernelSpec, arch: str = "sm_90", index: str | None = None, shape: BlockShape | None = None
) -> tuple[Compiled, ...]:
    """Every kernel function of ``spec`` compiled for ``arch`` with every configuration its
    autotuner may pick, its resources read and checked (cached per process). ``index``:
    the width of the block's indices, by default what a block of ``shape`` gets (int32
    without one); with a ``shape``, :func:`check_index` holds first.

    Raises :class:`~sarcompile.errors.KernelError` naming the kernel (its op and shape)
    and the configuration when one does not compile, or needs more registers, spills or
    shared memory than :data:`ARCHS` allows.
    """
    index = index or (shape.index if shape else "int32")
    if shape is not None:
        check_index(spec, index, shape)
    why = compiler_available()
    if why:
        raise KernelError(f"cannot compile kernels for {arch}: {why}")
    if current_target() == "interpreter":
        raise KernelError(
            "cannot compile kernels for a GPU in a process with TRITON_INTERPRET=1 (the interpreter replaces "
            "Triton's code generator): unset it, or compile in a child process without it"
        )
    if arch not in ARCHS:
        raise KernelError(f"unknown GPU architecture {arch!r}; known: {sorted(ARCHS)}")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    target = ARCHS[arch]
    out = []
    for function, tuner in _functions(load(spec, "cuda", arch)).items():
        fn = tuner.fn
        for config in tuner.configs:
            meta = dict(config.kwargs)
            sig = _signature(spec, fn.arg_names, set(meta), index)
            where = f"{spec.name} ({function}; {', '.join(f'{k}={v}' for k, v in meta.items())}, warps={config.num_warps}, {index} indices) for {arch}"
            try:
                kernel = compile(
                    ASTSource(fn, sig, meta),
                    target=GPUTarget("cuda", target.capability, 32),
                    options={"num_warps": config.num_warps, "num_stages": config.num_stages},
                )
            except Exception as e:
                raise KernelError(f"kernel {where} does not compile: {type(e).__name__}: {e}") from e
            regs, local = _resource_usage(kernel.asm["cubin"])
            compiled = Compiled(spec, function, tuple(meta.items()), config.num_warps, arch, regs, local // 4, kernel.metadata.shared)
            _check_limits(compiled, target, where)
            out.append(compiled)
    return tuple(out)


def _resource_usage(cubin: bytes) -> tuple[int, int]:
    """Registers per thread and local memory bytes per thread of the cubin's one kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [str(_nvidia_bin() / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    found = re.search(r"REG:(\d+) .*LOCAL:(\d+)", text)
    if found is None:
        raise KernelError(f"cuobjdump -res-usage gave no resource line: {text!r}")
    return int(found.group(1)), int(found.group(2))


def _check_limits(c: Compiled, arch: Arch, where: str) -> None:
    problems = []
    if c.n_regs > arch.max_regs:
        problems.append(f"{c.n_regs} registers per thread (at most {arch.max_regs})")
    if c.n_regs * c.num_warps * 32 > arch.regs_per_block:
        problems.append(f"{c.n_regs * c.num_warps * 32} registers per block (at most {arch.regs_per_block})")
    if c.n_spills > arch.max_spills:
        problems.append(f"{c.n_spills} spilled registers (at most {arch.max_spills})")
    if c.shared > arch.shared_bytes:
        problems.append(f"{c.shared} bytes of shared memory (at most {arch.shared_bytes})")
    if problems:
        raise KernelError(
            f"kernel {where} needs {', '.join(problems)}: it would fail or run slowly there. "
            "Report it: its block sizes need lowering"
        )


def resources_table(spec: KernelSpec, arch: str, index: str = "int32") -> str:
    """One line per kernel function and configuration: registers, spills, shared memory."""
    return "\n".join(
        f"  {c.function:<11} {c.config:<36} regs {c.n_regs:>3}  spills {c.n_spills}  shared {c.shared} B"
        for c in compile_spec(spec, arch, index)
    )


_CHILD = """
import pickle, sys
from sarcompile.codegen.gpu_compile import resources_tables
from sarcompile.errors import KernelError
specs, arch, index = pickle.load(sys.stdin.buffer)
try:
    out = resources_tables(specs, arch, index)
except KernelError as e:
    out = e
sys.stdout.buffer.write(pickle.dumps(out))
"""


def resources_tables(specs: list[KernelSpec], arch: str, index: str = "int32", timeout: float = 600) -> list[str]:
    """:func:`resources_table` of each spec. In a process with ``TRITON_INTERPRET=1``,
    which cannot compile, the compiles run in a child process without it (at most
    ``timeout`` seconds). Raises :class:`~sarcompile.errors.KernelError` as
    :func:`compile_spec` does, and where triton or its ptxas is missing."""
    why = compiler_available()
    if why:
        raise KernelError(f"cannot compile kernels for {arch}: {why}")
    if current_target() != "interpreter":
        return [resources_table(spec, arch, index) for spec in specs]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silences triton 3.9's warning; fusion is its default
    try:
        child = subprocess.run([sys.executable, "-c", _CHILD], input=pickle.dumps((specs, arch, index)),
                               capture_output=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise KernelError(f"compiling {len(specs)} kernels for {arch} took over {timeout:g} s") from e
    if child.returncode != 0:
        raise KernelError(f"compiling kernels for {arch} in a child process failed: {child.stderr.decode()[-2000:]}")
    out = pickle.loads(child.stdout)
    if isinstance(out, KernelError):
        raise out
    return out
