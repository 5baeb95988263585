"""Peak memory of a worker over a stretch of work (a training step, say).

On a CPU, writing ``5`` to ``/proc/self/clear_refs`` resets the kernel's high-water mark
of this process's resident set (``VmHWM`` in ``/proc/self/status``) to the current
resident size, so ``VmHWM`` read afterwards is the peak since the reset. That counts
everything the process touches (allocator caches, libraries), as the OS sees it. On CUDA
it is ``torch.cuda.max_memory_allocated`` (tensors only) after ``reset_peak_memory_stats``.

    >>> probe = MemoryProbe()
    >>> with probe:
    ...     x = torch.ones(1 << 20)  # 4 MiB
    >>> probe.peak_bytes >= probe.start_bytes
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["MemoryProbe"]


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} is not in /proc/self/status: this probe needs Linux")


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
            self.start_bytes = _status_bytes("VmRSS")
        return self

    def __exit__(self, *exc) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated()
        else:
            self.peak_bytes = _status_bytes("VmHWM")

    @property
    def added_bytes(self) -> int:
        """Peak above what was in use at the start: what the work itself needed."""
        return max(self.peak_bytes - self.start_bytes, 0)
