"""Agreed failure, as the rest of the package asks for it: this process's watchdog started
and stopped, a worker tied to its launcher, and the error that ends a worker reported.

:func:`start` runs this process's :class:`~sarcompile.dist.watchdog.Watchdog` (the protocol
by which one worker's error ends every worker within seconds, all naming it, is described
there); :func:`report` prints the error that ends this worker, agrees with the others on
the cause, and exits with the code :mod:`.failure_protocol` lists for it.
"""

from __future__ import annotations

import signal
import sys
import threading
import traceback

from sarcompile.errors import CommError, SarcompileError
from sarcompile.dist.failure_protocol import (
    EXIT_FAILED, EXIT_INTERRUPTED, EXIT_PEER_LOST, LEAVE_LIMIT_S, PUBLISHED, STALL_S, describe,
)
from sarcompile.dist.watchdog import Watchdog

__all__ = ["active", "die_with_parent", "report", "start", "stop"]


def die_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


_active: Watchdog | None = None


def active() -> Watchdog | None:
    """This process's watchdog (started by :func:`sarcompile.init`), or None."""
    return _active


def start(store, rank: int, world_size: int, parent: int | None = None, stall_s: float = STALL_S) -> Watchdog:
    """Start this process's watchdog (once)."""
    global _active
    if _active is None:
        _active = Watchdog(store, rank, world_size, parent=parent, stall_s=stall_s).start()
    return _active


def stop() -> None:
    global _active
    if _active is not None:
        _active.stop()
        _active = None


def is_consequence(exc: BaseException) -> bool:
    """An error that says a peer failed, not this worker: a failed exchange, or an
    agreement that another worker reported an error."""
    return isinstance(exc, CommError) or bool(getattr(exc, "peer_failed", False))


def message_of(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (SIGINT)"
    if isinstance(exc, (SarcompileError, ValueError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def report(exc: BaseException, *, rank: int = 0, distributed: bool = False, printed: bool = False) -> int:
    """Handle ``exc``, which ends this worker: print it, and with a watchdog running
    agree with the other workers and exit (never returns then). Returns the exit code
    otherwise (one process: nothing to agree on).

    ``printed``: the error was already shown (a traceback by ``sys.excepthook``)."""
    wd = _active
    if wd is None:
        return _report(exc, rank, distributed, printed)
    # Whatever the store does (out of reach after a cut link, each call waits its own
    # timeout), this worker is gone within LEAVE_LIMIT_S.
    interrupted = isinstance(exc, KeyboardInterrupt) or wd.signalled_at is not None
    code = EXIT_INTERRUPTED if interrupted else EXIT_PEER_LOST if is_consequence(exc) else EXIT_FAILED
    wd.pending = (message_of(exc), code)
    if printed and not is_consequence(exc):
        wd.said = True  # its traceback is on screen

    def give_up() -> None:
        wd.say(f"{message_of(exc)} (the other workers could not be reached to agree on the cause)")
        wd._exit(code)

    limit = threading.Timer(LEAVE_LIMIT_S, give_up)
    limit.daemon = True
    limit.start()
    try:
        return _report(exc, rank, distributed, printed)
    finally:  # reached only with a test's exit, which returns
        limit.cancel()


def _report(exc: BaseException, rank: int, distributed: bool, printed: bool) -> int:
    wd = _active
    known = isinstance(exc, (SarcompileError, ValueError, KeyboardInterrupt))
    prefix = f"[rank {rank}] " if distributed else ""
    interrupted = isinstance(exc, KeyboardInterrupt) or (wd is not None and wd.signalled_at is not None)
    if wd is None:
        if not printed:
            if not known:
                traceback.print_exception(type(exc), exc, exc.__traceback__)
            print(f"{prefix}error: {message_of(exc)}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED if interrupted else EXIT_FAILED
    if interrupted:
        wd.failing = True
        if not printed:
            wd.say("interrupted (SIGINT); stopping")
        wd.leave({"kind": "interrupted", "rank": wd.rank, "by": wd.rank, "message": "SIGINT"},
                 EXIT_INTERRUPTED, acks=False)
        return EXIT_INTERRUPTED  # only with a test's exit
    if not is_consequence(exc):
        wd.failing = True
        if not printed:
            if not known:
                traceback.print_exception(type(exc), exc, exc.__traceback__)
            wd.say(message_of(exc))
        wd.leave({"kind": "error", "rank": wd.rank, "by": wd.rank, "message": message_of(exc)}, EXIT_FAILED)
        return EXIT_FAILED
    # A consequence: somebody else failed. Follow their record if one comes; else name the silent.
    record = wd.record() if _store_ok(wd) else None
    if record is None or record.get("by") == wd.rank:
        silent, record = wd.silent_ranks()
    if record is not None and record.get("by") != wd.rank:
        wd.follow(record)  # exits, unless another thread already is
        wd._park()
    wd.failing = True
    lost = {"kind": "lost", "rank": silent[0] if silent else None, "by": wd.rank, "silent": silent,
            "message": message_of(exc)}
    if len(silent) > 1:
        lost["message"] = f"ranks {', '.join(map(str, silent))} all stopped answering; {lost['message']}"
    standing = wd.publish(lost)
    if standing.get("by") != wd.rank:
        wd.failing = False
        wd.follow(standing)
        wd._park()
    wd.say(describe(standing))
    wd.leave(standing, EXIT_PEER_LOST)
    return EXIT_PEER_LOST


def _store_ok(wd: Watchdog) -> bool:
    try:
        wd.store.add(PUBLISHED, 0)
        return True
    except Exception:  # noqa: BLE001
        return False
