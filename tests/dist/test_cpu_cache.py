"""The caching allocator for torch's large CPU tensors (sarcompile.dist.cpu_cache):
tensors never share memory and keep their values through any sequence of allocations and
frees, on several threads and across a fork; a freed block serves the next request of its
size; the bytes held never exceed the most ever in use at once (exact figures in a fresh
process); ``sc.empty_cache()`` releases the idle blocks; torch's raw interface (oneDNN) and storage resizes go through it; ``sc.init()``
installs it under ``SARCOMPILE_MALLOC=auto`` only; a failed build warns once and leaves
torch's allocator."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sarcompile as sc
from sarcompile.dist import cpu_cache
from sarcompile.dist.memory import MMAP_THRESHOLD

pytestmark = pytest.mark.skipif(not cpu_cache.enabled(), reason="no C++ compiler: the cache is not used here")

MiB = 1 << 20
KiB = 1 << 10


@pytest.fixture(scope="module", autouse=True)
def installed():
    assert cpu_cache.install(MMAP_THRESHOLD)  # in this test process, for the rest of its tests too: a stress test of its own


def _check_bound() -> None:
    s = cpu_cache.stats()
    assert s.lent_bytes + s.idle_bytes <= s.high_bytes


# A program: allocate a tensor of some KiB (under and over the threshold, some sizes a little
# apart so that a block serves a request a little smaller), or free the k-th one still alive.
programs = st.lists(
    st.one_of(st.tuples(st.just("new"), st.sampled_from([64, 1000, 1280, 1300, 2048, 2100, 4096, 9000])),
              st.tuples(st.just("free"), st.integers(0, 20))),
    min_size=1,
    max_size=40,
)


def _run(program, tag: int = 0) -> None:
    alive: list[tuple[torch.Tensor, float]] = []
    for i, op in enumerate(program):
        if op[0] == "new":
            value = float(tag * 1000 + i)
            alive.append((torch.full((op[1] * KiB // 4,), value), value))  # each holds its own number ...
        elif alive:
            del alive[op[1] % len(alive)]
        for t, value in alive:  # ... which nothing made later overwrote: no two alive tensors overlap
            assert t.eq(value).all()


@given(programs)
@settings(max_examples=60, deadline=None)
def test_tensors_keep_their_values_and_the_bound_holds(program):
    _run(program)
    _run(program)  # again: now from the blocks the first run freed
    _check_bound()


def test_threads_keep_their_values():
    program = [("new", 2048), ("new", 4096), ("free", 0), ("new", 2048), ("new", 1300), ("free", 1)] * 20
    errors = []

    def work(tag):
        try:
            _run(program, tag)
        except AssertionError as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    _check_bound()


def test_a_freed_block_serves_the_next_request_of_its_size():
    sizes = [3 * MiB, 5 * MiB, 7 * MiB]
    tensors = [torch.empty(n // 4) for n in sizes]
    pointers = {t.data_ptr() for t in tensors}
    before = cpu_cache.stats()
    del tensors
    again = [torch.empty(n // 4) for n in sizes]
    after = cpu_cache.stats()
    assert {t.data_ptr() for t in again} == pointers
    assert (after.hits - before.hits, after.misses - before.misses) == (3, 0)


def test_empty_cache_releases_the_idle_blocks():
    t = torch.empty(4 * MiB // 4)
    del t
    idle = cpu_cache.stats().idle_bytes
    assert idle >= 4 * MiB
    assert sc.empty_cache() == idle
    assert cpu_cache.stats().idle_bytes == 0 and sc.empty_cache() == 0


# In a fresh process, where nothing else is in use: the figures exactly.
_BOUND = """
import torch
from sarcompile.dist import cpu_cache, memory
assert cpu_cache.install(memory.MMAP_THRESHOLD)
MiB = 1 << 20
def stats():
    s = cpu_cache.stats()
    return s.lent_bytes // MiB, s.idle_bytes // MiB, s.high_bytes // MiB, s.hits, s.misses
a = torch.empty(8 * MiB // 4); del a
assert stats() == (0, 8, 8, 0, 1), stats()
b = torch.empty(2 * MiB // 4)  # new: 8 idle + 2 would exceed the 8 ever in use, so the 8 goes
assert stats() == (2, 0, 8, 0, 2), stats()
c = torch.empty(6 * MiB // 4); del b, c  # 8 in use: both kept
assert stats() == (0, 8, 8, 0, 3), stats()
d = torch.empty(5900 * 1024 // 4)  # the 6 MiB block, less than a sixteenth over
assert stats() == (6, 2, 8, 1, 3), stats()
e = torch.empty(1 * MiB // 4)  # under the threshold (1.25 MiB): torch's own
assert stats() == (6, 2, 8, 1, 3), stats()
f = torch.empty(3 * MiB // 4)  # 6 + 3 > 8: the 2 goes, the most in use becomes 9
assert stats() == (9, 0, 9, 1, 4), stats()
del d, f
cpu_cache.release()
assert stats() == (0, 0, 9, 1, 4), stats()
print("ok")
"""


def test_held_bytes_never_exceed_the_most_in_use_at_once():
    done = subprocess.run([sys.executable, "-c", _BOUND], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_raw_interface_and_resize_go_through_it():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 96, 96)
    w = torch.randn(16, 8, 3, 3)
    # oneDNN (mkldnn) takes its scratch memory through torch's raw allocate/deallocate
    got = torch.nn.functional.conv2d(x, w, padding=1)
    want = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    if torch.backends.mkldnn.is_available():
        mk = torch.nn.functional.conv2d(x.to_mkldnn(), w, padding=1).to_dense()
        torch.testing.assert_close(mk.double(), want, rtol=1e-4, atol=1e-4)
    t = torch.arange(1000, dtype=torch.float32)
    t.resize_(2 * MiB)  # grows past the threshold: a cached block, with the old values copied
    assert torch.equal(t[:1000], torch.arange(1000, dtype=torch.float32))
    _check_bound()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_allocates_and_frees():
    big = torch.full((4 * MiB // 4,), 7.0)
    pid = os.fork()
    if pid == 0:  # the child: uses the copied cache, then exits without running pytest's teardown
        ok = False
        try:
            torch.set_num_threads(1)  # torch's OpenMP threads do not survive a fork (nor do DataLoader workers use them)
            _run([("new", 4096), ("new", 2048), ("free", 0), ("new", 4096)] * 5)
            ok = bool(big.eq(7.0).all())
        finally:
            os._exit(0 if ok else 1)
    deadline_ok = False
    for _ in range(600):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            deadline_ok = True
            break
        threading.Event().wait(0.1)
    if not deadline_ok:
        os.kill(pid, 9)
    assert deadline_ok and os.waitstatus_to_exitcode(status) == 0


_INIT = "import sarcompile as sc; from sarcompile.dist import cpu_cache; sc.init(); print(cpu_cache.installed())"


@pytest.mark.parametrize("mode, want", [("auto", "True"), ("off", "False")])
def test_init_installs_it_under_auto_only(mode, want):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "WORLD_SIZE", "MASTER_ADDR")}
    done = subprocess.run([sys.executable, "-c", _INIT], env={**env, "SARCOMPILE_MALLOC": mode},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == want, done.stderr[-2000:]


def test_a_failed_build_warns_once_and_the_switch_turns_it_off(monkeypatch, tmp_path):
    monkeypatch.setenv("SARCOMPILE_KERNEL_CACHE", str(tmp_path))
    path = cpu_cache._build()
    assert path.parent == tmp_path and path.name.startswith("cpu_cache-")
    assert cpu_cache._build() == path and [p.name for p in tmp_path.iterdir()] == [path.name]  # reused, no temporary
    monkeypatch.setattr(cpu_cache._library, "_lib", None)
    monkeypatch.setattr(cpu_cache._library, "_failed", False)
    monkeypatch.setenv("CXX", "false")
    with pytest.warns(RuntimeWarning, match="could not be built.*SARCOMPILE_CPU_CACHE=0"):
        assert not cpu_cache.install(MMAP_THRESHOLD)
    assert not cpu_cache.install(MMAP_THRESHOLD) and cpu_cache.stats() is None  # and says nothing more
    monkeypatch.setenv("SARCOMPILE_CPU_CACHE", "0")
    assert not cpu_cache.enabled() and not cpu_cache.install(MMAP_THRESHOLD)
