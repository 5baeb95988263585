"""A worker that dies or stops answering makes the others fail fast with a clear error, across
real processes (the watchdog alone, in one process: test_watchdog.py)."""

from __future__ import annotations

import os
import queue
import tempfile
import time

import pytest
import torch.multiprocessing as mp


def _worker(rank: int, store_path: str, behaviour: str, results) -> None:
    os.environ["SARCOMPILE_TIMEOUT"] = "5"
    import torch
    import torch.distributed as dist

    import sarcompile as sc
    from sarcompile.graph.shard import ShardGraph, split_graph

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    # Both ranks past gloo's connection handshake: init returning on rank 1 does not mean rank
    # 0's side of the pair is up, and a rank 1 gone before it is makes rank 0's init fail instead.
    dist.barrier()
    g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 3]), torch.tensor([2, 3, 0, 1]), 4)
    parts = split_graph(g, torch.tensor([0, 0, 1, 1]), 2)
    shard = ShardGraph.from_part(parts[rank], rank, 2, 4, 4)
    if rank == 1:
        if behaviour in ("die", "dead"):
            os._exit(3)
        time.sleep(30)  # alive but silent
        os._exit(0)
    if behaviour == "dead":
        time.sleep(2)  # rank 1 is gone before the exchange: gloo then refuses the send itself
    start = time.monotonic()
    try:
        sc.spmm(shard, torch.randn(2, 3), "sum")
        results.put(("no error", time.monotonic() - start))
    except sc.CommError as e:
        results.put((str(e), time.monotonic() - start))
    results.close()
    results.join_thread()  # os._exit would drop a message still in the queue's feeder thread
    os._exit(0)


@pytest.mark.parametrize("behaviour", ["die", "dead", "hang"])
def test_peer_failure_raises_comm_error_within_timeout(behaviour):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=_worker, args=(r, os.path.join(d, "store"), behaviour, results)) for r in range(2)]
        for p in procs:
            p.start()
        try:
            message, took = results.get(timeout=60)
        except queue.Empty:
            pytest.fail("rank 0 neither finished nor raised within 60 s")
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
    assert "did not answer" in message and "worker 1" in message, message
    assert took < 15, f"took {took:.1f}s with a 5 s timeout"


# -- agreed failure (sarcompile.dist.failure), on a FileStore and a HashStore ----------------------
def _agreeing_worker(rank: int, store_path: str, behaviour: str, err_path: str) -> None:
    import signal
    import sys

    os.environ.pop("SARCOMPILE_TIMEOUT", None)  # the default, 300 s: nobody may wait for it
    sys.stderr = open(err_path, "w", buffering=1)
    import torch
    import torch.distributed as dist

    import sarcompile as sc
    from sarcompile.errors import PartitionError
    from sarcompile.dist import failure
    from sarcompile.graph.shard import ShardGraph, split_graph

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    failure.start(dist.distributed_c10d._get_default_store(), rank, 2)
    g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 3]), torch.tensor([2, 3, 0, 1]), 4)
    shard = ShardGraph.from_part(split_graph(g, torch.tensor([0, 0, 1, 1]), 2)[rank], rank, 2, 4, 4)
    if rank == 1:
        time.sleep(1.0)  # rank 0 is waiting for our features by now
        if behaviour == "error":
            failure.report(PartitionError("part file 'p/part-1.pt' is truncated"), rank=1, distributed=True)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        sc.spmm(shard, torch.randn(2, 3), "sum")  # blocks on rank 1
    except BaseException as e:  # noqa: BLE001 - as sarcompile.train.main does
        failure.report(e, rank=rank, distributed=True)
    os._exit(0)


@pytest.mark.parametrize("behaviour", ["error", "kill"])
def test_a_failing_or_killed_rank_ends_the_other_within_seconds(behaviour, tmp_path):
    """Rank 1 fails on its own (exit 1) or is SIGKILLed; rank 0, blocked in an exchange
    with the default 300 s timeout, names rank 1 and exits (3: it failed; 4: it went
    silent) within seconds, after rank 1."""
    ctx = mp.get_context("spawn")
    errs = [str(tmp_path / f"err{r}.txt") for r in range(2)]
    procs = [ctx.Process(target=_agreeing_worker, args=(r, str(tmp_path / "store"), behaviour, errs[r]))
             for r in range(2)]
    for p in procs:
        p.start()
    ended: dict[int, float] = {}
    start = time.monotonic()
    try:
        while len(ended) < 2 and time.monotonic() - start < 60:
            for r, p in enumerate(procs):
                if r not in ended and not p.is_alive():
                    ended[r] = time.monotonic() - start
            time.sleep(0.02)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
    assert len(ended) == 2, f"still running after 60 s: {ended}"
    err0 = open(errs[0]).read()
    if behaviour == "error":
        assert procs[1].exitcode == 1 and procs[0].exitcode == 3, (procs[1].exitcode, procs[0].exitcode, err0)
        assert open(errs[1]).read().strip() == "[rank 1] error: part file 'p/part-1.pt' is truncated"
        assert err0.strip() == "[rank 0] error: rank 1 failed: part file 'p/part-1.pt' is truncated", err0
    else:
        assert procs[1].exitcode == -9 and procs[0].exitcode == 4, (procs[1].exitcode, procs[0].exitcode, err0)
        assert err0.startswith("[rank 0] error: rank 1 stopped answering (no heartbeat for 3s; noticed by rank 0): "), err0
    assert ended[1] < ended[0], ended  # the failing rank first: torchrun's root cause
    assert ended[0] - ended[1] < 10, ended  # process start-up (spawn, import torch) is most of `ended`
    print(f"{behaviour}: rank 1 ended at {ended[1]:.1f}s, rank 0 {ended[0] - ended[1]:.1f}s after it")


class _UnreachableStore:
    """A store whose every call hangs until released, as a TCPStore behind a cut link."""

    def __init__(self):
        import threading

        self.released = threading.Event()

    def _hang(self, *args, **kwargs):
        self.released.wait(60)
        raise RuntimeError("store unreachable")

    add = get = compare_set = set = _hang


def test_a_worker_that_cannot_reach_the_store_still_leaves_in_bounded_time(monkeypatch, capsys):
    """After a cut link every store call waits its own timeout: the failing worker gives up
    agreeing after LEAVE_LIMIT_S, says why, and exits with the code of its own error."""
    import threading

    import sarcompile as sc
    from sarcompile.dist import failure, failure_protocol, watchdog

    store = _UnreachableStore()
    codes: list[int] = []
    wd = watchdog.Watchdog(store, 2, 4, exit=codes.append)
    monkeypatch.setattr(failure, "_active", wd)
    t0 = time.monotonic()
    reporter = threading.Thread(target=failure.report,
                                args=(sc.CommError("spmm(mean): worker 0 did not answer within 5s"),),
                                kwargs={"rank": 2, "distributed": True}, daemon=True)
    reporter.start()
    deadline = t0 + failure_protocol.LEAVE_LIMIT_S + 5
    while not codes and time.monotonic() < deadline:
        time.sleep(0.05)
    took = time.monotonic() - t0
    store.released.set()  # the store answers (with errors) again: the reporter finishes its way out
    reporter.join(timeout=30)
    assert codes[:1] == [failure_protocol.EXIT_PEER_LOST], codes
    assert failure_protocol.LEAVE_LIMIT_S - 0.5 < took < failure_protocol.LEAVE_LIMIT_S + 2
    err = capsys.readouterr().err
    assert "[rank 2] error: spmm(mean): worker 0 did not answer within 5s" in err and "could not be reached" in err


# A worker whose main thread is blocked in C (as in a gloo wait) gets SIGTERM. "idle": it
# was training; "agreeing": it was agreeing with its peers on its own failed wait, and
# the store does not answer (a cut link). The store hangs in both: nothing may wait on it.
_SIGTERMED = """
import ctypes, sys, threading
import sarcompile as sc
from sarcompile.dist import failure

cut = threading.Event()

class CutStore:
    # answers until the link is cut, then hangs as a TCPStore behind a cut link
    def add(self, key, value):
        if cut.is_set():
            threading.Event().wait(600)
        return 0
    get = compare_set = set = add

wd = failure.start(CutStore(), 2, 4)
cut.set()
if sys.argv[1] == "agreeing":
    threading.Thread(target=failure.report, args=(sc.CommError("spmm(mean): worker 0 did not answer within 5s"),),
                     kwargs={"rank": 2, "distributed": True}, daemon=True).start()
print("ready", flush=True)
libc = ctypes.CDLL(None)
for _ in range(30):
    libc.sleep(1)  # C, not Python: the main thread runs no handler while in here
print("still alive", flush=True)
"""


@pytest.mark.parametrize("case", ["idle", "agreeing"])
def test_sigterm_is_answered_with_the_cause_at_once(case):
    """torchrun SIGTERMs a host's other workers as soon as one fails: the worker says why
    (its own pending error, or the SIGTERM) and exits within a second, though its main
    thread is blocked and the store is out of reach."""
    import select
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _SIGTERMED, case], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready and proc.stdout.readline().strip() == "ready", "the child did not start within 60 s"
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=20)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    out, err = proc.stdout.read(), proc.stderr.read()
    assert "still alive" not in out
    if case == "idle":
        assert rc == failure_codes()["EXIT_TERMINATED"] == 143, (rc, err)
        assert err.strip() == ("[rank 2] error: stopped by SIGTERM (torchrun sends it to a host's other workers "
                               "once one of them has failed: that worker's error is the cause)"), err
    else:
        assert rc == failure_codes()["EXIT_PEER_LOST"], (rc, err)
        assert err.strip() == ("[rank 2] error: spmm(mean): worker 0 did not answer within 5s (stopped by SIGTERM "
                               "before the other workers could be reached to agree on the cause)"), err
    # idle: CAUSE_READ_S and ALONE_PUBLISH_S trying the store; agreeing: at once, well before LEAVE_LIMIT_S
    assert took < 2.5, f"took {took:.1f}s"


def failure_codes() -> dict[str, int]:
    from sarcompile.dist import failure_protocol

    return {name: getattr(failure_protocol, name) for name in failure_protocol.__all__ if name.startswith("EXIT_")}
