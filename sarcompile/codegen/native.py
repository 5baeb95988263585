"""Native code built on first use: a C or C++ source compiled into a shared library in the
kernel cache, for the CPU sparse kernel (:mod:`sarcompile.codegen.cpu_spmm`) and the CPU
caching allocator (:mod:`sarcompile.dist.cpu_cache`); :class:`Library` loads one once
per process, or warns once where it cannot be built.

A library's file name hashes its source, the compiler, the flags and whatever else the
caller says the build depends on (the CPU, for ``-march=native``; torch's version, for its
headers): a cache shared by machines or environments never hands one's build to another.
It is compiled in a temporary directory beside the cache and renamed into place, so a
reader sees a whole library or none, and two processes building at once both succeed.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

__all__ = ["Library", "build", "cpu", "found"]


@functools.lru_cache(maxsize=None)
def found(compiler: str) -> bool:
    """Whether ``compiler`` is on the PATH, looked up once per name (hot paths ask)."""
    return shutil.which(compiler) is not None


def build(name: str, source: str, compiler: str, flags: list[str], depends: str = "", suffix: str = ".c") -> Path:
    """The cached library ``name-<hash>.so`` built from ``source`` (a ``suffix`` file) with
    ``compiler`` and ``flags``, compiled now if it is not there. Raises OSError (naming
    the compiler's last words) or subprocess.TimeoutExpired where the build fails."""
    # (here: `import sarcompile` imports this module before torch's first tensor, the
    # codegen package only after)
    from sarcompile.codegen.kernel_cache import cache_dir

    key = hashlib.sha256("\n".join([source, compiler, *flags, depends]).encode()).hexdigest()[:16]
    path = cache_dir() / f"{name}-{key}.so"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        src, built = Path(tmp) / f"{name}{suffix}", Path(tmp) / f"{name}.so"
        src.write_text(source)
        # Sources first, libraries after: the linker resolves left to right.
        done = subprocess.run([compiler, str(src), "-o", str(built), *flags], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            raise OSError(f"{compiler} failed: {done.stderr.strip()[-500:]}")
        built.replace(path)  # atomic: a reader sees the whole library or none
    return path


def cpu() -> str:
    """What ``-march=native`` compiles for: the CPU's model and flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags"))}))


class Library:
    """A library of :func:`build`'s, loaded on first use, once per process: :meth:`get`
    returns it (``declare`` has set its functions' types), or None where ``build`` fails --
    with one ``RuntimeWarning``, "``what`` could not be built (why); ``instead``", and no
    second try."""

    def __init__(self, build: Callable[[], Path], declare: Callable[[ctypes.CDLL], None], what: str,
                 instead: str) -> None:
        self._build, self._declare, self._what, self._instead = build, declare, what, instead
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = None
        self._failed = False

    def get(self) -> ctypes.CDLL | None:
        if self._lib is not None or self._failed:
            return self._lib
        with self._lock:
            if self._lib is None and not self._failed:
                try:
                    lib = ctypes.CDLL(str(self._build()))
                except (OSError, subprocess.SubprocessError) as e:
                    self._failed = True
                    warnings.warn(f"{self._what} could not be built ({e}); {self._instead}", RuntimeWarning,
                                  stacklevel=3)
                    return None
                self._declare(lib)
                self._lib = lib
        return self._lib

    @property
    def loaded(self) -> ctypes.CDLL | None:
        """The library if :meth:`get` has loaded it; builds nothing."""
        return self._lib
