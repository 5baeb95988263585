"""Buffers of the exchange, kept for reuse across blocks, layers and steps.

Every round of an exchange needs block-sized buffers whose whole life is inside the round:
the rows gathered to send, the block received, the gradients pushed back. Freed and made
anew each time, a buffer larger than glibc's mmap threshold is a fresh mapping that the
kernel faults in page by page (``SARCOMPILE_MALLOC=auto`` fixes that threshold at
1.25 MiB, so it is most of them): the "page-fault tax" of
docs/benchmarks.md. The pool keeps them instead, as PyTorch's caching allocator does on
CUDA, in size classes of sixteen per power of two (at most 6.25% over a request), and hands
out the smallest idle one that fits. (A layer's narrower blocks take its wider ones'
buffers: with the input's 128 features and 256 hidden, one set of 256-wide buffers serves
every layer, where buffers of each width would be dropped and made again every step.)

A request no idle buffer fits replaces the largest idle one (all are smaller) by a buffer
of its size, and makes a new one only when none is idle. So the pool holds no more
buffers than were ever lent out at once, none larger than the largest size asked for, and
once the sizes repeat (training steps) it soon allocates nothing more: each miss adds a
buffer or grows one, through the few sizes a program has (on the anchor graph of
benchmarks/vs_dgl.py, nothing after the first step). For an exchange that is about what
the plan's estimate counts as ``remote_blocks`` + ``exchange_buffers`` (the exchange's
peak, a sum of maxima), held between exchanges too: 0.77x (SAGE) and 1.00x (GAT) of it
there, up to 1.6x on tiny graphs, where buffers of one size serve requests of several.

Buffers under :data:`MIN_BYTES` (glibc keeps those on its heap, reused without faults) and
buffers off the CPU (CUDA has its own caching allocator) are not pooled.

    >>> pool = BufferPool()
    >>> a = pool.take((1000, 512), torch.float32)
    >>> pool.give(a); pool.idle_bytes == pool.held_bytes > 0
    True
    >>> b = pool.take((990, 512), torch.float32)   # the same buffer, no new pages
    >>> pool.idle_bytes
    0
"""

from __future__ import annotations

import bisect
import weakref

import torch

from sarcompile.dist.memory import MMAP_THRESHOLD

__all__ = ["BufferPool", "MIN_BYTES", "size_class"]

MIN_BYTES = MMAP_THRESHOLD
_CLASS_BITS = 4  # 2**4 size classes per power of two


def size_class(nbytes: int) -> int:
    """``nbytes`` rounded up to the next of sixteen sizes per power of two."""
    step = 1 << max(nbytes.bit_length() - 1 - _CLASS_BITS, 0)  # a sixteenth of the power of two below
    return -(-nbytes // step) * step


class BufferPool:
    """Idle storages by size; :meth:`take` lends one out as a tensor, :meth:`give` takes
    it back once nothing uses it (the caller knows: a buffer is given back only where its
    whole life is known, inside one exchange round). A lent tensor never given back is
    freed as usual when it dies, and leaves the pool's count then."""

    def __init__(self, min_bytes: int = MIN_BYTES) -> None:
        self.min_bytes = min_bytes
        self._idle: list[tuple[int, int, torch.UntypedStorage]] = []  # (capacity, id, storage), by capacity
        self._lent: dict[int, tuple[int, weakref.finalize]] = {}  # data_ptr -> (capacity, its death's hook)
        self.held_bytes = self.lent_bytes = 0
        self.allocations = 0  # storages made (not found idle) since the start
        self.peak_lent = 0  # most buffers lent at once since the last reset_peak()

    @property
    def idle_bytes(self) -> int:
        return self.held_bytes - self.lent_bytes

    def reset_peak(self) -> None:
        """Start counting :attr:`peak_lent` from the buffers lent now."""
        self.peak_lent = len(self._lent)

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
        """An uninitialised contiguous tensor of ``shape`` and ``dtype`` on ``device``, in an idle
        buffer if one fits (the pool holds CPU buffers only: elsewhere a fresh tensor)."""
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        if torch.device(device).type != "cpu" or nbytes < max(self.min_bytes, 1):
            return torch.empty(shape, dtype=dtype, device=device)
        storage = self._find(nbytes)
        if storage is None:
            storage = self._make(size_class(nbytes))
        capacity = storage.nbytes()
        self.lent_bytes += capacity
        out = torch.empty(0, dtype=dtype, device="cpu").set_(storage, 0, shape)  # (a CPU storage: see take)
        key = storage.data_ptr()
        self._lent[key] = (capacity, weakref.finalize(out, self._lost, key))
        self.peak_lent = max(self.peak_lent, len(self._lent))
        return out

    def give(self, t: torch.Tensor) -> None:
        """Take back a tensor :meth:`take` lent, which nothing uses any more (others are ignored)."""
        storage = t.untyped_storage()
        got = self._lent.pop(storage.data_ptr(), None)
        if got is None:
            return
        capacity, death = got
        death.detach()
        self.lent_bytes -= capacity
        bisect.insort(self._idle, (capacity, id(storage), storage))

    def clear(self) -> None:
        """Drop every idle buffer (lent ones are not affected)."""
        self.held_bytes -= sum(cap for cap, _, _ in self._idle)
        self._idle.clear()

    def _lost(self, key: int) -> None:
        """A lent tensor died without being given back: its memory went with it."""
        capacity, _ = self._lent.pop(key)
        self.lent_bytes -= capacity
        self.held_bytes -= capacity

    def _find(self, nbytes: int) -> torch.UntypedStorage | None:
        i = bisect.bisect_left(self._idle, (nbytes,))
        if i < len(self._idle):
            return self._idle.pop(i)[2]
        return None

    def _make(self, capacity: int) -> torch.UntypedStorage:
        if self._idle:  # all smaller than asked: the largest grows (none is dropped for good)
            self.held_bytes -= self._idle.pop()[0]
        self.held_bytes += capacity
        self.allocations += 1
        return torch.empty(capacity, dtype=torch.uint8, device="cpu").untyped_storage()  # CPU only: see take
