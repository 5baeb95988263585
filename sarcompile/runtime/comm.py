"""Process group set-up and the sequential exchange rounds every partitioned op runs on.

Round ``k`` of an aggregation on worker ``r``: send to ``p = (r + k) mod N``, receive from
``q = (r - k) mod N`` with pairwise ``isend``/``irecv`` (gloo has no all-to-all), so every
worker is busy every round. Round 0 is the local block and moves nothing. Gradients for
remote rows travel the opposite way in the same rounds and are summed by their owner.

All traffic is counted per phase in :data:`stats`; every received block is allocated
through :data:`live`, which tracks how many remote blocks are alive at once (SAR keeps at
most two per aggregation: the one being reduced and the one being prefetched).
"""

from __future__ import annotations

import atexit
import os
import weakref
from contextlib import contextmanager
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

from ..errors import CommError

__all__ = ["init", "shutdown", "timeout", "run_rounds", "stats", "live", "sync_gradients", "global_sum", "global_max"]

TAG_FEATURES, TAG_GRADS = 11, 12
_DEFAULT_TIMEOUT_S = 300.0


def timeout() -> float:
    """Seconds any single wait may take (``SARCOMPILE_TIMEOUT``, default 300)."""
    return float(os.environ.get("SARCOMPILE_TIMEOUT", _DEFAULT_TIMEOUT_S))


def init(backend: str | None = None, timeout_s: float | None = None) -> tuple[int, int]:
    """Join the process group torchrun describes in the environment; returns (rank, world size).

    Without torchrun's variables this starts a one-worker group, so the same script runs
    on one machine with ``python script.py``. gloo on CPU, nccl when CUDA is available.
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    wait = timedelta(seconds=timeout_s or timeout())
    if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, timeout=wait)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=wait)
    # A gloo process that exits with its group still up can abort at random; tear down first.
    atexit.register(shutdown)
    return dist.get_rank(), dist.get_world_size()


def shutdown() -> None:
    """Tear the process group down, all workers together (safe to call twice).

    A worker that tears down while a peer still talks to it can make gloo abort the peer
    ("terminate called without an active exception"), so all meet at a barrier first.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_world_size() > 1:
        try:
            _wait([dist.barrier(async_op=True)], "shutdown")
        except CommError:
            pass  # a peer is already gone: nothing left to wait for
    dist.destroy_process_group()


# -- accounting ---------------------------------------------------------------------------
@dataclass
class CommStats:
    """Bytes sent and received by this worker, per phase (forward, backward, allreduce)."""

    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    received: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def reset(self) -> None:
        self.sent.clear()
        self.received.clear()

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {"sent": dict(self.sent), "received": dict(self.received)}


class LiveBlocks:
    """Counts remote blocks that are still referenced, via weak-reference finalizers."""

    def __init__(self) -> None:
        self.count = self.peak = 0
        self.bytes = self.peak_bytes = 0

    def alloc(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype)
        nbytes = buf.numel() * buf.element_size()
        self.count += 1
        self.bytes += nbytes
        self.peak, self.peak_bytes = max(self.peak, self.count), max(self.peak_bytes, self.bytes)
        weakref.finalize(buf, self._free, nbytes)
        return buf

    def _free(self, nbytes: int) -> None:
        self.count -= 1
        self.bytes -= nbytes

    def reset_peak(self) -> None:
        self.peak, self.peak_bytes = self.count, self.bytes


stats = CommStats()
live = LiveBlocks()


def _wait(works: list, what: str) -> None:
    limit = timedelta(seconds=timeout())
    for w in works:
        try:
            w.wait(limit)
        except RuntimeError as e:  # gloo reports closed peers and timeouts as RuntimeError
            raise CommError(
                f"{what}: a peer worker did not answer within {limit.total_seconds():.0f}s or went away "
                f"({e}). Check the other workers' logs; raise SARCOMPILE_TIMEOUT if they are just slow."
            ) from None


# -- the rounds -----------------------------------------------------------------------------
Visit = Callable[[int, "torch.Tensor | None"], "torch.Tensor | None"]


def run_rounds(
    shard,
    visit: Visit,
    *,
    fetch: torch.Tensor | None = None,
    push_into: torch.Tensor | None = None,
    lookahead: int = 1,
    phase: str = "forward",
    what: str = "exchange",
) -> None:
    """Visit every source partition once, local first, then ``q = r-1, r-2, ...``.

    ``fetch``: a node tensor whose rows each peer needs; ``visit(q, block)`` then gets
    ``q``'s halo rows of it (the local block gets ``fetch`` itself), with ``lookahead``
    rounds posted ahead (1 for SAR; N-1 fetches everything at once, as domain parallel).
    ``push_into``: if given, what ``visit`` returns for ``q`` (gradient rows for ``q``'s
    halo) is sent back to ``q``, and what peers return for our rows is summed into it.
    """
    n, r = shard.world_size, shard.rank
    tail = lambda t: tuple(t.shape[1:])  # noqa: E731

    def post_fetch(k: int):
        p, q = (r + k) % n, (r - k) % n
        works, buf = [], None
        rows = shard.send_index[p]
        if rows.numel():
            send = fetch[rows].contiguous()
            works.append(dist.isend(send, p, tag=TAG_FEATURES))
            stats.sent[phase] += send.numel() * send.element_size()
        if shard.blocks[q].num_src:
            buf = live.alloc((shard.blocks[q].num_src, *tail(fetch)), fetch.dtype)
            works.append(dist.irecv(buf, q, tag=TAG_FEATURES))
            stats.received[phase] += buf.numel() * buf.element_size()
        return p, q, buf, works

    def post_push(k: int, grad_rows: torch.Tensor | None):
        p, q = (r + k) % n, (r - k) % n
        works, buf = [], None
        if shard.blocks[q].num_src:
            send = grad_rows.contiguous()
            works.append(dist.isend(send, q, tag=TAG_GRADS))
            stats.sent[phase] += send.numel() * send.element_size()
        if shard.send_index[p].numel():
            buf = torch.empty((shard.send_index[p].numel(), *tail(push_into)), dtype=push_into.dtype)
            works.append(dist.irecv(buf, p, tag=TAG_GRADS))
            stats.received[phase] += buf.numel() * buf.element_size()
        return p, q, buf, works

    def finish_push(posted) -> None:
        p, q, buf, works = posted
        _wait(works, f"{what}: gradients to worker {q} / from worker {p}")
        if buf is not None:
            push_into.index_add_(0, shard.send_index[p], buf)

    pending = deque()
    if fetch is not None:
        pending.extend(post_fetch(k) for k in range(1, min(lookahead, n - 1) + 1))
    local = visit(r, fetch)
    if push_into is not None and local is not None:
        push_into += local
    in_flight = None
    for k in range(1, n):
        if fetch is not None:
            p, q, buf, works = pending.popleft()
            _wait(works, f"{what}: features to worker {p} / from worker {q}")
            del works
            if buf is None:  # nothing to receive from q: an empty block keeps kernels uniform
                buf = fetch.new_empty((0, *tail(fetch)))
            if k + lookahead < n:
                pending.append(post_fetch(k + lookahead))
        else:
            q, buf = (r - k) % n, None
        out = visit(q, buf)
        del buf  # the block is freed here unless visit kept it (stash)
        if push_into is not None:
            posted = post_push(k, out)
            del out
            if in_flight is not None:
                finish_push(in_flight)
            in_flight = posted
    if in_flight is not None:
        finish_push(in_flight)


# -- collectives users call -------------------------------------------------------------------
def global_sum(t: torch.Tensor, phase: str | None = None) -> torch.Tensor:
    """All-reduce (SUM) of ``t`` across workers; returns a new tensor (``t`` is untouched).
    With a ``phase`` the bytes are counted in :data:`stats` under it."""
    out = t.detach().clone()
    if dist.is_initialized() and dist.get_world_size() > 1 and not _offline:
        if phase is not None:
            stats.sent[phase] += out.numel() * out.element_size()
            stats.received[phase] += out.numel() * out.element_size()
        work = dist.all_reduce(out, async_op=True)
        _wait([work], "global_sum")
    return out


_offline = False


def is_offline() -> bool:
    """Inside :func:`offline`: code that would check something across workers skips it."""
    return _offline


@contextmanager
def offline():
    """Within this block :func:`global_sum` is the identity on every worker: for running a
    program on one worker alone (the planner's probe) without waiting for the others."""
    global _offline
    before, _offline = _offline, True
    try:
        yield
    finally:
        _offline = before


def global_max(t: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum of ``t`` across workers (all-reduce MAX); returns a new tensor."""
    out = t.detach().clone()
    if dist.is_initialized() and dist.get_world_size() > 1 and not _offline:
        _wait([dist.all_reduce(out, op=dist.ReduceOp.MAX, async_op=True)], "global_max")
    return out


def sync_gradients(model: torch.nn.Module) -> None:
    """All-reduce (SUM) every parameter's ``.grad`` so each worker holds the global gradient.

    Parameters without a gradient on this worker count as zero, so every worker joins
    every all-reduce in the same order.
    """
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    stats.sent["allreduce"] += flat.numel() * flat.element_size()
    _wait([dist.all_reduce(flat, async_op=True)], "sync_gradients")
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
