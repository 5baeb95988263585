"""A worker's watchdog: one worker's error ends every worker within seconds, all naming it.

Without this, a worker that fails on its own (a bad part file, an unwritable log, a
checkpoint error) simply stops, and the others sit in their next collective until
``SARCOMPILE_TIMEOUT`` (300 s) runs out, then blame "a peer". Here every worker
started by :func:`sarcompile.init` on more than one worker runs a :class:`Watchdog`, a
daemon thread that talks to the key-value store the launcher's rendezvous created (torchrun's
TCPStore; a FileStore or HashStore works the same):

* **A failure is published.** The failing worker writes one record,
  ``{"rank": R, "by": R, "kind": "error", "message": ...}``, under
  ``sarcompile/failure/record`` (first writer wins, so every worker reads the same one),
  waits up to :data:`ACK_WAIT_S` for the others to acknowledge it, and exits first, with
  :data:`EXIT_FAILED`. Every other watchdog polls that key every :data:`POLL_S` seconds
  (one cheap counter read on a thread of its own: nothing is added to a training step),
  prints ``[rank S] error: rank R failed: ...``, acknowledges, waits until R has exited
  and exits :data:`EXIT_LAG_S` later with :data:`EXIT_PEER_FAILED`, whatever its main
  thread is blocked in. torchrun names the earliest failure as the root cause: rank R.
* **A silent worker is named the same way by all.** Every watchdog bumps its rank's
  heartbeat counter (``sarcompile/failure/beat/R``) every :data:`BEAT_S` seconds. A
  worker whose exchange fails (a peer went away, or did not answer within
  ``SARCOMPILE_TIMEOUT``) watches the counters for :data:`BLAME_WINDOW_S` seconds; the
  ranks whose counter stood still (killed, stopped, their host gone) are blamed in one
  published record, ``kind: "lost"``, which every survivor then prints. Healthy but
  slow workers are never killed by this: it runs only once a wait has already failed.
* **A stopped worker is noticed without a failed wait.** Each watchdog also watches the
  next rank's counter (a ring: one store read a second each). A counter that stands still
  for ``SARCOMPILE_STALL_TIMEOUT`` seconds (default :data:`STALL_S`) belongs to a process
  that is not running at all -- stopped (SIGSTOP, a debugger), frozen, or cut off -- since
  a slow worker's watchdog thread still beats: its watcher publishes it (``kind: "lost"``)
  and every worker exits, instead of waiting out ``SARCOMPILE_TIMEOUT`` (300 s). A worker
  that finished (its watchdog stopped by :func:`sarcompile.shutdown`) says so first and
  is not watched.
* **The launcher's death ends the workers.** Under torchrun each worker asks Linux for
  SIGTERM when its parent (the torchrun agent) dies (``prctl(PR_SET_PDEATHSIG)``), and the
  watchdog also exits when its parent process changes (other systems, or a death
  between the fork and the ``prctl``).
* **Ctrl-C ends the workers in seconds.** torchrun forwards SIGINT to its workers. The
  main thread's ``KeyboardInterrupt`` exits :data:`EXIT_INTERRUPTED` at once; if the main
  thread is blocked in a collective and cannot raise it, the watchdog (woken by the
  signal through :func:`signal.set_wakeup_fd`) exits for it after :data:`INTERRUPT_GRACE_S`.
* **SIGTERM is answered, not just suffered.** torchrun sends it to a host's other workers
  the moment one of them exits with an error, and a scheduler sends it to stop a job. By
  default it would kill the worker mid-sentence: one that was still agreeing with its
  peers on why its own wait failed (after a cut link every store call waits its own
  timeout) would die without a word. A listener thread of its own (it never touches the
  store, so nothing can hold it up) prints that pending error, or that the worker was
  stopped by SIGTERM, publishes the latter for the others within :data:`ALONE_PUBLISH_S`,
  and exits :data:`EXIT_TERMINATED` (or the pending error's code) at once. A worker whose
  wait failed because a peer went away first looks for that peer's published cause for
  :data:`CAUSE_READ_S` and prints it instead, as the others do (under load, torchrun's
  SIGTERM can come before the watchdog's next look at the store); so does one stopped
  while computing, before it would say it was stopped alone.

A failing worker leaves with ``os._exit`` after flushing its output: no shutdown barrier
to wait in, and no gloo tear-down with peers mid-exchange (which can abort the process).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from sarcompile.dist.failure_protocol import (
    ACK_WAIT_S, ACKS, ALONE_PUBLISH_S, BEAT_S, BLAME_WINDOW_S, CAUSE_READ_S, EXIT_AGENT_GONE, EXIT_INTERRUPTED,
    EXIT_LAG_S, EXIT_PEER_FAILED, EXIT_PEER_LOST, EXIT_TERMINATED, EXITING, INTERRUPT_GRACE_S, POLL_S, PUBLISHED,
    RECORD, STALL_CHECK_S, STALL_S, _beat_key, _done_key, _say, describe,
)

__all__ = ["Watchdog"]


def _flush_and_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not keep us alive
            pass
    os._exit(code)


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s result, or None where it raised or had not returned within ``seconds``:
    a store behind a cut link makes each call wait its own timeout, and a worker on its way
    out must not (the call goes on in a daemon thread, which the exit ends)."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(call())
        except Exception:  # noqa: BLE001 - a store that went away: nothing to read or tell
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return result[0] if result else None


def _leave_it_to_the_listener(signum: int, frame: Any) -> None:
    """SIGTERM's handler while a watchdog runs: the signal has already woken its listener
    thread (through the wakeup fd), which exits the process."""



class Watchdog:
    """The failure protocol of one worker (see the module docstring).

    ``store``: the store every rank shares (``_get_default_store()`` after
    ``init_process_group``). ``exit``: how to leave (``os._exit`` after a flush; tests
    may pass their own). ``parent``: the parent pid to watch (None: do not watch).
    """

    def __init__(self, store, rank: int, world_size: int, *, parent: int | None = None,
                 exit: Callable[[int], None] = _flush_and_exit, stall_s: float = STALL_S):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.parent = parent
        self.stall_s = stall_s
        self._next = (rank + 1) % world_size  # the rank whose heartbeat this one watches
        self._next_beats: int | None = None
        self._next_since = time.monotonic()
        self._exit = exit
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._seen = False  # a peer's record was printed and acknowledged
        self.failing = False  # this worker is in its own failure path: its code wins
        # The main thread's own error while report() agrees on it: (message, exit code).
        self.pending: tuple[str, int] | None = None
        self.said = False  # this worker's own failure line was printed
        self.signalled_at: float | None = None
        self._thread: threading.Thread | None = None
        self._listener: threading.Thread | None = None
        self._wake_r = self._wake_w = None
        self._old_wakeup = -1
        self._old_sigterm: Any = None

    # -- the thread ----------------------------------------------------------------------------
    def start(self) -> "Watchdog":
        self._install_wakeup()
        self._beat()
        self._thread = threading.Thread(target=self._run, name="sarcompile-watchdog", daemon=True)
        self._thread.start()
        if self._wake_r is not None:
            self._listener = threading.Thread(target=self._listen, name="sarcompile-signals", daemon=True)
            self._listener.start()
        return self

    def stop(self) -> None:
        main = threading.current_thread() is threading.main_thread()
        if main and self._old_sigterm is not None:
            # Before the listener goes: no moment in which SIGTERM is silently ignored.
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None
        _within(ALONE_PUBLISH_S, lambda: self.store.add(_done_key(self.rank), 1))  # not stalled: finished
        self._stop.set()
        for thread in (self._thread, self._listener):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=2 * POLL_S + 1)
        if self._wake_w is not None and main:
            try:
                signal.set_wakeup_fd(self._old_wakeup)
            except (ValueError, OSError):
                pass
            self._wake_w.close()
            self._wake_r.close()
            self._wake_w = self._wake_r = None

    def _install_wakeup(self) -> None:
        """Be woken by a signal even while the main thread is blocked in C++ (only from
        the main thread, and only if nobody else uses the wakeup fd)."""
        if threading.current_thread() is not threading.main_thread():
            return
        r, w = socket.socketpair()
        r.setblocking(False)
        w.setblocking(False)
        try:
            old = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):
            r.close()
            w.close()
            return
        if old != -1:  # someone else (an event loop) owns it: leave it to them
            signal.set_wakeup_fd(old)
            r.close()
            w.close()
            return
        self._wake_r, self._wake_w, self._old_wakeup = r, w, old
        # A Python handler, so that SIGTERM reaches the wakeup fd instead of killing the
        # process; the listener thread acts on it. A handler somebody else set is theirs.
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._old_sigterm = signal.signal(signal.SIGTERM, _leave_it_to_the_listener)

    def _run(self) -> None:
        next_beat = time.monotonic() + BEAT_S
        next_look = time.monotonic() + STALL_CHECK_S
        while not self._stop.is_set():
            self._stop.wait(POLL_S)
            if self._stop.is_set():
                return
            now = time.monotonic()
            if now >= next_beat:
                self._beat()
                next_beat = now + BEAT_S
            if now >= next_look and self.world_size > 1:
                self._watch_next(now)
                next_look = now + STALL_CHECK_S
            try:
                record = self.record()
            except Exception:  # noqa: BLE001 - a store that went away: the parent check decides
                record = None
            if record is not None and record.get("by") != self.rank:
                self.follow(record)
            if self.parent is not None and os.getppid() != self.parent:
                self._agent_gone()
            if self.signalled_at is not None and time.monotonic() - self.signalled_at > INTERRUPT_GRACE_S:
                self._interrupted_for_main()

    def _listen(self) -> None:
        """The signals' thread: wakes on each signal the process gets, whatever the main
        thread and the watchdog's store calls are blocked in."""
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self._wake_r], [], [], POLL_S)
                got = self._wake_r.recv(64) if ready else b""
            except (OSError, ValueError):  # closed by stop()
                return
            if signal.SIGINT in got and self.signalled_at is None:
                self.signalled_at = time.monotonic()  # the watchdog's loop gives main its grace
            if signal.SIGTERM in got:
                self._terminated()

    def _watch_next(self, now: float) -> None:
        """Read the next rank's heartbeat; publish it as lost once it stood still for
        ``stall_s`` (unless it finished, or a failure is already being handled)."""
        try:
            beats = self.store.add(_beat_key(self._next), 0)
            if beats != self._next_beats:
                self._next_beats, self._next_since = beats, now
                return
            if now - self._next_since < self.stall_s or self.store.add(_done_key(self._next), 0) > 0:
                return
        except Exception:  # noqa: BLE001 - a store that went away: the waits decide
            return
        with self._lock:
            if self.failing or self._seen:
                return
            self.failing = True
        record = {"kind": "lost", "rank": self._next, "by": self.rank, "silent": [self._next],
                  "window": self.stall_s,
                  "message": "its process is not running (stopped, frozen or cut off: even its watchdog thread is "
                             "silent); SARCOMPILE_STALL_TIMEOUT sets how long a heartbeat may stand still"}
        standing = self.publish(record)
        if standing.get("by") != self.rank:
            self.failing = False
            self.follow(standing)
            return
        self.say(describe(standing))
        self.leave(standing, EXIT_PEER_LOST)

    def _beat(self) -> None:
        try:
            self.store.add(_beat_key(self.rank), 1)
        except Exception:  # noqa: BLE001
            pass

    # -- the store --------------------------------------------------------------------------------
    def record(self) -> dict[str, Any] | None:
        """The published failure, or None."""
        if self.store.add(PUBLISHED, 0) <= 0:
            return None
        try:
            return json.loads(self.store.get(RECORD).decode())
        except (ValueError, UnicodeDecodeError):
            return {"rank": None, "by": None, "kind": "error", "message": "unreadable failure record"}

    def publish(self, record: dict[str, Any]) -> dict[str, Any]:
        """Publish ``record`` unless one is already there; returns the one that stands."""
        text = json.dumps(record)
        try:
            got = self.store.compare_set(RECORD, "", text)
            self.store.add(PUBLISHED, 1)
            return json.loads(got.decode() if isinstance(got, bytes) else got)
        except Exception:  # noqa: BLE001 - no store: nobody else can hear; still ours
            return record

    def _wait_acks(self, expected: int) -> None:
        deadline = time.monotonic() + ACK_WAIT_S
        while time.monotonic() < deadline:
            try:
                if self.store.add(ACKS, 0) >= expected:
                    return
            except Exception:  # noqa: BLE001
                return
            time.sleep(0.05)

    # -- the ways out -------------------------------------------------------------------------------
    def follow(self, record: dict[str, Any]) -> None:
        """Another worker failed: print it, acknowledge, and (unless this worker is failing
        on its own) exit once the failing worker has, :data:`EXIT_LAG_S` after it."""
        with self._lock:
            if self._seen:
                if not self.failing and threading.current_thread() is not self._thread:
                    self._park()
                return
            self._seen = True
        _say(self.rank, describe(record))
        try:
            self.store.add(ACKS, 1)
        except Exception:  # noqa: BLE001
            pass
        if self.failing:
            return
        if self.signalled_at is not None:
            self._exit(EXIT_INTERRUPTED)
            return
        deadline = time.monotonic() + ACK_WAIT_S + 2 * POLL_S
        while time.monotonic() < deadline:
            try:
                if self.store.add(EXITING, 0) > 0:
                    break
            except Exception:  # noqa: BLE001
                break
            time.sleep(0.05)
        time.sleep(EXIT_LAG_S)
        self._exit(EXIT_PEER_FAILED)

    def _park(self) -> None:
        """The other thread is already leaving: wait for it."""
        while True:
            time.sleep(1)

    def leave(self, record: dict[str, Any], code: int, acks: bool = True) -> None:
        """Publish this worker's failure, let the others see it, mark it and exit ``code``."""
        self.failing = True
        standing = self.publish(record)
        if standing.get("by") != self.rank and acks:  # (an interrupt: every worker got one)
            self.follow(standing)  # print theirs too; this worker still exits with its own code
        if acks:
            expected = self.world_size - 1 - len(record.get("silent", []))
            self._wait_acks(expected)
        try:
            self.store.add(EXITING, 1)
        except Exception:  # noqa: BLE001
            pass
        self._exit(code)

    def _terminated(self) -> None:
        """SIGTERM: leave now, saying why (see the module docstring)."""
        if self.parent is not None and os.getppid() != self.parent:
            self._agent_gone()  # PR_SET_PDEATHSIG's signal
            return
        if self._seen:  # a peer's failure is on screen: that is the cause
            self._exit(EXIT_PEER_FAILED)
            return
        if self.pending is not None:  # the main thread is still agreeing on its own error
            message, code = self.pending
            if code == EXIT_PEER_LOST and not self.said and self._peer_said_why():
                return  # its wait failed because of a peer that already said why
            if not self.said:
                self.say(f"{message} (stopped by SIGTERM before the other workers could be reached to agree "
                         "on the cause)")
            self._exit(code)
            return
        if self.said:  # this worker's own line is on screen
            self._exit(EXIT_TERMINATED)
            return
        # torchrun's SIGTERM to the others follows a worker's failure at once, and can come
        # before the watchdog's next look at the store: name the cause that worker published.
        if self._peer_said_why():
            return
        self._stop_alone("terminated", "SIGTERM", "stopped by SIGTERM (torchrun sends it to a host's other workers "
                         "once one of them has failed: that worker's error is the cause)", EXIT_TERMINATED)

    def _peer_said_why(self) -> bool:
        """Print the failure a peer published, as far as the store answers within
        :data:`CAUSE_READ_S`, and leave (:data:`EXIT_PEER_FAILED`); False if there is none."""
        cause = self._published_cause()
        if cause is None:
            return False
        with self._lock:
            first, self._seen = not self._seen, True
        if first:
            _say(self.rank, describe(cause))
        self._exit(EXIT_PEER_FAILED)
        return True

    def _published_cause(self) -> dict[str, Any] | None:
        """A peer's published failure, as far as the store answers within :data:`CAUSE_READ_S`."""
        record = _within(CAUSE_READ_S, self.record)
        return record if record is not None and record.get("by") != self.rank else None

    def say(self, text: str) -> None:
        """Print this worker's failure line."""
        self.said = True
        _say(self.rank, text)

    def _agent_gone(self) -> None:
        message = f"parent process {self.parent} exited; this worker stops too"
        self._stop_alone("agent", message, describe({"kind": "agent", "rank": self.rank, "message": message}),
                         EXIT_AGENT_GONE)

    def _interrupted_for_main(self) -> None:
        self._stop_alone("interrupted", "SIGINT", "interrupted (SIGINT); stopping", EXIT_INTERRUPTED)

    def _stop_alone(self, kind: str, message: str, said: str, code: int) -> None:
        """Leave for a reason of this worker's own (no acknowledgements awaited), unless it
        is already leaving."""
        with self._lock:
            if self.failing:
                return
            self.failing = True
        self.say(said)
        record = {"kind": kind, "rank": self.rank, "by": self.rank, "message": message}
        _within(ALONE_PUBLISH_S, lambda: self.publish(record))
        self._exit(code)

    # -- blame ----------------------------------------------------------------------------------------
    def silent_ranks(self, window: float = BLAME_WINDOW_S) -> tuple[list[int], dict[str, Any] | None]:
        """Watch every peer's heartbeat for ``window`` seconds; returns the ranks whose
        counter stood still, or (early) a failure record someone published meanwhile."""
        peers = [q for q in range(self.world_size) if q != self.rank]
        try:
            first = {q: self.store.add(_beat_key(q), 0) for q in peers}
        except Exception:  # noqa: BLE001
            return [], None
        still = set(peers)
        deadline = time.monotonic() + window
        # The whole window even once every peer has beaten: a failing peer may still be
        # about to publish its own record, which is the better explanation.
        while time.monotonic() < deadline:
            time.sleep(POLL_S)
            try:
                record = self.record()
                if record is not None and record.get("by") != self.rank:
                    return [], record
                for q in list(still):
                    if self.store.add(_beat_key(q), 0) != first[q]:
                        still.discard(q)
            except Exception:  # noqa: BLE001
                break
        return sorted(still), None
