"""``sarcompile.dist.relaunch``: every start of the workers meets in a namespace of the
launcher's store of its own, agreed through the store, whatever the earlier starts left
there (tickets never answered, or answered and never confirmed); a worker missing at the
start is named within the timeout; under ``torchrun --max-restarts 1`` (standalone, static
and c10d rendezvous) a job whose worker was SIGKILLed meets again by itself."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from sarcompile.errors import CommError
from sarcompile.dist.relaunch import PREFIX, generation_store

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store():
    """A TCPStore served here, as torchrun's agent serves it to the workers."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    yield server


def _client(server) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=10))


def _start(server, world_size: int, timeout_s: float = 10) -> list:
    """``world_size`` workers (threads, each with its own connection) meet: their
    (namespace, generation) or error, by rank."""
    out: list = [None] * world_size

    def worker(rank: int) -> None:
        try:
            out[rank] = generation_store(_client(server), rank, world_size, timeout_s)
        except Exception as e:  # noqa: BLE001 - returned to the test
            out[rank] = e

    threads = [threading.Thread(target=worker, args=(r,)) for r in reversed(range(world_size))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 10)
    return out


def test_each_start_meets_in_its_own_namespace(store):
    first = _start(store, 3)
    assert [g for _, g in first] == [1, 1, 1]
    first[0][0].set("gloo/addr/0", "dead:1")  # what the killed workers left behind
    # a worker of the first start that died waiting for its answer: a ticket never confirmed
    store.add(PREFIX + "tickets", 1)
    second = _start(store, 3)
    assert [g for _, g in second] == [2, 2, 2]
    assert not second[1][0].check(["gloo/addr/0"])
    second[2][0].set("k", "v")
    assert second[0][0].get("k") == b"v"  # one namespace for all three
    assert [g for _, g in _start(store, 1)] == [3]


def test_a_missing_worker_is_named_within_the_timeout(store):
    with pytest.raises(CommError, match=r"1 of the other 1 workers did not start within 1s"):
        generation_store(_client(store), 0, 2, 1)
    with pytest.raises(CommError, match="worker 0 did not start within 1s"):
        generation_store(dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=1)),
                         1, 2, 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("rendezvous", ["standalone", "static", "c10d"])
def test_torchrun_restarts_a_job_whose_worker_was_killed(tmp_path, rendezvous):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SARCOMPILE_TIMEOUT": "30", "PYTHONPATH": str(ROOT)}
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)  # torch's default: the agent's store, kept across starts
    launch = {
        "standalone": ["--standalone"],
        "static": ["--master-addr", "127.0.0.1", "--master-port", str(_free_port())],
        "c10d": ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", "job1"],
    }[rendezvous]
    args = [sys.executable, "-m", "torch.distributed.run", *launch, "--nproc-per-node", "2", "--max-restarts", "1",
            str(ROOT / "tests" / "dist" / "restarted_workers.py")]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    # (the two workers' lines may interleave in the one pipe)
    assert sorted(re.findall(r"start \d rank \d: sum \d", done.stdout)) == ["start 1 rank 0: sum 2",
                                                                          "start 1 rank 1: sum 2"]
