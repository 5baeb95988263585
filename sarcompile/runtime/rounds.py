"""The sequential exchange rounds every partitioned op runs on (:func:`run_rounds`).

Round ``k`` of an aggregation on worker ``r``: send to ``p = (r + k) mod N``, receive from
``q = (r - k) mod N`` with pairwise ``isend``/``irecv`` (gloo has no all-to-all), so every
worker is busy every round. Round 0 is the local block and moves nothing. Gradients for
remote rows travel the opposite way in the same rounds and are summed by their owner.

What travels goes through a wire: exact SAR's is the identity
(:data:`~sarcompile.runtime.link.EXACT`), a link's may compress
(:class:`~sarcompile.runtime.link.Wire`). A link may also make an iteration's rounds
stale or pipelined, visiting blocks held from earlier iterations.

All traffic is counted per phase in :data:`~sarcompile.dist.traffic.stats`; every
received block is counted by :data:`~sarcompile.dist.traffic.live`, which tracks how many
remote blocks are alive at once (SAR keeps at most two per aggregation: the one being
reduced and the one being prefetched). The exchange's buffers are plain tensors, freed
when their round is over: the allocator keeps their memory for the next (tcmalloc, or the
CPU caching allocator: :mod:`sarcompile.dist.memory`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from sarcompile import logs
from sarcompile.dist import cpu_cache
from sarcompile.dist import memory
from sarcompile.dist.collectives import is_offline
from sarcompile.dist.process_group import wait
from sarcompile.dist.traffic import live, stats
from sarcompile.errors import CommError
from sarcompile.runtime.columns import Columns
from sarcompile.runtime.link import EXACT, Pending

__all__ = ["Visit", "run_rounds"]

TAG_FEATURES, TAG_GRADS = 11, 12
Visit = Callable[[int, "torch.Tensor | None"], "torch.Tensor | None"]
TAG_PIPELINE = 1000  # + 2 * site (+1 for gradients): pipelined exchanges of one site


@dataclass
class _Round:
    """One round's posted transfers: to worker ``p``, from worker ``q``."""

    p: int
    q: int
    buf: torch.Tensor | None = None  # what is received into
    works: list = field(default_factory=list)
    sending: object = None  # the send's work, among ``works``
    sent: int = 0  # bytes, for SARCOMPILE_LOGS=comm


def _isend(t: torch.Tensor, peer: int, tag: int, phase: str):
    """Post a send, counting its bytes under ``phase``."""
    stats.sent[phase] += t.numel() * t.element_size()
    return _post(dist.isend, t, peer, tag)


def _irecv(buf: torch.Tensor, peer: int, tag: int, phase: str):
    """Post a receive into ``buf``, counting its bytes under ``phase``."""
    stats.received[phase] += buf.numel() * buf.element_size()
    return _post(dist.irecv, buf, peer, tag)


def _post(op, t: torch.Tensor, peer: int, tag: int):
    """``op`` (isend or irecv) of ``t`` with ``peer``. gloo refuses at once when the peer's
    connection is already closed: a CommError naming it, as :func:`~sarcompile.dist.process_group.wait` gives for a wait."""
    try:
        return op(t, peer, tag=tag)
    except RuntimeError as e:
        raise CommError(
            f"worker {peer} did not answer: its connection is closed ({str(e).splitlines()[0][:300]}). "
            "It has most likely exited; check its log."
        ) from None


def run_rounds(
    shard,
    visit: Visit,
    *,
    fetch: torch.Tensor | None = None,
    push_into: torch.Tensor | Columns | Callable[[], torch.Tensor | Columns] | None = None,
    lookahead: int = 1,
    phase: str = "forward",
    what: str = "exchange",
    link=None,
    iteration: int = 0,
) -> torch.Tensor | None:
    """Visit every source partition once, local first, then ``q = r-1, r-2, ...``.

    ``fetch``: a node tensor (or :class:`Columns`) whose rows each peer needs; ``visit(q,
    block)`` then gets ``q``'s halo rows of it (the local block gets ``fetch`` itself), with ``lookahead``
    rounds posted ahead (1 for SAR; N-1 fetches everything at once, as domain parallel).
    ``push_into``: if given, what ``visit`` returns for ``q`` (gradient rows for ``q``'s
    halo) is sent back to ``q``, and what peers return for our rows is summed into it; up
    to ``lookahead`` rounds' pushes stay in flight while the next blocks are visited (when
    blocks are fetched too, the blocks ahead are what is in flight during a visit, and a
    push completes before the next block is posted). ``visit`` may return its block's own
    buffer, the gradients written over the rows it has read. ``push_into`` may be a tensor,
    :class:`Columns`, or a function that makes it (the local block's gradient, say): it is
    called once the first blocks are posted, so that their transfer overlaps it. Returns
    what was pushed into.

    ``link`` (a :class:`~sarcompile.runtime.link.LinkState`, None for exact SAR) makes the
    rounds of training ``iteration`` compressed, stale or pipelined (see that module).

    The exchange's buffers are freed at the end of their round: the rows gathered to send
    once sent, the gradients received once added, and each block received once visited,
    unless ``visit`` keeps it (``stash``) or the link's cache does.
    """
    kind = "sync" if link is None else link.policy.kind(iteration)
    cached = link is not None and bool(link.policy.staleness > 1 or link.policy.bounded)
    if kind == "sync" or (kind == "pipelined" and push_into is None and link.pending["forward"] is None):
        if cached and push_into is None:
            link.cache.clear()
        wire = EXACT if link is None else link.wire
        blocks, push_into = _sync_rounds(shard, visit, fetch, push_into, lookahead, phase, what, wire, iteration,
                                         keep=cached and push_into is None,
                                         reuse=link.cache if cached and push_into is not None else None)
        if cached and push_into is None:  # a forward: keep the blocks for stale iterations
            link.cache, link.cache_iteration = blocks, iteration
            link.ages.append(0)
            link.exchanges.append(iteration)
        if link is not None and link.policy.bounded and push_into is not None:
            _drain(link, "backward", what)  # last iteration's late gradients: superseded
    else:
        push_into = push_into() if callable(push_into) else push_into
        _local_rounds(shard, visit, fetch, push_into, link, iteration, phase, what, kind)
    pipelined_next = link is not None and link.policy.bounded and link.policy.kind(iteration + 1) != "sync"
    if pipelined_next and push_into is None and fetch is not None:  # a forward: send for the next iteration
        _post_pipelined(shard, link, fetch, iteration, phase, what)
    if "memory" in logs.ON and not is_offline():  # (not the plan's probe, which runs on a one-worker shard)
        logs.log("memory", f"after {_named(what, phase)}: resident {memory.status_bytes('VmRSS') / 2**20:.1f} MiB, remote "
                 f"blocks alive {live.bytes / 2**20:.2f} MiB (most at once so far {live.peak_bytes / 2**20:.2f} MiB)"
                 + (f", CPU cache {cache.idle_bytes / 2**20:.1f} MiB idle" if (cache := cpu_cache.stats()) else ""))
    return push_into


def _sync_rounds(shard, visit, fetch, push_into, lookahead, phase, what, wire, iteration, keep, reuse):
    """The exact exchange, through ``wire`` (:data:`~sarcompile.runtime.link.EXACT`, or a
    link's, which may compress). Returns the remote blocks received if
    ``keep`` (else each is freed after its visit; ``{}``) and
    the buffer pushed into. ``reuse``: blocks already held (a stale-capable forward's),
    visited instead of fetching them again."""
    n, r = shard.world_size, shard.rank
    tail = lambda t: tuple(t.shape[1:])
    if reuse is not None and fetch is not None:
        fetch_remote = None  # backward re-reads the blocks forward kept
    else:
        fetch_remote = fetch
    received: dict[int, torch.Tensor] = {}

    def post_fetch(k: int) -> _Round:
        p, q = (r + k) % n, (r - k) % n
        posted = _Round(p, q)
        rows = shard.send_index[p]
        if rows.numel():
            send = wire.gather(fetch_remote, rows, f"{phase} features", p, iteration)
            posted.sent = send.nbytes
            posted.sending = _isend(send, p, TAG_FEATURES, phase)
            posted.works.append(posted.sending)
        if shard.blocks[q].num_src:
            posted.buf = wire.receive(shard.blocks[q].num_src, tail(fetch_remote), fetch_remote.dtype,
                                      fetch_remote.device)
            posted.works.append(_irecv(posted.buf, q, TAG_FEATURES, phase))
        return posted

    def post_push(k: int, grad_rows: torch.Tensor | None) -> _Round:
        p, q = (r + k) % n, (r - k) % n
        posted = _Round(p, q)
        if shard.blocks[q].num_src:
            send = wire.encode(grad_rows, f"{phase} gradients", q, iteration).contiguous()
            posted.sent = send.nbytes
            posted.works.append(_isend(send, q, TAG_GRADS, phase))
        if shard.send_index[p].numel():
            posted.buf = wire.empty(shard.send_index[p].numel(), tail(push_into), push_into.dtype, push_into.device)
            posted.works.append(_irecv(posted.buf, p, TAG_GRADS, phase))
        return posted

    def finish_push(posted: _Round) -> None:
        p, q, buf = posted.p, posted.q, posted.buf
        waited = wait(posted.works, f"{what}: gradients to worker {q} / from worker {p}")
        if "comm" in logs.ON:
            _log_round(what, phase, "gradients", q, posted.sent, p, buf, waited)
        if buf is not None:
            buf = wire.decode(buf, shard.send_index[p].numel(), tail(push_into), push_into.dtype)
            push_into.index_add_(0, shard.send_index[p], buf)

    pending = deque()  # fetches posted, their blocks not yet visited
    posted = 0

    def release_sends() -> None:
        """Wait for the rows sent for the blocks ahead to be gone (the peers posted their
        receives before their own visits) and free their buffers."""
        for ahead in pending:
            if ahead.sending is not None:
                wait([ahead.sending], f"{what}: features to worker {ahead.p}")
                ahead.works.remove(ahead.sending)  # (gloo counts completions: a second wait would hang)
                ahead.sending = None  # (the send's work held the rows sent)

    def post_fetches_until(last: int) -> None:
        nonlocal posted
        while fetch_remote is not None and posted < min(last, n - 1):
            posted += 1
            pending.append(post_fetch(posted))

    post_fetches_until(lookahead)
    if callable(push_into):
        push_into = push_into()
    local = visit(r, fetch)
    if push_into is not None and local is not None:
        push_into += local
    del local  # (freed now, not when the rounds end)
    in_flight = deque()  # pushes posted, their gradients not yet added
    for k in range(1, n):
        if fetch_remote is not None:
            post_fetches_until(k)  # (none ahead: this block's fetch is posted as it is visited)
            arrived = pending.popleft()
            q, buf = arrived.q, arrived.buf
            waited = wait(arrived.works, f"{what}: features to worker {arrived.p} / from worker {q}")
            if "comm" in logs.ON:
                _log_round(what, phase, "rows", arrived.p, arrived.sent, q, buf, waited)
            del arrived  # (and with it the rows sent)
            if buf is None:  # nothing to receive from q: an empty block keeps kernels uniform
                buf = fetch.new_empty((0, *tail(fetch)))
            else:
                buf = wire.block(buf, shard.blocks[q].num_src, tail(fetch), fetch.dtype)
            if push_into is not None:
                # Fetching and pushing, a round holds three block-sized buffers (six if all
                # were in flight at once; plan._round_peak): the block, then its gradient,
                # which visit may write over it; the block ahead; and the rows sent for the
                # block ahead, until the gradient's receive takes their place. So the last
                # round's push completes before the next block is posted, and the rows sent
                # are waited for before the push is.
                while in_flight:
                    finish_push(in_flight.popleft())
            post_fetches_until(k + lookahead)
            if keep:
                received[q] = buf
        elif reuse is not None and fetch is not None:
            q = (r - k) % n
            buf = reuse.get(q, fetch.new_empty((0, *tail(fetch))))
        else:
            q, buf = (r - k) % n, None
        out = visit(q, buf)
        del buf
        if push_into is not None and fetch_remote is not None:
            release_sends()
        if push_into is not None:
            # Each push in flight holds two block-sized buffers (plan._round_peak): the
            # oldest completes before the next is posted, never one more than `lookahead`.
            while in_flight and len(in_flight) >= lookahead:
                finish_push(in_flight.popleft())
            in_flight.append(post_push(k, out))
            del out
            if not lookahead:
                finish_push(in_flight.popleft())
    while in_flight:
        finish_push(in_flight.popleft())
    return received, push_into


def _log_round(what: str, phase: str, payload: str, to: int, sent: int, source: int, got: torch.Tensor | None,
               waited: float) -> None:
    """One exchange round for SARCOMPILE_LOGS=comm: ``sent`` bytes to ``to``, ``got`` (the
    buffer received into, None for nothing) from ``source``."""
    received = 0 if got is None else got.nbytes
    logs.log("comm", f"{_named(what, phase)}: {payload} {sent} B to worker {to}, {received} B from worker {source}, "
             f"waited {waited * 1e3:.2f} ms")


def _named(what: str, phase: str) -> str:
    """``spmm(mean) forward``, ``attention backward`` (``what`` of a backward names it already)."""
    return what if what.endswith(phase) else f"{what} {phase}"


def _local_rounds(shard, visit, fetch, push_into, link, iteration, phase, what, kind) -> None:
    """A stale or pipelined iteration: visit the blocks held, exchange nothing now."""
    n, r = shard.world_size, shard.rank
    tail = lambda t: tuple(t.shape[1:])
    if push_into is None and kind == "pipelined":  # features the peers sent last iteration
        got = link.pending["forward"]
        link.pending["forward"] = None
        wait(got.works, f"{what}: pipelined features")
        link.cache = {q: live.track(link.wire.decode(buf, rows, tail(fetch), fetch.dtype)) for q, (buf, rows) in got.bufs.items()}
        link.cache_iteration = got.iteration
    if push_into is None:
        link.ages.append(iteration - link.cache_iteration)
    local = visit(r, fetch)
    if push_into is not None and local is not None:
        push_into += local
    del local
    late: dict[int, torch.Tensor] = {}
    for k in range(1, n):
        q = (r - k) % n
        block = None if fetch is None else link.cache.get(q, fetch.new_empty((0, *tail(fetch))))
        out = visit(q, block)
        if push_into is not None and out is not None and shard.blocks[q].num_src:
            late[q] = out
    if push_into is None or kind != "pipelined":
        return  # stale: remote gradients are dropped until the next refresh
    # Pipelined backward: add what peers sent during the last backward, send ours for the next.
    _drain(link, "backward", what, into=(shard, push_into))
    if link.policy.kind(iteration + 1) == "sync":
        return  # the next iteration is exact: late gradients would be superseded
    works, bufs = [], {}
    tag = TAG_PIPELINE + 2 * link.policy.site + 1
    for q, rows in late.items():
        send = link.wire.encode(rows, f"{phase} gradients", q, iteration).contiguous()
        works.append(_isend(send, q, tag, phase))
    for p in range(n):
        count = shard.send_index[p].numel() if p != r else 0
        if count:
            buf = link.wire.empty(count, tail(push_into), push_into.dtype, push_into.device)
            works.append(_irecv(buf, p, tag, phase))
            bufs[p] = (buf, count)
    link.pending["backward"] = Pending(iteration, works, bufs)


def _drain(link, direction: str, what: str, into=None) -> None:
    """Complete the exchange posted last iteration; add gradients ``into`` (shard, tensor)."""
    got = link.pending[direction]
    link.pending[direction] = None
    if got is None:
        return
    wait(got.works, f"{what}: pipelined gradients")
    if into is None:
        return
    shard, push_into = into
    for p, (buf, rows) in got.bufs.items():
        push_into.index_add_(0, shard.send_index[p], link.wire.decode(buf, rows, tuple(push_into.shape[1:]), push_into.dtype))


def _post_pipelined(shard, link, fetch: torch.Tensor, iteration: int, phase: str, what: str) -> None:
    """Send this iteration's feature rows for the peers' next iteration, and post the receives."""
    n, r = shard.world_size, shard.rank
    tag = TAG_PIPELINE + 2 * link.policy.site
    works, bufs = [], {}
    src = fetch.detach()
    for k in range(1, n):
        p, q = (r + k) % n, (r - k) % n
        rows = shard.send_index[p]
        if rows.numel():
            send = link.wire.encode(src[rows], f"{phase} features", p, iteration).contiguous()
            works.append(_isend(send, p, tag, phase))
        if shard.blocks[q].num_src:
            buf = link.wire.empty(shard.blocks[q].num_src, tuple(fetch.shape[1:]), fetch.dtype, fetch.device)
            works.append(_irecv(buf, q, tag, phase))
            bufs[q] = (buf, shard.blocks[q].num_src)
    link.pending["forward"] = Pending(iteration, works, bufs)
