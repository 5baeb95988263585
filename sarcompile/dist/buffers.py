"""The exchange's buffers: the one :class:`~sarcompile.dist.pool.BufferPool` of this
process (:data:`pool`), which the exchange rounds take their block-sized buffers from
and give them back to, and :func:`empty_cache`, which releases what is idle.
"""

from __future__ import annotations

from sarcompile.dist import cpu_cache
from sarcompile.dist.pool import BufferPool

__all__ = ["empty_cache", "pool"]

pool = BufferPool()  # the exchange's buffers, reused across rounds, ops and steps


def empty_cache() -> int:
    """Release the idle buffers the exchange keeps for reuse (its pool:
    :mod:`sarcompile.dist.pool`) and the idle blocks of the CPU caching allocator
    (:mod:`sarcompile.dist.cpu_cache`), as ``torch.cuda.empty_cache()`` does for CUDA's
    cached blocks: after training, before something else that needs the memory. Returns the
    bytes released. Training can go on; its next steps make their buffers again.

    Example:

    >>> released = sc.empty_cache()   # bytes
    >>> sc.empty_cache()              # nothing idle is left
    0
    """
    cache = cpu_cache.stats()
    idle = pool.idle_bytes + (cache.idle_bytes if cache else 0)  # (the pool's buffers are lent, to the cache)
    pool.clear()
    cpu_cache.release()
    return idle
