"""The exchange's buffer pool (sarcompile.dist.pool), against plain bookkeeping of what
was lent and given back."""

import torch
from hypothesis import given, settings, strategies as st

from sarcompile.dist.pool import BufferPool, size_class


@given(st.integers(1, 1 << 40))
def test_size_class_is_at_most_a_sixteenth_over(n):
    c = size_class(n)
    assert n <= c <= n * 17 // 16 + 1
    assert size_class(c) == c  # a class is its own class


# A program: per step, the same sequence of (take rows of a width) and (give back the k-th
# buffer still lent), as an exchange's rounds are.
programs = st.lists(
    st.one_of(st.tuples(st.just("take"), st.integers(1, 300), st.sampled_from([4, 8, 20])),
              st.tuples(st.just("give"), st.integers(0, 10))),
    min_size=1,
    max_size=40,
)


def _run(pool: BufferPool, program, check) -> None:
    lent = []
    for op in program:
        if op[0] == "take":
            t = pool.take((op[1], op[2]), torch.float32)
            assert t.shape == (op[1], op[2]) and t.is_contiguous()
            t.fill_(len(lent))  # each lent buffer holds its own number ...
            lent.append(t)
        elif lent:
            pool.give(lent.pop(op[1] % len(lent)))
        check(lent)
    for i, t in enumerate(lent):  # ... which no later take overwrote: no two lent buffers overlap
        assert t.eq(t.flatten()[0]).all()
    for t in lent:
        pool.give(t)


@settings(max_examples=60, deadline=None)
@given(programs)
def test_pool_lends_apart_counts_right_and_stops_allocating(program):
    pool = BufferPool(min_bytes=0)
    most_lent = [0]

    def check(lent):
        ptrs = [t.untyped_storage().data_ptr() for t in lent]
        assert len(set(ptrs)) == len(ptrs)
        assert pool.lent_bytes == sum(t.untyped_storage().nbytes() for t in lent)
        assert pool.held_bytes >= pool.lent_bytes
        most_lent[0] = max(most_lent[0], len(lent))

    # The same step again and again: a miss only adds a buffer when none is idle, or grows
    # one, through finitely many sizes, so within that many steps one allocates nothing.
    sizes = {size_class(op[1] * op[2] * 4) for op in program if op[0] == "take"}
    for _ in range(len(sizes) * len(program) + 1):
        made = pool.allocations
        _run(pool, program, check)
        assert pool.lent_bytes == 0 and pool.idle_bytes == pool.held_bytes
        assert len(pool._idle) <= most_lent[0]  # no more buffers than were ever lent at once
        if pool.allocations == made:
            break
    else:
        raise AssertionError(f"still allocating after {len(sizes) * len(program) + 1} steps")
    made = pool.allocations
    _run(pool, program, check)
    assert pool.allocations == made


def test_reused_buffer_is_the_same_memory_and_a_lost_one_leaves():
    pool = BufferPool(min_bytes=0)
    a = pool.take((100, 8), torch.float32)
    ptr = a.data_ptr()
    pool.give(a)
    b = pool.take((90, 8), torch.float32)  # smaller: the same buffer
    assert b.data_ptr() == ptr and pool.allocations == 1
    held = pool.held_bytes
    del b  # never given back: freed as usual, and out of the pool's count
    assert pool.held_bytes == 0 and pool.lent_bytes == 0 and held > 0
    c = pool.take((90, 8), torch.float32)
    assert pool.allocations == 2
    pool.give(c)
    pool.give(c)  # twice, or a tensor it never lent: ignored
    pool.give(torch.empty(3))
    assert pool.held_bytes == pool.idle_bytes == c.untyped_storage().nbytes()
    pool.clear()
    assert pool.held_bytes == 0


def test_larger_request_grows_the_largest_idle_buffer():
    pool = BufferPool(min_bytes=0)
    small, large = pool.take((10, 4), torch.float32), pool.take((20, 4), torch.float32)
    pool.give(small)
    pool.give(large)
    big = pool.take((100, 4), torch.float32)  # fits neither: the 20-row one is replaced
    assert sorted(cap for cap, _, _ in pool._idle) == [size_class(10 * 4 * 4)]
    assert pool.held_bytes == size_class(40 * 4) + size_class(400 * 4)
    pool.give(big)


def test_small_and_device_buffers_are_not_pooled():
    pool = BufferPool()  # the library's floor: glibc's heap keeps small ones without faults
    t = pool.take((10, 10), torch.float32)
    pool.give(t)
    assert pool.allocations == 0 and pool.held_bytes == 0
    big = pool.take((1 << 20,), torch.float32)  # 4 MiB: pooled
    assert pool.lent_bytes == size_class(4 << 20)
    pool.give(big)
