"""dist/buffers.py: the exchange's pool, and empty_cache releasing what is idle."""

import torch

import sarcompile as sc
from sarcompile.dist.buffers import pool
from sarcompile.dist.pool import size_class


def test_empty_cache_releases_the_exchange_pools_idle_buffers():
    before = pool.held_bytes - pool.idle_bytes
    t = pool.take((1 << 20,), torch.float32)  # 4 MiB: over the pool's floor
    pool.give(t)
    assert sc.empty_cache() >= size_class(4 << 20)
    assert pool.idle_bytes == 0 and pool.held_bytes == before
    assert sc.empty_cache() == 0
