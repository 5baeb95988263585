"""The failure protocol's terms, shared by the watchdog thread (:mod:`.watchdog`) and the
main thread's report (:mod:`.failure`): exit codes, timings, the store keys, and the one
line a published failure record prints as.

Exit codes of a worker (``python -m sarcompile.train``; the same through
:func:`sarcompile.dist.failure.report` in any script): 0 success; :data:`EXIT_FAILED` (1) this worker's own
error: it is the root cause; 2 a bad command line (argparse); :data:`EXIT_PEER_FAILED`
(3) stopped because another worker failed first; :data:`EXIT_PEER_LOST` (4) a peer
went away or stopped answering (this worker named it); :data:`EXIT_AGENT_GONE` (5) the
launcher that started this worker is gone; :data:`EXIT_INTERRUPTED` (130) SIGINT;
:data:`EXIT_TERMINATED` (143) SIGTERM.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = [
    "EXIT_AGENT_GONE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_PEER_FAILED",
    "EXIT_PEER_LOST",
    "EXIT_TERMINATED",
    "describe",
]

EXIT_FAILED = 1
EXIT_PEER_FAILED = 3
EXIT_PEER_LOST = 4
EXIT_AGENT_GONE = 5
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, what a shell reports for a worker the signal killed

POLL_S = 0.25  # how often a watchdog looks for a published failure
BEAT_S = 0.5  # how often it bumps its heartbeat counter
STALL_S = 20.0  # how long the next rank's heartbeat may stand still (SARCOMPILE_STALL_TIMEOUT)
STALL_CHECK_S = 1.0  # how often a watchdog reads the next rank's heartbeat
BLAME_WINDOW_S = 3.0  # how long a worker whose exchange failed watches the heartbeats
ACK_WAIT_S = 3.0  # how long a failing worker waits for the others to print its failure
EXIT_LAG_S = 1.0  # how long after the failing worker the others exit (torchrun polls every 0.1 s)
INTERRUPT_GRACE_S = 1.0  # how long the watchdog lets the main thread handle a SIGINT itself
ALONE_PUBLISH_S = 1.0  # how long a worker leaving on its own (SIGTERM, SIGINT, agent gone) tries to tell the others
CAUSE_READ_S = 0.5  # how long a SIGTERMed worker whose wait failed looks for a peer's published cause
# The most a failing worker spends agreeing with the others before it exits anyway: when
# the store itself is out of reach (a cut link), each store call would wait its own timeout.
LEAVE_LIMIT_S = BLAME_WINDOW_S + ACK_WAIT_S + EXIT_LAG_S + 2.0

PREFIX = "sarcompile/failure/"
# RECORD holds the failure (JSON); the others are counters (``add``: every store has it,
# where ``check`` is missing from torch 2.2's Python bindings). PUBLISHED > 0 once RECORD is set.
RECORD, PUBLISHED = PREFIX + "record", PREFIX + "published"
ACKS, EXITING = PREFIX + "acks", PREFIX + "exiting"


def _beat_key(rank: int) -> str:
    return f"{PREFIX}beat/{rank}"


def _done_key(rank: int) -> str:
    return f"{PREFIX}done/{rank}"


def describe(record: dict[str, Any]) -> str:
    """One line for a published failure record, the same on every worker."""
    kind, rank, by, message = record.get("kind"), record.get("rank"), record.get("by"), record.get("message", "")
    if kind == "lost":
        if rank is None:
            return f"rank {by} lost contact with its peers, though all still show signs of life: {message}"
        window = record.get("window", BLAME_WINDOW_S)
        return f"rank {rank} stopped answering (no heartbeat for {window:.0f}s; noticed by rank {by}): {message}"
    if kind == "interrupted":
        return f"rank {rank} was interrupted ({message})"
    if kind == "terminated":
        return f"rank {rank} was stopped by {message}"
    if kind == "agent":
        return f"rank {rank}'s launcher (the torchrun agent) is gone: {message}"
    return f"rank {rank} failed: {message}"


def _say(rank: int, text: str) -> None:
    try:
        # One write, newline included: print() writes the end separately, and on an
        # unbuffered stream another rank's line can land between the two.
        sys.stderr.write(f"[rank {rank}] error: {text}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
