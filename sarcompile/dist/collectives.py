"""Collectives over all workers: :func:`global_sum`, :func:`global_max` and
:func:`sync_gradients`, and the :func:`offline` mode that switches them off.

``offline()`` says "this process runs alone for now" (the planner's probe runs a program
on a made-up one-worker graph): the collectives are then the identity, and code that
would check something across workers (:func:`is_offline`) skips it. It lives here, with
what it switches off, so compile-time code reads it from below the runtime.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

from sarcompile.dist.process_group import wait
from sarcompile.dist.traffic import stats
from sarcompile.graph.tables import table_type

__all__ = ["global_max", "global_sum", "is_offline", "offline", "sync_gradients"]


def global_sum(t: torch.Tensor, phase: str | None = None) -> torch.Tensor:
    """All-reduce (SUM) of ``t`` across workers; returns a new tensor (``t`` is untouched).
    With a ``phase`` the bytes are counted in :data:`~sarcompile.dist.traffic.stats` under it.

    Example:

    >>> sc.global_sum(torch.tensor([3., 1.]))   # on N workers: the elementwise sum over them
    tensor([3., 1.])
    """
    out = t.detach().clone()
    if dist.is_initialized() and dist.get_world_size() > 1 and not _offline:
        if phase is not None:
            stats.sent[phase] += out.numel() * out.element_size()
            stats.received[phase] += out.numel() * out.element_size()
        work = dist.all_reduce(out, async_op=True)
        wait([work], "global_sum", "allreduce")
    return out


_offline = False


def is_offline() -> bool:
    """Inside :func:`offline`: code that would check something across workers skips it."""
    return _offline


@contextmanager
def offline():
    """Within this block :func:`global_sum` and :func:`global_max` are the identity on every
    worker: for running a program on one worker alone (the planner's probe) without
    waiting for the others."""
    global _offline
    before, _offline = _offline, True
    try:
        yield
    finally:
        _offline = before


def global_max(t: torch.Tensor, phase: str | None = None) -> torch.Tensor:
    """Elementwise maximum of ``t`` across workers (all-reduce MAX); returns a new tensor.
    With a ``phase`` the bytes are counted in :data:`~sarcompile.dist.traffic.stats` under it.

    Example:

    >>> sc.global_max(torch.tensor(7))   # on N workers: the largest value over them
    tensor(7)
    """
    out = t.detach().clone()
    if dist.is_initialized() and dist.get_world_size() > 1 and not _offline:
        if phase is not None:
            stats.sent[phase] += out.numel() * out.element_size()
            stats.received[phase] += out.numel() * out.element_size()
        wait([dist.all_reduce(out, op=dist.ReduceOp.MAX, async_op=True)], "global_max", "allreduce")
    return out


def sync_gradients(model: torch.nn.Module) -> None:
    """All-reduce (SUM) every parameter's ``.grad`` so each worker holds the global gradient;
    node tables, whose rows each worker owns alone, are left as they are.

    Parameters without a gradient on this worker count as zero, so every worker joins
    every all-reduce in the same order.

    Example:

    >>> lin = torch.nn.Linear(2, 1)
    >>> lin(torch.ones(1, 2)).sum().backward()
    >>> sc.sync_gradients(lin)   # on N workers: every .grad summed over them; on one, unchanged
    >>> lin.weight.grad
    tensor([[1., 1.]])
    """
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return
    # A node table's rows live on one worker each (sarcompile.graph.tables): its gradient is whole.
    params = [p for p in model.parameters() if p.requires_grad and table_type(p) is None]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    # counted as the reduced tensor, sent and received once (whatever the algorithm moves)
    stats.sent["allreduce"] += flat.numel() * flat.element_size()
    stats.received["allreduce"] += flat.numel() * flat.element_size()
    wait([dist.all_reduce(flat, async_op=True)], "sync_gradients", "allreduce")
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
