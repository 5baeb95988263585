"""What this worker's communication costs: bytes per phase, seconds blocked per kind of
wait (:data:`stats`, a :class:`CommStats`), and the remote blocks alive at once
(:data:`live`, a :class:`LiveBlocks`).

The exchange rounds (:mod:`sarcompile.runtime.rounds`) and the collectives
(:mod:`sarcompile.dist.collectives`) count into them; training reads them per epoch.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from dataclasses import dataclass, field

import torch

__all__ = ["CommStats", "LiveBlocks", "TIME_LEDGER", "live", "stats"]


@dataclass
class CommStats:
    """Bytes sent and received by this worker, per phase (forward, backward, allreduce),
    and the seconds it spent blocked on the others, per kind of wait: ``exchange`` (halo
    rows and their gradients, while nothing else is left to compute) and ``allreduce``
    (collectives: gradients, loss, counts; the time the slowest worker takes to get there
    included)."""

    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    received: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    waited: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def reset(self) -> None:
        self.sent.clear()
        self.received.clear()
        self.waited.clear()

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {"sent": dict(self.sent), "received": dict(self.received)}

    def time_ledger(self, step_s: float, optimizer_s: float) -> dict[str, float]:
        """A training step of ``step_s`` seconds, of which the optimizer took ``optimizer_s``,
        split as :data:`TIME_LEDGER` says by the waits counted since :meth:`reset`."""
        wait, reduce = self.waited.get("exchange", 0.0), self.waited.get("allreduce", 0.0)
        return {"compute": step_s - wait - reduce - optimizer_s, "exchange_wait": wait, "allreduce": reduce,
                "optimizer": optimizer_s}


# The time ledger of a training step (CommStats.time_ledger), in seconds: computing, blocked
# on the halo exchange, in all-reduces (the slowest worker's lateness included), and in the
# optimizer's step. They add up to the step's wall time.
TIME_LEDGER = ("compute", "exchange_wait", "allreduce", "optimizer")


class LiveBlocks:
    """Counts remote blocks that are still referenced, via weak-reference finalizers."""

    def __init__(self) -> None:
        self.count = self.peak = 0
        self.bytes = self.peak_bytes = 0

    def track(self, buf: torch.Tensor) -> torch.Tensor:
        """Count ``buf``, a block received, while it is alive; returns it."""
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
