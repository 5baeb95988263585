"""Several machines: two "hosts" (network namespaces joined by a veth pair, made here),
2 workers each, launched with torchrun's documented multi-node flags only.

* static launch (``--nnodes 2 --node-rank R --master-addr A``) where, as in the issue, the
  hostname resolves to 127.0.0.1 on both hosts: works because ``sc.init()`` binds gloo to
  the interface that routes to MASTER_ADDR; its first epochs match one process within
  1e-5; then the link is cut mid-run: a clear error on every rank within the timeout
  (``SARCOMPILE_TIMEOUT`` set small here), and no process left on either host;
* the c10d rendezvous exactly as torchrun's docs give it, on hosts whose names resolve to
  their addresses (each namespace gets its own hostname and /etc/hosts): matches one
  process, ends with rc 0 and nothing left.

The c10d work-around for hosts whose name resolves to loopback (``--local-addr`` and
``--rdzv-conf is_host=``, README "Several machines") is checked by hand with
``scripts/two_hosts.py --rdzv --local-addr`` (it adds ~25 s; left out of the suite).

Needs root and ``ip netns`` (CI runs as root); otherwise every test is skipped, naming
why. Namespaces, their processes and the veth pair are removed whatever happens. (The
interface choice's cases that need no namespaces: tests/dist/test_interface.py.)
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("two_hosts", ROOT / "scripts" / "two_hosts.py")
two_hosts = sys.modules.setdefault("two_hosts", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(two_hosts)

KEYS = ("loss", "train_acc", "val_acc", "test_acc")
EPOCHS = 3
TRAIN = ["--hidden", "16", "--no-progress", "--checkpoint-every", "1000", "--seed", "2"]


@pytest.fixture(scope="module")
def netns():
    why = two_hosts.netns_available()
    if why:
        pytest.skip(f"TWO-HOST TESTS NOT RUN ({why}); CI must run them as root")


@pytest.fixture(scope="module")
def parts(netns, tmp_path_factory) -> dict[int, str]:
    """examples/make_graph.py's graph (600 nodes) cut into 1 and 4 parts."""
    import sarcompile as sc

    spec = importlib.util.spec_from_file_location("make_graph", ROOT / "examples" / "make_graph.py")
    make_graph = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_graph)
    data = make_graph.sbm(600, 4, 5.0, 0.7, 8, 0)
    g = sc.Graph.from_edges(data["src"], data["dst"], data["num_nodes"])
    root = tmp_path_factory.mktemp("multihost")
    out = {}
    for n in (1, 4):
        out[n] = str(root / f"parts{n}")
        sc.partition(g, n, out[n], node_data={k: data[k] for k in ("x", "y", "train_mask", "val_mask", "test_mask")})
    return out


@pytest.fixture(scope="module")
def one_process(parts, tmp_path_factory) -> list[dict]:
    """The same training in one plain process (the 1-part partition of the same graph)."""
    out = tmp_path_factory.mktemp("one") / "run"
    env = {**os.environ, "PYTHONPATH": two_hosts._pythonpath(), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "sarcompile.train", "--parts", parts[1], "--out", str(out),
                           "--epochs", str(EPOCHS), *TRAIN], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return _log(out)


def _log(out: Path) -> list[dict]:
    """The JSON lines of a run's log; a last line still being written is left out."""
    path = out / "log.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _port() -> int:
    return 29600 + os.getpid() % 300  # the namespaces are new: any port is free in them


def _logs(work: Path) -> str:
    return "\n".join(f"===== host {i}:\n{(work / f'host{i}.log').read_text(errors='replace')[-6000:]}" for i in range(2))


def _assert_same_curve(got: list[dict], one_process: list[dict]) -> None:
    assert [r["world_size"] for r in got] == [4] * EPOCHS
    assert [r["epoch"] for r in got] == [r["epoch"] for r in one_process] == list(range(1, EPOCHS + 1))
    for a, b in zip(got, one_process):
        for k in KEYS:
            assert math.isclose(a[k], b[k], rel_tol=1e-5, abs_tol=1e-5), (k, got, one_process)


def test_c10d_rendezvous_matches_one_process(parts, one_process, tmp_path):
    """torchrun's documented c10d command, on hosts whose names resolve to their
    addresses; the run ends cleanly (rc 0, nothing left)."""
    train = ["--parts", parts[4], "--out", str(tmp_path / "run"), "--epochs", str(EPOCHS), *TRAIN]
    start = time.monotonic()
    with two_hosts.TwoHosts() as hosts:
        procs = []
        try:
            for node in range(2):
                procs.append(two_hosts.launch(hosts, node, train, port=_port(), rdzv=True, hostnames=True,
                                              env={"SARCOMPILE_TIMEOUT": "60"}, log=tmp_path / f"host{node}.log"))
            rcs = two_hosts.wait_all(procs, 150)
        finally:
            two_hosts.kill_all(procs)
        left = hosts.pids()
    took = time.monotonic() - start
    assert rcs == [0, 0], f"exit codes {rcs} after {took:.0f}s\n{_logs(tmp_path)}"
    assert not left, f"processes left in the namespaces: {left}"
    _assert_same_curve(_log(tmp_path / "run"), one_process)


def test_static_launch_matches_one_process_then_a_cut_link_fails_every_rank(parts, one_process, tmp_path):
    """The static launch where the hostname resolves to 127.0.0.1 on both hosts (the
    issue's setting): sc.init() binds gloo to the veth, the first epochs match one
    process; then the link is cut, and every rank fails with a clear error within the
    timeout (SARCOMPILE_TIMEOUT=5 here: each wait is bounded by it, and the shutdown
    barrier waits once more) and no process is left on either host."""
    timeout_s = 5
    out = tmp_path / "run"
    train = ["--parts", parts[4], "--out", str(out), "--epochs", "100000", *TRAIN]
    with two_hosts.TwoHosts() as hosts:
        procs = []
        try:
            for node in range(2):
                procs.append(two_hosts.launch(hosts, node, train, port=_port(),
                                              env={"SARCOMPILE_TIMEOUT": str(timeout_s)},
                                              log=tmp_path / f"host{node}.log"))
            deadline = time.monotonic() + 120
            while len(_log(out)) < EPOCHS:
                assert time.monotonic() < deadline, f"{EPOCHS} epochs not done within 120 s\n{_logs(tmp_path)}"
                assert all(p.poll() is None for p in procs), f"a host ended before the cut\n{_logs(tmp_path)}"
                time.sleep(0.2)
            hosts.cut()
            cut = time.monotonic()
            rcs = two_hosts.wait_all(procs, 60)
            took = time.monotonic() - cut
        finally:
            two_hosts.kill_all(procs)
        time.sleep(1)  # let the agents' SIGTERMs land before looking for leftovers
        left = hosts.pids()
    logs = _logs(tmp_path)
    _assert_same_curve(_log(out)[:EPOCHS], one_process)
    assert None not in rcs, f"still running 60 s after the cut (timeout {timeout_s} s)\n{logs}"
    assert all(rc != 0 for rc in rcs), f"exit codes {rcs}\n{logs}"
    assert not left, f"processes left in the namespaces after the cut: {left}\n{logs}"
    # torchrun SIGTERMs a host's other worker as soon as one exits; that worker says
    # so if it has no error of its own yet. Each host's first leaver names the timeout.
    timed_out = rf"did not answer within {timeout_s}s"
    for rank in range(4):
        said = re.search(rf"\[rank {rank}\] error: (.*)", logs)
        assert said and (re.search(timed_out, said[1]) or said[1].startswith("stopped by SIGTERM")), \
            f"rank {rank} printed no clear error\n{logs}"
    for host in logs.split("===== host ")[1:]:
        assert re.search(rf"\[rank \d\] error: .*{timed_out}", host), f"no rank named the timeout\n{logs}"
    assert took < 6 * timeout_s, f"{took:.0f}s from the cut to the last exit (timeout {timeout_s} s)"
    print(f"cut to exit: {took:.1f}s (timeout {timeout_s}s), exit codes {rcs}")
