"""Peak memory of a worker over a stretch of work (a training step, say).

On a CPU, writing ``5`` to ``/proc/self/clear_refs`` resets the kernel's high-water mark
of this process's resident set (``VmHWM`` in ``/proc/self/status``) to the current
resident size, so ``VmHWM`` read afterwards is the peak since the reset. That counts
everything the process touches (allocator caches, libraries), as the OS sees it. On CUDA
it is ``torch.cuda.max_memory_allocated`` (tensors only) after ``reset_peak_memory_stats``.

glibc's allocator keeps freed memory of its heap and arenas for reuse, so on a CPU the
resident peak also counts what earlier steps freed. :func:`tune_allocator` (called by
``sc.init()``, by default) hands large frees back to the OS at once, and installs the
caching allocator of :mod:`.cpu_cache` for torch's large tensors, which keeps freed ones
for reuse without holding more than was ever in use at once; :func:`malloc_stats` says
how much freed memory glibc holds.

Another allocator can replace glibc's for the whole process: ``LD_PRELOAD`` of tcmalloc
(or jemalloc) before the process starts -- for example
``LD_PRELOAD=$(sarcompile allocator) torchrun ...``. :func:`find_allocator` finds its
library, :func:`active_allocator` says which one a process runs with. tcmalloc keeps
freed blocks in size classes and reuses them, where glibc's heap leaves holes resident:
in benchmarks/vs_dgl.py it both cut the peak and sped up the epoch (docs/benchmarks.md).

    >>> probe = MemoryProbe()
    >>> with probe:
    ...     x = torch.ones(1 << 20)  # 4 MiB
    >>> probe.peak_bytes >= probe.start_bytes
    True
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from sarcompile.dist import cpu_cache

__all__ = [
    "ALLOCATORS",
    "Allocator",
    "MemoryProbe",
    "active_allocator",
    "allocator_tuned",
    "find_allocator",
    "floor_bytes",
    "apply_policy",
    "huge_pages_requested",
    "malloc_stats",
    "mapped_bytes",
    "release_free",
    "request_huge_pages",
    "status_bytes",
    "tune_allocator",
]

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# Blocks of this size and more get their own mapping, returned to the OS on free. glibc's
# default starts at 128 KiB but grows to the largest block freed (up to 32 MiB), so once a
# worker's node tensors are under 32 MiB (a few workers on a mid-sized graph) they live on
# the heap, and the holes freed ones leave stay resident. The kernels' bounded temporaries
# (opdef.EDGE_CHUNK_ELEMENTS entries: at most 1 MiB, of int64) stay under this, on the
# heap, where they are reused without page faults.
MMAP_THRESHOLD = 5 << 18  # 1.25 MiB
# SARCOMPILE_MALLOC: whether sc.init() fixes the thresholds (see tune_allocator).
MALLOC_MODES = ("auto", "off")
# Former values, and what they mean now.
_RENAMED_MODES = {"default": "off", "lean": "auto"}


@dataclass(frozen=True)
class Allocator:
    """A malloc that can be preloaded in place of glibc's."""

    libs: tuple[str, ...]  # library names (libNAME.so*), in the order looked for
    install: str  # how to install it, for the message that says it is missing


# gperftools' minimal tcmalloc comes first: it has no heap profiler, so nothing else changes.
ALLOCATORS: dict[str, Allocator] = {
    "tcmalloc": Allocator(("tcmalloc_minimal", "tcmalloc"),
                          "Debian/Ubuntu: apt install libtcmalloc-minimal4; Fedora: dnf install gperftools-libs; "
                          "conda: conda install -c conda-forge gperftools"),
    "jemalloc": Allocator(("jemalloc",), "Debian/Ubuntu: apt install libjemalloc2; Fedora: dnf install jemalloc; "
                          "conda: conda install -c conda-forge jemalloc"),
}
# Where Linux distributions put shared libraries (Debian's multiarch directory first).
_SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                    "/usr/local/lib", "/lib/x86_64-linux-gnu", "/lib64")


def status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} is not in /proc/self/status: this probe needs Linux")


def floor_bytes() -> int:
    """This process's resident size once the imports every training script pays for are
    done -- torch's optimizers import more on their first step (about 50 MiB in torch 2.2,
    130 in 2.13), so a throwaway one takes a step first. Memory above it is the run's own:
    the data, the graph and training. Also resets the resident high-water mark (CPU)."""
    p = torch.nn.Parameter(torch.zeros(4, device="cpu"))  # the CPU: what is measured is this process's RSS
    p.grad = torch.ones(4, device="cpu")
    torch.optim.Adam([p], lr=0.1).step()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_bytes("VmRSS")


def mapped_bytes(directory: str | os.PathLike) -> dict[str, int]:
    """Resident bytes of each file of ``directory`` this process has mapped now (by file
    name), from ``/proc/self/smaps`` (Linux): the pages of a memory-mapped part file a
    worker has touched."""
    directory = Path(directory).resolve()
    resident: dict[str, int] = {}
    name = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping's first line: address range, ..., path
                name = Path(head[5]).name if len(head) > 5 and Path(head[5]).parent == directory else None
            elif name is not None and head[0] == "Rss:":
                resident[name] = resident.get(name, 0) + int(head[1]) * 1024
    return resident


@dataclass
class MemoryProbe:
    """``with probe: ...`` records the bytes in use at the start and the peak inside."""

    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    start_bytes: int = 0
    peak_bytes: int = 0

    def __enter__(self) -> "MemoryProbe":
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start_bytes = torch.cuda.memory_allocated()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.start_bytes = status_bytes("VmRSS")
        return self

    def __exit__(self, *exc) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated()
        else:
            self.peak_bytes = status_bytes("VmHWM")

    @property
    def added_bytes(self) -> int:
        """Peak above what was in use at the start: what the work itself needed."""
        return max(self.peak_bytes - self.start_bytes, 0)


def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "mallopt") else None


def find_allocator(name: str = "tcmalloc") -> str | None:
    """The path of allocator ``name``'s shared library (a key of :data:`ALLOCATORS`), for
    ``LD_PRELOAD``; None when it is not installed. Looks in this Python environment's
    ``lib`` (a conda env's gperftools or jemalloc), then the system's library directories
    (Debian/Ubuntu: ``apt install libtcmalloc-minimal4`` or ``libjemalloc2``)."""
    if name not in ALLOCATORS:
        raise ValueError(f"unknown allocator {name!r}: one of {', '.join(ALLOCATORS)}")
    prefixes = [os.environ.get("CONDA_PREFIX"), sys.prefix, sys.base_prefix]
    dirs = [str(Path(p) / "lib") for p in prefixes if p] + list(_SYSTEM_LIB_DIRS)
    for lib in ALLOCATORS[name].libs:
        for d in dict.fromkeys(dirs):  # in order, once each
            # The versioned file (libtcmalloc_minimal.so.4) is what a runtime package
            # installs; the bare .so link comes only with the -dev package.
            found = sorted(Path(d).glob(f"lib{lib}.so*")) if Path(d).is_dir() else []
            if found:
                return str(found[0])
        soname = ctypes.util.find_library(lib)  # ldconfig's cache: other directories
        if soname:
            return soname
    return None


def active_allocator() -> str:
    """Which allocator serves this process's ``malloc``: a key of :data:`ALLOCATORS` when
    its library is loaded (preloaded, it replaces glibc's for everything), else ``"glibc"``."""
    try:
        with open("/proc/self/maps") as f:
            libs = {Path(line.split()[-1]).name for line in f if ".so" in line}
    except OSError:  # not Linux
        return "glibc"
    for name, allocator in ALLOCATORS.items():
        if any(lib.startswith(f"lib{n}.so") for lib in libs for n in allocator.libs):
            return name
    return "glibc"


def tune_allocator() -> bool:
    """Fix glibc's mmap and trim thresholds at :data:`MMAP_THRESHOLD` (``mallopt``), so a
    freed tensor of that size or more goes back to the OS at once, per ``SARCOMPILE_MALLOC``:

    * ``auto`` (the default): on any number of workers. glibc's own threshold grows to
      the largest block freed (up to 32 MiB), so a worker's node tensors on a few workers,
      and a step's per-edge tensors on one, live on its heap, whose holes stay resident:
      a third of a worker's peak at 4 workers, 65-100 MiB of 560-700 at one
      (benchmarks/vs_dgl.py). The price is a page fault for each fresh page of a large
      tensor, which the caching allocator (:mod:`.cpu_cache`, installed here too: freed
      large blocks kept for the next step's requests, never more than a step needs at
      once) and huge pages (:func:`request_huge_pages`) keep small. (tcmalloc, preloaded,
      pays neither: ``sarcompile allocator``.)
    * ``off``: glibc's own (dynamic) thresholds. (``lean``, which fixed them on one
      process too when ``auto`` did not, now means ``auto``.)

    A threshold the user set (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``) is
    kept. Returns whether it changed anything (False off glibc, e.g. macOS or musl, or when
    another allocator is preloaded)."""
    if not _tunes():
        return False
    cpu_cache.install(MMAP_THRESHOLD)
    libc = _libc()
    if libc is None:
        return False
    changed = False
    for var, param in (("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD), ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD)):
        if var not in os.environ:
            changed |= bool(libc.mallopt(param, MMAP_THRESHOLD))
    global _tuned
    _tuned = _tuned or changed
    return changed


_tuned = False  # whether tune_allocator changed glibc's thresholds in this process


def _tunes() -> bool:
    """Whether ``SARCOMPILE_MALLOC`` fixes glibc's thresholds."""
    mode = os.environ.get("SARCOMPILE_MALLOC", "auto")
    if mode in _RENAMED_MODES:
        now = _RENAMED_MODES[mode]
        warnings.warn(f"SARCOMPILE_MALLOC={mode} is deprecated: it means {now!r} now; set SARCOMPILE_MALLOC={now}",
                      DeprecationWarning, stacklevel=3)
        mode = now
    if mode not in MALLOC_MODES:
        raise ValueError(f"SARCOMPILE_MALLOC={mode!r} is not one of {', '.join(MALLOC_MODES)} "
                         "(auto: fixed thresholds, the default; off: glibc's own)")
    return mode == "auto" and active_allocator() == "glibc"


# torch's CPU allocator puts tensors of 2 MiB or more on transparent huge pages when this
# variable is 1 (c10's alloc_cpu: 2 MiB alignment and madvise(MADV_HUGEPAGE)). It reads it
# once, at its first allocation.
HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"
_huge_pages = False  # whether request_huge_pages set it in this process


def request_huge_pages() -> bool:
    """Ask torch for huge pages where :func:`tune_allocator` will fix glibc's thresholds
    (``SARCOMPILE_MALLOC``). Fixed thresholds give each large tensor a fresh mapping,
    faulted in a page at a time: with 4 KiB pages that cost N=4 epochs 18-25%
    (benchmarks/vs_dgl.py); with 2 MiB pages, 512 times fewer faults. torch reads the
    variable once, at its first allocation, so :func:`apply_policy` (``sc.init()``) calls
    this first; a tensor made before (``import torch`` alone makes none) or a value the
    user set leaves torch as it is. Importing sarcompile does not call it: importing a
    library changes nothing in the process. Returns whether it set the variable."""
    global _huge_pages
    try:
        with warnings.catch_warnings():  # a bad or deprecated setting is named by sc.init(), once
            warnings.simplefilter("ignore")
            tunes = _tunes()
    except ValueError:
        return False
    if HUGE_PAGES_ENV in os.environ or not tunes:
        return False
    os.environ[HUGE_PAGES_ENV] = "1"
    _huge_pages = True
    return True


def apply_policy() -> None:
    """The memory policy of ``SARCOMPILE_MALLOC``, applied once per process by ``sc.init()``
    (and so by the trainer's and predict's entry points, before their first tensor): huge
    pages asked of torch (:func:`request_huge_pages`), then glibc's thresholds fixed and the
    caching allocator installed (:func:`tune_allocator`). The trainer's start line names
    what was applied."""
    request_huge_pages()
    tune_allocator()


def huge_pages_requested() -> bool:
    """Whether :func:`request_huge_pages` asked torch for huge pages in this process."""
    return _huge_pages


def allocator_tuned() -> bool:
    """Whether :func:`tune_allocator` fixed glibc's thresholds in this process."""
    return _tuned


def release_free() -> None:
    """Hand the freed memory glibc and the caching allocator hold back to the OS
    (``malloc_trim``), after a one-off phase that allocated and freed a lot (loading a part
    file): training would otherwise start with it resident. With tcmalloc preloaded, its own call for the same; a no-op
    off glibc otherwise."""
    cpu_cache.release()
    libc = _libc()
    if active_allocator() == "tcmalloc":
        # gperftools' C entry point; the preloaded library's symbols are the process's.
        release = getattr(ctypes.CDLL(None), "MallocExtension_ReleaseFreeMemory", None)
        if release is not None:
            release()
    elif libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def malloc_stats() -> dict[str, int]:
    """glibc's view now: ``malloc_in_use`` (bytes in live blocks, heap and mmapped) and
    ``malloc_free_held`` (freed bytes it keeps resident for reuse: the allocator's slack).
    Empty where ``mallinfo2`` is missing (glibc < 2.33, other C libraries) or another
    allocator is preloaded (glibc's figures would then be about an unused heap)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2") or active_allocator() != "glibc":
        return {}
    libc.mallinfo2.restype = _Mallinfo2
    m = libc.mallinfo2()
    return {"malloc_in_use": m.uordblks + m.hblkhd, "malloc_free_held": m.fordblks}
