"""Per-process peak memory probes shared by the benchmarks.

On Linux CPU: writing 5 to ``/proc/self/clear_refs`` resets the peak resident set size
(``VmHWM`` in ``/proc/self/status``) to the current one, so ``VmHWM`` read after a step
is the step's peak. On CUDA, ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import torch


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> int:
    """Reset the peak; returns the current resident bytes (the baseline)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kib("VmRSS") * 1024


def peak() -> int:
    """Peak bytes since the last :func:`reset_peak`."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated()
    return _status_kib("VmHWM") * 1024
