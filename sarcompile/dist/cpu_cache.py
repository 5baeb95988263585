"""A caching allocator for torch's large CPU tensors, as PyTorch's is for CUDA's.

With ``SARCOMPILE_MALLOC=auto`` (:func:`sarcompile.dist.memory.tune_allocator`) every
freed block of 1.25 MiB or more goes back to the OS at once, so that a worker's resident
set holds no freed tensors; the price is that every large tensor made afterwards is a fresh
mapping, faulted in page by page -- the "page-fault tax" of docs/benchmarks.md, paid by
the exchange's buffers, activations, gradients and kernel outputs alike. This allocator takes the place of torch's CPU allocator
(``c10::SetCPUAllocator``) and keeps freed large blocks for reuse instead, under a bound
that keeps ``auto``'s memory:

* Blocks under ``min_bytes`` (:func:`install`'s argument: glibc's fixed mmap threshold,
  :data:`sarcompile.dist.memory.MMAP_THRESHOLD`) go to torch's own allocator as before
  (glibc keeps those on its heap, where they are reused without faults).
* A request takes the smallest idle block that fits it and is at most a sixteenth larger;
  otherwise a new block is made by torch's allocator (with its alignment and huge pages).
* **Bound:** the bytes held (lent out plus idle) never exceed the most ever lent out at
  once. Before a new block is made, idle blocks are freed until the bound holds, fewest
  bytes first (the smallest block that covers the excess, else the largest ones). At a
  step's peak nothing is idle, so the peak is what the step itself needs, as without the
  cache; between peaks, the freed blocks wait for the next step's requests of the same
  sizes (training repeats them) instead of being faulted in again.

Tensors made before :func:`install` keep the allocator they were made by. Pointers handed
to torch's raw interface (oneDNN's scratch buffers) are told apart by address. The cache
is C++ (below), compiled against the running torch's headers on first use with ``$CXX``
(else ``c++``) into the kernel cache, like :mod:`sarcompile.codegen.cpu_spmm`; with no
compiler, a failed build (one warning) or ``SARCOMPILE_CPU_CACHE=0``, tensors stay with
torch's allocator and results are the same.

    >>> from sarcompile.dist import cpu_cache, memory
    >>> if cpu_cache.install(memory.MMAP_THRESHOLD):
    ...     x = torch.empty(1 << 20); del x   # 4 MiB: kept idle, not unmapped
    ...     assert cpu_cache.stats().idle_bytes >= 4 << 20
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from sarcompile.codegen import native

__all__ = ["CacheStats", "empty_cache", "enabled", "install", "installed", "release", "stats"]

_SOURCE = r"""
// sarcompile's caching CPU allocator: see sarcompile/dist/cpu_cache.py.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <pthread.h>
#include <cstdint>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>

namespace {

struct Block {
  size_t size;
  std::list<void*>::iterator lru;  // where it sits among the idle ones, while idle
};

std::mutex mu;
c10::Allocator* base = nullptr;       // torch's allocator, which makes and frees the blocks
c10::DeleterFnPtr base_free = nullptr;
size_t min_bytes = 0;                 // smaller requests go straight to base
size_t lent = 0, idle = 0, high = 0;  // bytes of blocks in use, kept idle; most ever in use
uint64_t hits = 0, misses = 0;
// Made once and never destroyed: torch frees tensors during its own static destruction at
// exit, which may come after this library's.
auto& blocks = *new std::unordered_map<void*, Block>();  // every block of ours, in use or idle
auto& by_size = *new std::multimap<size_t, void*>();     // the idle ones by size
auto& lru = *new std::list<void*>();                     // the idle ones, oldest first (ties in by_size)

void take_idle(std::multimap<size_t, void*>::iterator it) {  // mu held
  Block& b = blocks.at(it->second);
  lru.erase(b.lru);
  by_size.erase(it);
  idle -= b.size;
}

// Frees idle blocks until `after` bytes in use plus the idle ones fit within `cap`,
// dropping as few bytes as will do. (mu held)
void trim(size_t after, size_t cap) {
  while (idle > 0 && after + idle > cap) {
    auto it = by_size.lower_bound(after + idle - cap);
    if (it == by_size.end()) it = std::prev(by_size.end());
    void* p = it->second;
    take_idle(it);
    blocks.erase(p);
    base_free(p);
  }
}

void give_back(void* p) {
  std::lock_guard<std::mutex> g(mu);
  auto it = blocks.find(p);
  if (it == blocks.end()) {  // not ours: a small block handed out raw, or one made before
    base_free(p);
    return;
  }
  Block& b = it->second;
  lent -= b.size;
  idle += b.size;
  b.lru = lru.insert(lru.end(), p);
  by_size.emplace(b.size, p);
}

struct CachingAllocator final : c10::Allocator {
#ifdef SC_ALLOCATE_CONST
  c10::DataPtr allocate(size_t n) const override {
#else
  c10::DataPtr allocate(size_t n) override {
#endif
    if (n < min_bytes) return base->allocate(n);
    size_t want = (n + 4095) & ~size_t(4095);  // whole pages
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> g(mu);
      auto it = by_size.lower_bound(want);
      if (it != by_size.end() && it->first - want <= want / 16) {
        p = it->second;
        take_idle(it);
        lent += blocks.at(p).size;
        if (lent > high) high = lent;
        ++hits;
      } else {
        ++misses;
        trim(lent + want, lent + want > high ? lent + want : high);
      }
    }
    if (p == nullptr) {
      p = base->raw_allocate(want);  // throws c10::Error when out of memory, as torch's does
      std::lock_guard<std::mutex> g(mu);
      blocks.emplace(p, Block{want, lru.end()});
      lent += want;
      if (lent > high) high = lent;
    }
    // Pointer and context alike, as torch's raw interface asks (raw_allocate checks it).
    return {p, p, &give_back, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &give_back; }
#ifdef SC_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
};

auto& cache = *new CachingAllocator();  // (never destroyed either: torch keeps a pointer to it)

}  // namespace

extern "C" {
// 1: installed (now or before); -1: another allocator took torch's place after ours;
// -2: torch's allocator has no raw deleter to free blocks with; -3: torch kept its own.
int sc_cache_install(size_t min) {
  std::lock_guard<std::mutex> g(mu);
  if (base != nullptr) return c10::GetCPUAllocator() == &cache ? 1 : -1;
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current->raw_deleter() == nullptr) return -2;
  base = current;
  base_free = current->raw_deleter();
  min_bytes = min;
  c10::SetCPUAllocator(&cache, /*priority=*/100);
  if (c10::GetCPUAllocator() != &cache) return -3;
  // A fork while another thread holds the lock must not leave the child's copy locked.
  pthread_atfork([] { mu.lock(); }, [] { mu.unlock(); }, [] { mu.unlock(); });
  return 1;
}

int sc_cache_installed() { return base != nullptr && c10::GetCPUAllocator() == &cache; }

void sc_cache_stats(uint64_t* out) {
  std::lock_guard<std::mutex> g(mu);
  out[0] = lent; out[1] = idle; out[2] = high; out[3] = hits; out[4] = misses;
}

void sc_cache_release() {
  std::lock_guard<std::mutex> g(mu);
  trim(lent, lent);
}
}
"""


@dataclass(frozen=True)
class CacheStats:
    """The cache's bytes and requests since it was installed."""

    lent_bytes: int  # in blocks now in use
    idle_bytes: int  # in blocks kept for reuse (resident: counted by the OS, and within glibc's malloc_in_use)
    high_bytes: int  # the most ever in use at once: lent + idle never exceeds it
    hits: int  # requests served by an idle block
    misses: int  # requests that made a new block


def enabled() -> bool:
    """Whether :func:`install` may install the cache: not turned off, on Linux, with a C++
    compiler. (Cheap: it builds nothing.)"""
    if os.environ.get("SARCOMPILE_CPU_CACHE", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    return native.found(os.environ.get("CXX", "c++"))


def install(min_bytes: int) -> bool:
    """Put the cache in the place of torch's CPU allocator, for the tensors made from now
    on, of ``min_bytes`` or more (``sc.init()`` calls it under ``SARCOMPILE_MALLOC=auto``;
    a second call changes nothing, whatever its ``min_bytes``). Returns whether it is
    installed; False, leaving torch's allocator, where it is not :func:`enabled`, cannot be
    built (with one warning), or torch's allocator was replaced by someone else."""
    if not enabled():
        return False
    lib = _library.get()
    return lib is not None and lib.sc_cache_install(min_bytes) == 1


def installed() -> bool:
    """Whether the cache serves torch's CPU tensors in this process."""
    lib = _library.loaded
    return lib is not None and bool(lib.sc_cache_installed())


def stats() -> CacheStats | None:
    """The cache's figures now; None where it is not installed."""
    if not installed():
        return None
    out = (ctypes.c_uint64 * 5)()
    _library.loaded.sc_cache_stats(out)
    return CacheStats(*out)


def release() -> None:
    """Free every idle block (after a one-off phase, such as loading a part file, whose
    sizes will not come again). A no-op where the cache is not installed."""
    if _library.loaded is not None:
        _library.loaded.sc_cache_release()


def empty_cache() -> int:
    """Release the cache's idle blocks, as ``torch.cuda.empty_cache()`` does for CUDA's
    cached blocks: after training, before something else that needs the memory. Returns the
    bytes released (0 where the cache is not installed). Training can go on; its next steps
    make their blocks again.

    Example:

    >>> released = sc.empty_cache()   # bytes
    >>> sc.empty_cache()              # nothing idle is left
    0
    """
    cache = stats()
    release()
    return cache.idle_bytes if cache else 0


def _build() -> Path:
    root = Path(torch.__file__).parent
    header = (root / "include" / "c10" / "core" / "Allocator.h").read_text()
    flags = ["-O2", "-std=c++17", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
             f"-I{root / 'include'}", f"-L{root / 'lib'}", "-lc10", f"-Wl,-rpath,{root / 'lib'}"]
    # The interface moved between torch versions: allocate() lost its const in 2.3, which
    # also added copy_data().
    if re.search(r"DataPtr allocate\(size_t \w+\) const = 0", header):
        flags.append("-DSC_ALLOCATE_CONST")
    if "virtual void copy_data" in header:
        flags.append("-DSC_COPY_DATA")
    return native.build("cpu_cache", _SOURCE, os.environ.get("CXX", "c++"), flags, depends=torch.__version__,
                        suffix=".cpp")


def _declare(lib: ctypes.CDLL) -> None:
    lib.sc_cache_install.argtypes, lib.sc_cache_install.restype = [ctypes.c_size_t], ctypes.c_int
    lib.sc_cache_stats.argtypes, lib.sc_cache_stats.restype = [ctypes.POINTER(ctypes.c_uint64)], None
    lib.sc_cache_release.argtypes, lib.sc_cache_release.restype = [], None
    lib.sc_cache_installed.argtypes, lib.sc_cache_installed.restype = [], ctypes.c_int


# Built (once per machine) and loaded on first use.
_library = native.Library(_build, _declare, "sarcompile's CPU caching allocator",
                          "large tensors are faulted in afresh each step (slower). Install a C++ compiler (c++, or "
                          "set CXX) or set SARCOMPILE_CPU_CACHE=0 to silence this.")
