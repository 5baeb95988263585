import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sarcompile.dist import memory
from sarcompile.dist.memory import MemoryProbe


def test_probe_sees_a_large_temporary_and_resets_between_uses():
    probe = MemoryProbe(device="cpu")
    with probe:
        big = torch.ones(16 << 20)  # 64 MiB, touched
        del big
    assert probe.added_bytes >= 60 << 20
    with probe:  # the peak was reset: a small step shows a small peak
        torch.ones(1 << 10)
    assert probe.added_bytes < 32 << 20


@pytest.fixture
def no_system_libs(monkeypatch):
    """find_allocator sees only what a test puts in CONDA_PREFIX."""
    monkeypatch.setattr(memory, "_SYSTEM_LIB_DIRS", ())
    monkeypatch.setattr(memory.ctypes.util, "find_library", lambda name: None)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)


def test_find_allocator_takes_the_environments_library_first(tmp_path, monkeypatch, no_system_libs):
    assert memory.find_allocator("tcmalloc") is None
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libtcmalloc_minimal_debug.so.4").touch()  # not the allocator itself
    assert memory.find_allocator("tcmalloc") is None
    (lib / "libtcmalloc.so.4").touch()
    (lib / "libjemalloc.so.2").touch()
    monkeypatch.setenv("CONDA_PREFIX", str(tmp_path))
    assert memory.find_allocator("tcmalloc") == str(lib / "libtcmalloc.so.4")
    (lib / "libtcmalloc_minimal.so.4").touch()  # preferred: no profiler
    assert memory.find_allocator("tcmalloc") == str(lib / "libtcmalloc_minimal.so.4")
    assert memory.find_allocator("jemalloc") == str(lib / "libjemalloc.so.2")
    with pytest.raises(ValueError, match="unknown allocator 'hoard'"):
        memory.find_allocator("hoard")


def test_this_process_runs_on_glibc():
    if "LD_PRELOAD" in os.environ:
        pytest.skip("the tests run with an LD_PRELOAD")
    assert memory.active_allocator() == "glibc"
    assert set(memory.malloc_stats()) in ({"malloc_in_use", "malloc_free_held"}, set())


@pytest.mark.parametrize("name", sorted(memory.ALLOCATORS))
def test_a_preloaded_allocator_is_seen_and_glibc_left_alone(name):
    path = memory.find_allocator(name)
    if path is None:
        pytest.skip(f"{name} is not installed here")
    code = ("from sarcompile.dist import memory; import torch; torch.ones(1 << 20).sum(); "
            "print(memory.active_allocator(), memory.malloc_stats(), memory.tune_allocator())")
    env = {**os.environ, "LD_PRELOAD": path, "SARCOMPILE_MALLOC": "auto"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # glibc's statistics would describe an unused heap, and its mallopt would tune nothing.
    assert done.stdout.split() == [name, "{}", "False"]


# A fresh process per case: glibc's thresholds, once set, stay set for the process. It
# frees a 24 MiB tensor first (which raises glibc's own dynamic threshold to 24 MiB),
# then reports how much of a live 4 MiB tensor glibc gave its own mapping (mallinfo2's
# hblkhd), and what tune_allocator returned.
_MAPPED = """
import ctypes, torch
from sarcompile.dist import memory
tuned = memory.tune_allocator()
big = torch.ones(6 << 20); del big
x = torch.ones(1 << 20)
libc = memory._libc(); libc.mallinfo2.restype = memory._Mallinfo2
print(tuned, memory.allocator_tuned(), libc.mallinfo2().hblkhd >= 4 << 20)
"""


def _mapped(**env: str) -> list[str]:
    if "LD_PRELOAD" in os.environ or memory._libc() is None or not hasattr(memory._libc(), "mallinfo2"):
        pytest.skip("needs glibc >= 2.33 and no preloaded allocator")
    full = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "SARCOMPILE_MALLOC"}
    done = subprocess.run([sys.executable, "-c", _MAPPED], env={**full, **env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize(("env", "expected"), [
    ({}, ["True", "True", "True"]),  # auto: its own mapping, returned to the OS on free
    ({"WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1"}, ["True", "True", "True"]),  # under torchrun alike
    ({"SARCOMPILE_MALLOC": "off"}, ["False", "False", "False"]),  # glibc's own: the 4 MiB block sits on the heap
    ({"SARCOMPILE_MALLOC": "lean"}, ["True", "True", "True"]),  # the former name of auto on one process
    ({"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)},
     ["False", "False", "False"]),  # the user's own thresholds are kept
])
def test_tune_allocator_fixes_glibcs_threshold_by_default(env, expected):
    assert _mapped(**env) == expected


def test_tune_allocator_names_bad_and_deprecated_settings(monkeypatch):
    monkeypatch.setenv("SARCOMPILE_MALLOC", "small")
    with pytest.raises(ValueError, match="SARCOMPILE_MALLOC='small' is not one of auto, off"):
        memory.tune_allocator()
    monkeypatch.setenv("SARCOMPILE_MALLOC", "default")
    with pytest.warns(DeprecationWarning, match="SARCOMPILE_MALLOC=off"):
        assert memory.tune_allocator() is False  # "off": nothing changed
    monkeypatch.setenv("SARCOMPILE_MALLOC", "lean")
    with pytest.warns(DeprecationWarning, match="SARCOMPILE_MALLOC=auto"):
        memory._tunes()


# A fresh process per case: torch reads its huge-page switch at its first allocation.
_HUGE = """
import os, re, sarcompile, torch
from sarcompile.dist import memory
assert "THP_MEM_ALLOC_ENABLE" not in os.environ or os.environ.get("USER_SET") == "1", "import alone set it"
try:
    memory.apply_policy()  # what sc.init() runs first
except ValueError:
    pass  # a bad SARCOMPILE_MALLOC: sc.init() names it (tested above)
x = torch.ones(4 << 20)  # 16 MiB, touched
start, end = x.data_ptr(), x.data_ptr() + x.numel() * x.element_size()
huge, inside = 0, False
for line in open("/proc/self/smaps"):
    head = line.split()
    if "-" in head[0] and len(head) >= 5:
        lo, hi = (int(v, 16) for v in head[0].split("-"))
        inside = lo < end and start < hi
    elif inside and head[0] == "AnonHugePages:":
        huge += int(head[1]) << 10
print(os.environ.get("THP_MEM_ALLOC_ENABLE"), memory.huge_pages_requested(), huge > 0)
"""


def _huge(**env: str) -> list[str]:
    full = {k: v for k, v in os.environ.items()
            if k not in ("SARCOMPILE_MALLOC", "WORLD_SIZE", "MASTER_ADDR", memory.HUGE_PAGES_ENV, "LD_PRELOAD")}
    if "WORLD_SIZE" in env:
        env = {"MASTER_ADDR": "127.0.0.1", **env}  # as torchrun sets them
    done = subprocess.run([sys.executable, "-c", _HUGE], env={**full, **env}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize(("env", "expected"), [
    ({"WORLD_SIZE": "4"}, ["1", "True"]),  # auto: huge pages for tensors of 2 MiB or more
    ({"WORLD_SIZE": "1"}, ["1", "True"]),
    ({}, ["1", "True"]),  # no torchrun: sc.init() starts a one-worker group, and tunes it alike
    ({"WORLD_SIZE": "4", "SARCOMPILE_MALLOC": "off"}, ["None", "False"]),
    ({"SARCOMPILE_MALLOC": "lean"}, ["1", "True"]),
    ({"WORLD_SIZE": "4", "THP_MEM_ALLOC_ENABLE": "0", "USER_SET": "1"}, ["0", "False"]),  # the user's value is kept
    ({"WORLD_SIZE": "4", "SARCOMPILE_MALLOC": "small"}, ["None", "False"]),  # a bad value: sc.init() names it
])
def test_the_policy_asks_torch_for_huge_pages_where_glibcs_thresholds_are_fixed(env, expected):
    if "LD_PRELOAD" in os.environ or memory._libc() is None:
        pytest.skip("needs glibc and no preloaded allocator")
    got = _huge(**env)
    assert got[:2] == expected
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if expected[0] == "1" and thp.exists() and "[never]" not in thp.read_text():
        assert got[2] == "True", "the kernel allows huge pages, yet the tensor has none"
    if expected[0] != "1" and thp.exists() and "[always]" not in thp.read_text():
        assert got[2] == "False"
