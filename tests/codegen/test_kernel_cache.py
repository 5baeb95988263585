"""The on-disk cache of generated kernels: what a file's name depends on, that files are
reused (also by a fresh process), never half-read, that a corrupt file is reported, and
what the rendered source looks like for each target."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from devices import DEVICE

from sarcompile.codegen import kernel_cache
from sarcompile.codegen.kernel_cache import (
    GENERATOR_VERSION,
    cache_dir,
    kernel_path,
    load,
)
from sarcompile.codegen.spmm_gen import EdgeDotSpec, MaxGradSpec, MaxSpec, SpmmSpec
from sarcompile.errors import KernelError

pytest.importorskip("triton")
pytestmark = pytest.mark.interpreter

SPECS = [
    SpmmSpec(37, 0, "float32"),
    SpmmSpec(37, 1, "float32"),
    SpmmSpec(36, 4, "float64", permuted=True),
    MaxSpec(37, "float32"),
    MaxGradSpec(37, "bfloat16"),
    EdgeDotSpec(36, 4, "float16"),
]


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache of this test's own, and no kernel module loaded in this process yet."""
    monkeypatch.setenv("SARCOMPILE_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setattr(kernel_cache, "_LOADED", {})
    return tmp_path / "kernels"


def no_writes(monkeypatch):
    """Make any attempt to write a kernel file fail loudly."""

    def refuse(*args, **kwargs):
        raise AssertionError("the kernel file was written again")

    monkeypatch.setattr(kernel_cache.tempfile, "mkstemp", refuse)


def test_cache_dir_is_the_sessions_temporary_folder(kernel_cache_dir):
    """The conftest keeps every test away from ~/.cache."""
    assert cache_dir() == kernel_cache_dir
    if not torch.cuda.is_available():
        assert kernel_cache.current_target() == "interpreter"
    # The kernels' tensors live where the target runs them: CUDA only for compiled kernels.
    assert DEVICE.type == ("cuda" if kernel_cache.current_target() == "cuda" and torch.cuda.is_available() else "cpu")


def test_load_writes_once_then_reuses_in_process(fresh, monkeypatch):
    spec = SpmmSpec(37, 1, "float32")
    module = load(spec, "interpreter")
    path = kernel_path(spec, "interpreter")
    assert path.parent == fresh and path.exists()
    assert module.__file__ == str(path)
    assert load(spec, "interpreter") is module  # the same module object, nothing re-read
    # Forget the module: the next load imports the file already there, without writing.
    monkeypatch.setattr(kernel_cache, "_LOADED", {})
    before = path.stat()
    no_writes(monkeypatch)
    again = load(spec, "interpreter")
    assert again is not module and again.__file__ == str(path)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)
    assert sorted(p.name for p in fresh.iterdir()) == [path.name]  # no temp file left


def test_fresh_process_reuses_the_file(fresh):
    spec = SpmmSpec(37, 0, "float32")
    load(spec, "interpreter")
    path = kernel_path(spec, "interpreter")
    before = path.stat()
    script = textwrap.dedent(
        f"""
        import tempfile
        from sarcompile.codegen import kernel_cache
        from sarcompile.codegen.spmm_gen import SpmmSpec

        def refuse(*a, **k):
            raise SystemExit("the kernel file was written again")

        kernel_cache.tempfile.mkstemp = refuse
        spec = {spec!r}
        print(kernel_cache.kernel_path(spec, "interpreter"))
        print(kernel_cache.load(spec, "interpreter").__file__)
        """
    )
    env = {**os.environ, "SARCOMPILE_KERNEL_CACHE": str(fresh), "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", script], check=False, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(path), str(path)]
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(p.name for p in fresh.iterdir()) == [path.name]


def test_kernel_path_depends_on_spec_target_and_triton(fresh, monkeypatch):
    base = SpmmSpec(64, 1, "float32")
    path = kernel_path(base, "interpreter")
    assert path == kernel_path(SpmmSpec(64, 1, "float32"), "interpreter")  # deterministic
    assert path.parent == fresh and path.suffix == ".py"
    others = [
        SpmmSpec(65, 1, "float32"),
        SpmmSpec(64, 0, "float32"),
        SpmmSpec(64, 2, "float32"),
        SpmmSpec(64, 1, "float64"),
        SpmmSpec(64, 1, "float32", permuted=True),
        MaxSpec(64, "float32"),
        MaxGradSpec(64, "float32"),
        EdgeDotSpec(64, 1, "float32"),
    ]
    paths = {kernel_path(s, "interpreter") for s in others}
    assert len(paths) == len(others) and path not in paths
    assert kernel_path(base, "cuda") != path
    # The default target follows TRITON_INTERPRET.
    with monkeypatch.context() as m:
        m.setenv("TRITON_INTERPRET", "1")
        assert kernel_path(base) == path
        m.setenv("TRITON_INTERPRET", "0")
        assert kernel_path(base) == kernel_path(base, "cuda")
    # Another Triton version: another file, so kernels of an older Triton are not reused.
    with monkeypatch.context() as m:
        m.setattr(kernel_cache, "triton_version", lambda: "0.0.0+other")
        assert kernel_path(base, "interpreter") != path
        assert kernel_path(base, "interpreter").parent == fresh
    # ... also when Triton's own version string changes.
    import triton

    with monkeypatch.context() as m:
        m.setattr(triton, "__version__", triton.__version__ + ".post-test")
        assert kernel_path(base, "interpreter") not in (path, kernel_path(base, "cuda"))
    # ... and with the generator version.
    with monkeypatch.context() as m:
        m.setattr(kernel_cache, "GENERATOR_VERSION", GENERATOR_VERSION + 1)
        assert kernel_path(base, "interpreter") != path
    assert kernel_path(base, "interpreter") == path  # all undone


def test_cuda_entries_are_keyed_on_the_architecture(fresh):
    """An A100's and an H100's kernels of one spec are two cache entries (two files, two
    modules), though the source is the same; the interpreter's entry has no architecture."""
    spec = SpmmSpec(64, 1, "float32")
    a100, h100 = kernel_path(spec, "cuda", "sm_80"), kernel_path(spec, "cuda", "sm_90")
    assert a100 != h100 and "_sm_80_" in a100.name and "_sm_90_" in h100.name
    assert load(spec, "cuda", "sm_80") is not load(spec, "cuda", "sm_90")
    assert sorted(p.name for p in fresh.iterdir()) == sorted([a100.name, h100.name])
    assert kernel_path(spec, "cuda") == kernel_path(spec, "cuda", kernel_cache.current_arch())
    assert kernel_path(spec, "interpreter", "sm_80") == kernel_path(spec, "interpreter", "sm_90")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_generated_file_is_python_with_header_and_literals(fresh, spec):
    module = load(spec, "interpreter")
    source = kernel_path(spec, "interpreter").read_text()
    tree = ast.parse(source)
    doc = ast.get_docstring(tree)
    assert f"generator v{GENERATOR_VERSION}" in doc and "'interpreter'" in doc
    assert repr(spec) in doc.replace("\n", " ") or repr(spec) in source
    assert "Do not edit" in doc
    # The width is a literal of the kernel, not an argument.
    assert f"f < {spec.width}" in source or f"* {spec.width}" in source
    kernel = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "kernel")
    assert "width" not in [a.arg for a in kernel.args.args]
    assert hasattr(module, "kernel") and module.CONFIGS


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_cuda_source_autotunes_interpreter_source_does_not(spec):
    cuda, interp = spec.render("cuda"), spec.render("interpreter")
    for source in (cuda, interp):
        ast.parse(source)
    metas = ast.literal_eval(next(
        n.value for n in ast.parse(cuda).body if isinstance(n, ast.Assign) and n.targets[0].id == "CONFIGS"
    ))
    kernel = next(n for n in ast.parse(cuda).body if isinstance(n, ast.FunctionDef) and n.name == "kernel")
    tune = next(d for d in kernel.decorator_list if isinstance(d, ast.Call) and ast.unparse(d.func) == "triton.autotune")
    tried = [
        (ast.literal_eval(c.args[0]), ast.literal_eval(c.keywords[0].value))
        for c in next(k.value for k in tune.keywords if k.arg == "configs").elts
    ]
    # Each (meta-parameters, warps) pair once; the CONFIGS list names their distinct
    # meta-parameters, in order (configs that differ in warps only are listed once).
    assert tried and len({repr(t) for t in tried}) == len(tried)
    distinct = []
    for meta, _ in tried:
        if meta not in distinct:
            distinct.append(meta)
    assert metas == distinct
    assert "key=['num_rows']" in cuda or "key=['num_edges']" in cuda
    # The max's gradient adds into its output: the autotuner must zero it between trials.
    assert ("reset_to_zero=['out']" in cuda) == isinstance(spec, MaxGradSpec)
    assert "autotune" not in interp and "reset_to_zero" not in interp and "triton.Config" not in interp
    # The interpreter launches with the first config, which is also one the autotuner tries.
    assert "CONFIGS = " + repr(metas) in interp
    # Every module-level name is used: no unused constants (the max once had NO_ROW).
    assert "NO_ROW" not in cuda and "NO_ROW" not in interp


def test_temp_files_are_never_loaded(fresh, monkeypatch):
    spec = SpmmSpec(37, 1, "float32")
    path = kernel_path(spec, "interpreter")
    fresh.mkdir(parents=True)
    # What another process crashing halfway through a write leaves behind.
    half = spec.render("interpreter")
    half = half[: len(half) // 2]
    stale = fresh / ".tmp-crashed.py"
    stale.write_text(half)
    module = load(spec, "interpreter")
    assert module.__file__ == str(path)
    assert path.read_text() == spec.render("interpreter")
    assert stale.read_text() == half  # left alone, never imported
    assert not any(".tmp-" in name for name in sys.modules)


def test_a_write_interrupted_before_the_rename_leaves_no_kernel(fresh, monkeypatch):
    spec = SpmmSpec(37, 1, "float32")
    path = kernel_path(spec, "interpreter")

    def crash(src, dst):
        raise OSError("simulated crash before the rename")

    with monkeypatch.context() as m:
        m.setattr(kernel_cache.os, "replace", crash)
        with pytest.raises(OSError, match="simulated"):
            load(spec, "interpreter")
    assert not path.exists()
    module = load(spec, "interpreter")  # the next load writes a whole file
    assert module.__file__ == str(path) and path.read_text() == spec.render("interpreter")


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"def kernel(:\n  garbage", id="syntax-error"),
        pytest.param(b"\xff\xfe\x00garbage\x00", id="binary"),
        pytest.param(b"raise RuntimeError('boom')\n", id="raises"),
        pytest.param(b"", id="empty"),
        pytest.param(None, id="truncated"),  # a valid-Python prefix of the real file
    ],
)
def test_corrupt_cache_file_is_a_clear_error(fresh, garbage):
    spec = SpmmSpec(37, 1, "float32")
    path = kernel_path(spec, "interpreter")
    fresh.mkdir(parents=True)
    if garbage is None:
        lines = spec.render("interpreter").splitlines(keepends=True)
        garbage = "".join(lines[:-1]).encode()  # the tl.store line lost: valid, and wrong
        ast.parse(garbage)
    path.write_bytes(garbage)
    with pytest.raises(KernelError) as info:
        load(spec, "interpreter")
    assert str(path) in str(info.value)
    assert "delete" in str(info.value).lower()
    assert path.read_bytes() == garbage  # reported, not silently replaced
    # Once deleted, the kernel is generated again.
    path.unlink()
    assert load(spec, "interpreter").__file__ == str(path)


def test_unknown_target_is_an_error(fresh):
    with pytest.raises(KernelError, match="unknown kernel target"):
        load(SpmmSpec(8, 0, "float32"), "rocm")
