"""The process group: joining it (:func:`init`), leaving it (:func:`shutdown`), and how long
any wait on the other workers may take (:func:`timeout`, :func:`wait`).

:func:`init` joins the group torchrun describes (or a one-worker group without torchrun),
binds gloo to the network interface that routes to ``MASTER_ADDR``
(:mod:`sarcompile.dist.interface`), starts the failure watchdog
(:mod:`sarcompile.dist.failure`) and applies the memory policy
(:mod:`sarcompile.dist.memory`).
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from sarcompile.errors import CommError
from sarcompile.dist import failure
from sarcompile.dist import memory
from sarcompile.dist import relaunch
from sarcompile.dist.interface import choose_interface
from sarcompile.dist.traffic import stats

__all__ = ["init", "shutdown", "stall_timeout", "timeout", "wait"]

_DEFAULT_TIMEOUT_S = 300.0


def timeout() -> float:
    """Seconds any single wait may take (``SARCOMPILE_TIMEOUT``, default 300; a number > 0)."""
    raw = os.environ.get("SARCOMPILE_TIMEOUT")
    if raw is None or not raw.strip():
        return _DEFAULT_TIMEOUT_S
    return _check_timeout(raw, "SARCOMPILE_TIMEOUT")


def stall_timeout() -> float:
    """Seconds a peer's heartbeat may stand still before the job is stopped
    (``SARCOMPILE_STALL_TIMEOUT``, default 20; a number > 0): see :mod:`sarcompile.dist.failure`."""
    raw = os.environ.get("SARCOMPILE_STALL_TIMEOUT")
    if raw is None or not raw.strip():
        return failure.STALL_S
    return _check_timeout(raw, "SARCOMPILE_STALL_TIMEOUT",
                          f"how long a peer's heartbeat may stand still; default {failure.STALL_S:.0f}")


def _check_timeout(raw, name: str,
                   meaning: str = f"how long one wait for a peer worker may take; default {_DEFAULT_TIMEOUT_S:.0f}"
                   ) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a number of seconds > 0 ({meaning}), got {raw!r}")
    return value


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ


def init(backend: str | None = None, timeout_s: float | None = None) -> tuple[int, int]:
    """Join the process group torchrun describes in the environment; returns (rank, world size).

    Without torchrun's variables this starts a one-worker group, so the same script runs
    on one machine with ``python script.py``. gloo on CPU, nccl when CUDA is available.

    On more than one worker it also starts the failure watchdog
    (:mod:`sarcompile.dist.failure`): a worker that fails makes every other one exit
    within seconds, and under torchrun a worker dies with its agent. On any number of
    workers it applies the memory policy: glibc's mmap threshold fixed, so freed tensors
    leave the resident set, and huge pages asked of torch where its first tensor is still
    to come (:func:`~sarcompile.dist.memory.apply_policy`, ``SARCOMPILE_MALLOC``).

    Under ``torchrun --max-restarts K`` the restarted workers meet again by themselves:
    they agree on a namespace of torchrun's store of their own, where nothing the killed
    workers wrote is seen (:mod:`sarcompile.dist.relaunch`).

    Example:

    >>> rank, world_size = sc.init()   # under torchrun: this worker's; here, a one-worker group
    >>> rank, world_size
    (0, 1)
    >>> sc.shutdown()
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    # Before the big allocations: torch's huge pages and glibc's thresholds apply to what comes after.
    memory.apply_policy()
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    limit = timeout() if timeout_s is None else _check_timeout(timeout_s, "timeout_s")
    stall = stall_timeout()
    patience = timedelta(seconds=limit)
    parent = None
    if _under_torchrun():
        parent = os.getppid()
        failure.die_with_parent()  # SIGTERM when the torchrun agent dies, even during rendezvous
    if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        if int(os.environ["WORLD_SIZE"]) > 1:
            choose_interface(backend)
        try:
            if relaunch.uses_agent_store():  # kept across restarts: this start's own namespace of it
                rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
                store, _ = relaunch.generation_store(relaunch.agent_store(limit), rank, world_size, limit)
                dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=patience)
            else:
                dist.init_process_group(backend, timeout=patience)
        except RuntimeError as e:
            store = isinstance(e, (dist.DistNetworkError, dist.DistStoreError))
            if not (store or "connectFullMesh" in str(e)):
                raise
            var = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
            bound = os.environ.get(var)
            what = "the rendezvous store" if store else "the other workers"
            raise CommError(
                f"could not connect to {what} (MASTER_ADDR={os.environ['MASTER_ADDR']}, "
                f"{backend} bound to {f'interface {bound}' if bound else 'the address the hostname resolves to'}): "
                f"{str(e).splitlines()[0][:300]} On several machines, give torchrun an address every machine "
                f"reaches, or set {var} (docs/several-machines.md)."
            ) from None
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=patience)
    # A gloo process that exits with its group still up can abort at random; tear down first.
    atexit.register(shutdown)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if world_size > 1:
        failure.start(dist.distributed_c10d._get_default_store(), rank, world_size, parent=parent,
                      stall_s=stall)
        _hook_excepthook()
    return rank, world_size


def _hook_excepthook() -> None:
    """An uncaught exception in a script that called :func:`init`: show it as usual,
    then tell the other workers (they exit within seconds) instead of waiting for them
    in the shutdown barrier."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        if failure.active() is None or not isinstance(value, BaseException):
            previous(kind, value, tb)
            return
        if not failure.is_consequence(value):  # a failed exchange's traceback tells nothing: report names the culprit
            previous(kind, value, tb)
        failure.report(value, rank=dist.get_rank(), distributed=True, printed=True)

    sys.excepthook = hook


def shutdown() -> None:
    """Tear the process group down, all workers together (safe to call twice).

    A worker that tears down while a peer still talks to it can make gloo abort the peer
    ("terminate called without an active exception"), so all meet at a barrier first.
    The failure watchdog runs until after it, so a peer failing meanwhile still ends this
    worker in seconds.

    Example:

    >>> rank, world_size = sc.init()
    >>> sc.shutdown()   # safe to call again, or without init
    """
    if not (dist.is_available() and dist.is_initialized()):
        failure.stop()
        return
    if dist.get_world_size() > 1:
        try:
            wait([dist.barrier(async_op=True)], "shutdown", "shutdown")
        except CommError:
            pass  # a peer is already gone: nothing left to wait for
    failure.stop()
    dist.destroy_process_group()


def wait(works: list, what: str, kind: str = "exchange") -> float:
    """Wait for posted ``works`` (of torch.distributed), each within :func:`timeout`; the
    time blocked is counted in ``stats.waited[kind]`` (:mod:`sarcompile.dist.traffic`) and
    returned. A peer that does not answer in time, or went away, is a CommError naming ``what``."""
    limit = timedelta(seconds=timeout())
    start = time.perf_counter()
    for w in works:
        try:
            w.wait(limit)
        except RuntimeError as e:  # gloo reports closed peers and timeouts as RuntimeError
            raise CommError(
                f"{what}: a peer worker did not answer within {limit.total_seconds():.0f}s or went away "
                f"({e}). Check the other workers' logs; raise SARCOMPILE_TIMEOUT if they are just slow."
            ) from None
    waited = time.perf_counter() - start
    stats.waited[kind] += waited
    return waited

