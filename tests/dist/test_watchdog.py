"""A worker's watchdog (sarcompile.dist.watchdog.Watchdog), one process and an in-memory
store: a published failure is first-writer-wins and followed by every other worker, a peer
whose heartbeat stands still is blamed and one that finished is not, SIGTERM names the cause
a peer published, and a store that does not answer holds nobody up. The protocol across
real processes is tested in test_failures.py."""

from __future__ import annotations

import os
import threading
import time

import torch.distributed as dist

from sarcompile.dist import failure_protocol, watchdog


def test_watchdog_on_a_hash_store(capsys):
    """One process, a HashStore: the record is first-writer-wins, a peer's record is
    followed (exit 3 after the lag), and a changed parent exits 5."""
    store = dist.HashStore()
    codes: list[int] = []
    wd = watchdog.Watchdog(store, 0, 2, exit=codes.append)
    first = {"kind": "error", "rank": 1, "by": 1, "message": "boom"}
    assert wd.publish(first) == first
    assert wd.publish({"kind": "error", "rank": 0, "by": 0, "message": "later"}) == first  # the first stands
    store.add(failure_protocol.EXITING, 1)
    t0 = time.monotonic()
    wd.start()
    deadline = time.monotonic() + 10
    while not codes and time.monotonic() < deadline:
        time.sleep(0.05)
    wd.stop()
    assert codes == [failure_protocol.EXIT_PEER_FAILED]
    assert failure_protocol.POLL_S + failure_protocol.EXIT_LAG_S - 0.1 < time.monotonic() - t0 < 5
    assert store.add(failure_protocol.ACKS, 0) == 1
    assert "[rank 0] error: rank 1 failed: boom" in capsys.readouterr().err

    orphan = watchdog.Watchdog(dist.HashStore(), 1, 2, parent=os.getppid() + 100000, exit=codes.append).start()
    deadline = time.monotonic() + 5
    while len(codes) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    orphan.stop()
    assert codes[1:] == [failure_protocol.EXIT_AGENT_GONE]
    assert "rank 1's launcher (the torchrun agent) is gone" in capsys.readouterr().err


def test_a_stopped_peer_is_published_as_lost_and_a_finished_one_is_not(capsys):
    """Rank 0 watches rank 1's heartbeat: one that never moves is published as lost after
    the stall window (exit 4, the window in the words), one that said it finished is not."""
    codes: list[int] = []
    finished_store = dist.HashStore()
    watchdog.Watchdog(finished_store, 1, 2).start().stop()  # beat, then finished
    quiet = watchdog.Watchdog(finished_store, 0, 2, exit=codes.append, stall_s=1.0).start()
    time.sleep(1.0 + 3 * failure_protocol.STALL_CHECK_S)
    quiet.stop()
    assert codes == [] and finished_store.add(failure_protocol.PUBLISHED, 0) == 0

    store = dist.HashStore()
    watcher = watchdog.Watchdog(store, 0, 2, exit=codes.append, stall_s=1.0)
    t0 = time.monotonic()
    watcher.start()
    while not codes and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    took = time.monotonic() - t0
    watcher.stop()
    assert codes == [failure_protocol.EXIT_PEER_LOST]
    assert 1.0 < took < 1.0 + 3 * failure_protocol.STALL_CHECK_S, took
    record = watcher.record()
    assert (record["kind"], record["rank"], record["by"], record["window"]) == ("lost", 1, 0, 1.0)
    err = capsys.readouterr().err
    assert "[rank 0] error: rank 1 stopped answering (no heartbeat for 1s; noticed by rank 0): its process is not " \
           "running" in err, err


def test_a_sigtermed_worker_whose_wait_failed_prints_the_cause_a_peer_published(capsys):
    """Under load torchrun's SIGTERM can come before the watchdog's next look at the store:
    a worker agreeing on a lost peer, or still computing, reads the cause that peer
    published, and names it."""
    store = dist.HashStore()
    watchdog.Watchdog(store, 1, 2).publish({"kind": "terminated", "rank": 1, "by": 1, "message": "SIGTERM"})
    codes: list[int] = []
    wd = watchdog.Watchdog(store, 0, 2, exit=codes.append)
    wd.pending = ("spmm(mean) backward: gradients to worker 1: a peer worker went away", failure_protocol.EXIT_PEER_LOST)
    wd._terminated()
    assert codes == [failure_protocol.EXIT_PEER_FAILED]
    assert capsys.readouterr().err == "[rank 0] error: rank 1 was stopped by SIGTERM\n"
    computing = watchdog.Watchdog(store, 0, 2, exit=codes.append)  # no wait failed yet: the same cause
    computing._terminated()
    assert codes == [failure_protocol.EXIT_PEER_FAILED] * 2
    assert capsys.readouterr().err == "[rank 0] error: rank 1 was stopped by SIGTERM\n"
    own = watchdog.Watchdog(dist.HashStore(), 0, 2, exit=codes.append)  # nothing published: its own error
    own.pending = ("spmm(mean): worker 1 went away", failure_protocol.EXIT_PEER_LOST)
    own._terminated()
    assert codes[2:] == [failure_protocol.EXIT_PEER_LOST]
    assert "[rank 0] error: spmm(mean): worker 1 went away (stopped by SIGTERM" in capsys.readouterr().err


def test_blame_names_the_peers_whose_heartbeat_stood_still():
    """Rank 0's wait failed: over the window, rank 1 beats and rank 2 does not."""
    store = dist.HashStore()
    wd = watchdog.Watchdog(store, 0, 3)
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            store.add(failure_protocol._beat_key(1), 1)
            stop.wait(0.1)

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        t0 = time.monotonic()
        silent, record = wd.silent_ranks(window=4 * failure_protocol.POLL_S)
        took = time.monotonic() - t0
    finally:
        stop.set()
        beater.join()
    assert (silent, record) == ([2], None)
    assert took >= 4 * failure_protocol.POLL_S  # the whole window, though rank 1 beat at once


def test_blame_stops_at_a_failure_a_peer_published_meanwhile():
    store = dist.HashStore()
    theirs = {"kind": "error", "rank": 2, "by": 2, "message": "bad part file"}
    watchdog.Watchdog(store, 2, 3).publish(theirs)
    t0 = time.monotonic()
    assert watchdog.Watchdog(store, 0, 3).silent_ranks(window=5.0) == ([], theirs)
    assert time.monotonic() - t0 < 2 * failure_protocol.POLL_S + 0.5  # its explanation beats blaming anyone


def test_an_unreadable_record_is_reported_as_such():
    store = dist.HashStore()
    wd = watchdog.Watchdog(store, 0, 2)
    assert wd.record() is None  # nothing published
    store.set(failure_protocol.RECORD, b"\xff not json")
    store.add(failure_protocol.PUBLISHED, 1)
    assert wd.record() == {"rank": None, "by": None, "kind": "error", "message": "unreadable failure record"}


def test_a_store_call_is_given_up_on_in_bounded_time():
    assert watchdog._within(1.0, lambda: 7) == 7
    assert watchdog._within(1.0, lambda: 1 / 0) is None  # a store that went away
    hang = threading.Event()
    t0 = time.monotonic()
    assert watchdog._within(0.3, lambda: hang.wait(30)) is None
    assert time.monotonic() - t0 < 1.0
    hang.set()
