"""A fresh namespace of torchrun's store for every start of the workers, so that a job
restarted by ``torchrun --max-restarts K`` meets again by itself.

Since torch 2.5, torchrun's agent hosts the TCPStore its workers meet in
(``TORCHELASTIC_USE_AGENT_STORE=True``; ``--standalone``, static and c10d rendezvous
alike), and it keeps that store, with every key in it, when it restarts the workers. A
restarted worker then reads what the previous, killed workers wrote: gloo's full-mesh
addresses (it connects to a dead port: "Connection refused", ``connectFullMesh failed``,
or a hang until the timeout), and :mod:`sarcompile.dist.failure`'s published failure
(the new workers would stop at once for the old one's death). torch prefixes nothing per
restart, and ``TORCHELASTIC_RESTART_COUNT`` cannot serve as the prefix: each agent counts
its own restarts, and under c10d an agent whose workers were still healthy when another
machine's failed restarts them without counting (pytorch/pytorch#135712, #108158).

So the workers agree on a **generation** through the store itself, under
:data:`PREFIX`, and meet under ``sarcompile/generation/G/`` from then on:

* every worker but rank 0 takes a ticket (a counter only ever incremented, so no earlier
  worker held the same one) and waits for the answer to it;
* rank 0 takes the next generation ``G`` (another such counter) and answers every ticket
  not answered yet with ``G``, until ``world_size - 1`` workers have confirmed ``G``.

A ticket left by a worker of an earlier start that died before its answer is answered too,
and never confirmed: rank 0 waits for the workers that are alive. When the agent restarts
the workers, every worker of the previous start is gone (each agent stops its own before it
meets the others again), so only this start's workers confirm ``G``. Nothing is assumed
about torchrun's counters or the rendezvous' internals.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch.distributed as dist

from sarcompile.errors import CommError

__all__ = ["PREFIX", "agent_store", "generation_store", "uses_agent_store"]

PREFIX = "sarcompile/generation/"
_GENERATION, _TICKETS, _ANSWERED = PREFIX + "last", PREFIX + "tickets", PREFIX + "answered"
POLL_S = 0.01  # rank 0's look at the tickets while it waits for the others


def uses_agent_store() -> bool:
    """Whether torchrun's agent hosts the store at ``MASTER_ADDR:MASTER_PORT`` and keeps it
    across restarts (unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: then worker 0 hosts a
    new one each time, as torch did before 2.5)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)


def agent_store(timeout_s: float) -> dist.Store:
    """A client of the agent's store (see :func:`uses_agent_store`), as ``init_process_group``
    would connect to it."""
    return dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]),
        is_master=False, timeout=timedelta(seconds=timeout_s),
    )


def generation_store(store: dist.Store, rank: int, world_size: int, timeout_s: float) -> tuple[dist.Store, int]:
    """This start's namespace of ``store``, agreed by all ``world_size`` workers, and its
    generation (1 for the first start of a job, then one more per restart). Every worker
    calls it once, before anything else uses ``store``. A :class:`CommError` when the
    others do not all arrive within ``timeout_s`` seconds (a worker that died starting)."""
    if rank == 0:
        generation = _lead(store, world_size, timeout_s)
    else:
        ticket = store.add(_TICKETS, 1)
        try:
            generation = int(store.get(f"{PREFIX}answer/{ticket}"))  # waits up to the store's timeout
        except dist.DistStoreError:
            raise CommError(
                f"worker 0 did not start within {timeout_s:.0f}s (the others meet through it when the job starts "
                "or restarts): see its error, or raise SARCOMPILE_TIMEOUT if it is just slow to start"
            ) from None
        store.add(_confirmed(generation), 1)
    return dist.PrefixStore(f"{PREFIX}{generation}/", store), generation


def _lead(store: dist.Store, world_size: int, timeout_s: float) -> int:
    """Rank 0's part: the next generation, given to every ticket until the others confirm it."""
    generation = store.add(_GENERATION, 1)
    answered = int(store.get(_ANSWERED)) if store.check([_ANSWERED]) else 0  # by earlier starts' rank 0
    deadline = time.monotonic() + timeout_s
    while True:
        tickets = store.add(_TICKETS, 0)
        for ticket in range(answered + 1, tickets + 1):
            store.set(f"{PREFIX}answer/{ticket}", str(generation))
        answered = tickets
        if store.add(_confirmed(generation), 0) >= world_size - 1:
            break
        if time.monotonic() > deadline:
            missing = world_size - 1 - store.add(_confirmed(generation), 0)
            raise CommError(
                f"{missing} of the other {world_size - 1} workers did not start within {timeout_s:.0f}s: see their "
                "errors, or raise SARCOMPILE_TIMEOUT if they are just slow to start"
            )
        time.sleep(POLL_S)
    store.set(_ANSWERED, str(answered))
    return generation


def _confirmed(generation: int) -> str:
    return f"{PREFIX}{generation}/confirmed"
