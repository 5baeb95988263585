"""Faults under torchrun: one worker's failure ends every worker within seconds, all naming
it; the root cause torchrun prints is that worker; nothing is left running.

Each test starts ``torchrun -m sarcompile.train`` on a small graph, hurts one worker (or the
agent) and bounds the time until every process is gone. See sarcompile.dist.failure
for the protocol and the exit codes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_jobs import curve, run_train

import sarcompile as sc
from sarcompile.data import checkpoint as files

ROOT = Path(__file__).resolve().parents[1]


def _sbm(n: int):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_graph", ROOT / "examples" / "make_graph.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.sbm(n, 4, 4, 0.8, 8, 0)


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> dict[int, Path]:
    data = _sbm(1000)
    g = sc.Graph.from_edges(data["src"], data["dst"], data["num_nodes"])
    root = tmp_path_factory.mktemp("faults")
    out = {}
    for n in (2, 3, 4):
        out[n] = root / f"parts{n}"
        sc.partition(g, n, str(out[n]), node_data={k: data[k] for k in ("x", "y", "train_mask", "val_mask", "test_mask")})
    return out


# -- processes ---------------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    """Running (or stopped), not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def _rank_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        return int(env[b"RANK"])
    except (OSError, KeyError, ValueError):
        return None


class Job:
    """``torchrun --standalone --nproc-per-node n -m sarcompile.train`` (or the script
    ``entry``, with the trainer's arguments), output to files."""

    def __init__(self, tmp: Path, parts: Path, n: int, *extra: str, restarts: int = 0,
                 entry: tuple[str, ...] = ("-m", "sarcompile.train"), **env: str):
        self.out = tmp / "run"
        self.stdout_path, self.stderr_path = tmp / "stdout.txt", tmp / "stderr.txt"
        environ = {k: v for k, v in os.environ.items() if k != "SARCOMPILE_TIMEOUT"}  # the default unless given
        environ.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **env)
        args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
                "--max-restarts", str(restarts), *entry, "--parts", str(parts), "--out", str(self.out), "--hidden", "16",
                "--no-progress", "--checkpoint-every", "0", *extra]
        self._stdout, self._stderr = open(self.stdout_path, "w"), open(self.stderr_path, "w")
        self.agent = subprocess.Popen(args, cwd=ROOT, env=environ, stdout=self._stdout, stderr=self._stderr,
                                      start_new_session=True)
        self.n = n
        self.workers: dict[int, int] = {}

    def find_workers(self, within: float = 60) -> dict[int, int]:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            ranks = {_rank_of(p): p for p in _children(self.agent.pid)}
            ranks.pop(None, None)
            if len(ranks) == self.n:
                self.workers = ranks
                return ranks
            time.sleep(0.1)
        pytest.fail(f"torchrun did not start {self.n} workers within {within}s:\n{self.output()}")

    def wait_for_epochs(self, count: int = 2, within: float = 90) -> None:
        log = self.out / "log.jsonl"
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if log.is_file() and len(log.read_text().splitlines()) >= count:
                return
            if self.agent.poll() is not None:
                pytest.fail(f"the job ended before training:\n{self.output()}")
            time.sleep(0.1)
        pytest.fail(f"no {count} epochs within {within}s:\n{self.output()}")

    def wait(self, within: float) -> int:
        try:
            return self.agent.wait(timeout=within)
        except subprocess.TimeoutExpired:
            pytest.fail(f"torchrun still running {within}s later:\n{self.output()}")

    def wait_gone(self, pids, within: float) -> float:
        """Seconds until every pid in ``pids`` has exited (fails past ``within``)."""
        start = time.monotonic()
        while any(_alive(p) for p in pids):
            if time.monotonic() - start > within:
                left = [p for p in pids if _alive(p)]
                pytest.fail(f"processes {left} still alive {within}s later:\n{self.output()}")
            time.sleep(0.05)
        return time.monotonic() - start

    def output(self) -> str:
        self._stdout.flush()
        self._stderr.flush()
        return self.stdout_path.read_text() + "\n" + self.stderr_path.read_text()

    def close(self) -> None:
        """Leave nothing behind, whatever happened."""
        for pid in [self.agent.pid, *self.workers.values()]:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        try:
            self.agent.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._stdout.close()
        self._stderr.close()


@pytest.fixture
def job(tmp_path):
    jobs = []

    def start(*args, **env) -> Job:
        jobs.append(Job(tmp_path, *args, **env))
        return jobs[-1]

    yield start
    for j in jobs:
        j.close()


def _root_cause(output: str) -> str:
    assert "Root Cause (first observed failure)" in output, output
    return output.split("Root Cause (first observed failure)", 1)[1]


def _error_lines(output: str) -> dict[int, str]:
    lines = {}
    for line in output.splitlines():
        if line.startswith("[rank ") and "] error: " in line:
            lines.setdefault(int(line[6:line.index("]")]), line.split("] error: ", 1)[1])
    return lines


# -- the tests -----------------------------------------------------------------------------------------
def test_bad_part_on_one_rank_ends_all_four_within_seconds_with_default_timeout(parts, job, tmp_path):
    """A truncated part file on rank 1 of 4: every worker prints rank 1's error, rank 1 is
    torchrun's root cause, and all are gone in seconds, with SARCOMPILE_TIMEOUT at its
    default (300 s): nobody waits for it."""
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in parts[4].iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "part-1.pt").write_bytes((parts[4] / "part-1.pt").read_bytes()[:1000])
    start = time.monotonic()
    j = job(bad, 4, "--epochs", "3")
    rc = j.wait(within=90)
    took = time.monotonic() - start
    out = j.output()
    assert rc == 1, out
    errors = _error_lines(out)
    assert set(errors) == {0, 1, 2, 3}, out
    assert "part-1.pt' does not match the manifest's checksum" in errors[1]
    for r in (0, 2, 3):
        assert errors[r].startswith("rank 1 failed: part file ") and "part-1.pt" in errors[r], errors[r]
    root = _root_cause(out)
    assert "rank      : 1 (local_rank: 1)" in root and "exitcode  : 1" in root, root
    # Startup of 4 workers on a loaded 2-core machine is most of it (measured: 7 s in all).
    assert took < 60, f"took {took:.1f}s"
    assert "a peer worker did not answer" not in out
    print(f"4 workers, bad part on rank 1: job {took:.1f}s from launch")


def test_an_error_on_rank_0_alone_at_log_time_ends_the_job(parts, job, tmp_path):
    """Only rank 0 writes the log; its OSError (here: OUT/log.jsonl is a directory) ends
    both workers within seconds, with the default timeout, and names rank 0."""
    (tmp_path / "run" / "log.jsonl").mkdir(parents=True)
    start = time.monotonic()
    j = job(parts[2], 2, "--epochs", "3")
    rc = j.wait(within=60)
    took = time.monotonic() - start
    out = j.output()
    assert rc == 1, out
    errors = _error_lines(out)
    assert errors[0].startswith("IsADirectoryError: "), out
    assert errors[1] == f"rank 0 failed: {errors[0]}", out
    root = _root_cause(out)
    assert "rank      : 0 (local_rank: 0)" in root and "exitcode  : 1" in root, root
    assert took < 40, f"took {took:.1f}s"
    print(f"2 workers, log error on rank 0: job {took:.1f}s from launch")


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_killed_rank_mid_training_ends_the_job(parts, job, sig):
    """Rank 1 killed: the job is gone within seconds, torchrun's root cause is rank 1.
    SIGTERM (a scheduler's, or a user's `kill`) is answered: rank 1 says so and exits 143,
    and rank 0 prints the same cause."""
    j = job(parts[2], 2, "--epochs", "100000")
    workers = j.find_workers()
    j.wait_for_epochs()
    start = time.monotonic()
    os.kill(workers[1], getattr(signal, sig))
    rc = j.wait(within=30)
    took = time.monotonic() - start
    out = j.output()
    assert rc == 1, out
    root = _root_cause(out)
    assert "rank      : 1 (local_rank: 1)" in root, root
    if sig == "SIGKILL":
        assert "Signal 9 (SIGKILL)" in root, root
    else:
        assert "exitcode  : 143" in root, root
        errors = _error_lines(out)
        assert errors[1].startswith("stopped by SIGTERM") and errors[0] == "rank 1 was stopped by SIGTERM", out
    assert j.wait_gone(workers.values(), within=5) < 5
    assert took < 10, f"took {took:.1f}s"
    print(f"{sig} of rank 1: job gone {took:.1f}s later")


def test_torchrun_restarts_a_killed_worker_onto_the_uninterrupted_curve(parts, pool, job, tmp_path):
    """Plain ``torchrun --max-restarts 1 ... --resume auto`` (no wrapper, no environment):
    rank 1 SIGKILLed once the log shows epoch 3, the job restarts by itself from the latest
    checkpoint and finishes all 6 epochs, each logged once, with the losses of an
    uninterrupted run bit for bit."""
    train = ["--epochs", "6", "--checkpoint-every", "1", "--resume", "auto", "--dropout", "0.5", "--seed", "1"]
    reference = run_train(pool, 2, ["--parts", str(parts[2]), "--out", str(tmp_path / "reference"), "--hidden", "16",
                                    "--no-progress", *train])
    j = job(parts[2], 2, *train, restarts=1)
    workers = j.find_workers()
    j.wait_for_epochs(3)
    os.kill(workers[1], signal.SIGKILL)
    assert j.wait(within=120) == 0, j.output()
    out = j.output()
    assert "; starting; writing" in out and "; resuming from epoch " in out, out  # the first start, then the restart
    logged = [json.loads(line) for line in (j.out / "log.jsonl").read_text().splitlines()]
    assert curve(logged) == curve(reference), out
    assert len({r["run"] for r in logged}) == 1


def test_a_kill_during_a_checkpoint_write_resumes_from_the_previous_one(parts, pool, job, tmp_path):
    """Rank 1 SIGKILLed while the background writer is writing epoch 4's checkpoint (every
    worker's files written, its manifest not: tests/slow_checkpoint_train.py holds the
    write there in the job's first round): torchrun restarts the job, which reads only the
    complete checkpoint of epoch 3 and finishes all 6 epochs on the uninterrupted curve,
    bit for bit; the half-written one is gone."""
    train = ["--epochs", "6", "--checkpoint-every", "1", "--resume", "auto", "--dropout", "0.5", "--seed", "1"]
    reference = run_train(pool, 2, ["--parts", str(parts[2]), "--out", str(tmp_path / "reference"), "--hidden", "16",
                                    "--no-progress", *train])
    marks = tmp_path / "marks"
    marks.mkdir()
    start = time.monotonic()
    j = job(parts[2], 2, *train, restarts=1, entry=(str(ROOT / "tests" / "slow_checkpoint_train.py"),),
            SLOW_CHECKPOINT_EPOCH="4", SLOW_CHECKPOINT_MARKS=str(marks))
    workers = j.find_workers()
    deadline = time.monotonic() + 40
    while not all((marks / f"writing-{r}").exists() for r in (0, 1)):
        assert time.monotonic() < deadline and j.agent.poll() is None, f"epoch 4's write never began:\n{j.output()}"
        time.sleep(0.05)
    checkpoints = j.out / "checkpoints"
    half = files.temp_dir(files.checkpoint_dir(j.out, 4))
    assert (half / "rank-0001").is_dir() and not (half / files.MANIFEST).exists()
    assert files.latest_checkpoint(j.out) == files.checkpoint_dir(j.out, 3)
    held = time.monotonic() - start
    os.kill(workers[1], signal.SIGKILL)
    assert j.wait(within=45) == 0, j.output()
    took = time.monotonic() - start
    out = j.output()
    assert "; starting; writing" in out and "; resuming from epoch 3; writing" in out, out
    assert not list(marks.glob("read-*-0.txt"))  # the first round read nothing
    for r in (0, 1):  # the restart read the complete checkpoint of epoch 3, and only it
        assert (marks / f"read-{r}-1.txt").read_text().splitlines() == [str(files.checkpoint_dir(j.out, 3))]
    logged = [json.loads(line) for line in (j.out / "log.jsonl").read_text().splitlines()]
    assert curve(logged) == curve(reference), out
    kept = files.complete_checkpoints(j.out)
    assert sorted(checkpoints.iterdir()) == kept and kept[-1] == files.checkpoint_dir(j.out, 6)  # no temp left
    assert took < 60, f"took {took:.1f}s"
    print(f"killed during epoch 4's checkpoint write ({held:.1f}s from launch): job done {took:.1f}s from launch")


@pytest.mark.parametrize("noticed", ["wait", "heartbeat"])
def test_sigstop_of_a_rank_is_blamed_the_same_by_every_survivor(parts, job, noticed):
    """Rank 1 of 3 stopped: every survivor names rank 1 in the same words, and the
    survivors are gone seconds later -- once a wait for it fails (a 4 s timeout here), or,
    with the default 300 s timeout, once its heartbeat stood still for the stall window
    (4 s here: its watcher, rank 0, publishes it)."""
    env = {"SARCOMPILE_TIMEOUT": "4"} if noticed == "wait" else {"SARCOMPILE_STALL_TIMEOUT": "4"}
    j = job(parts[3], 3, "--epochs", "100000", **env)
    workers = j.find_workers()
    j.wait_for_epochs()
    start = time.monotonic()
    os.kill(workers[1], signal.SIGSTOP)
    survivors = [workers[r] for r in (0, 2)]
    took = j.wait_gone(survivors, within=30)
    errors = _error_lines(j.output())
    assert set(errors) >= {0, 2}, j.output()
    blamed = {errors[r] for r in (0, 2)}
    said = "no heartbeat for 3s; noticed by rank " if noticed == "wait" else "no heartbeat for 4s; noticed by rank 0"
    assert all(e.startswith(f"rank 1 stopped answering ({said}") for e in blamed), blamed
    assert len(blamed) == 1, blamed  # one verdict, the same words everywhere
    # timeout 4 s + 3 s watching the heartbeats (or a 4 s stall) + the exit protocol
    assert took < 20, f"survivors took {took:.1f}s"
    # torchrun's SIGTERM to the stopped worker waits for it to be continued.
    os.kill(workers[1], signal.SIGCONT)
    assert j.wait(within=20) == 1
    assert j.wait_gone(workers.values(), within=5) < 5
    print(f"survivors gone {took:.1f}s after the SIGSTOP, job {time.monotonic() - start:.1f}s")


def test_sigkill_of_the_agent_takes_the_workers_with_it(parts, job):
    j = job(parts[2], 2, "--epochs", "100000")
    workers = j.find_workers()
    j.wait_for_epochs()
    os.kill(j.agent.pid, signal.SIGKILL)
    j.agent.wait(timeout=10)
    took = j.wait_gone(workers.values(), within=10)
    assert took < 5, f"workers outlived their agent by {took:.1f}s"
    print(f"SIGKILL of the agent: workers gone {took:.2f}s later")
    log = j.out / "log.jsonl"
    lines = len(log.read_text().splitlines())
    time.sleep(1)
    assert len(log.read_text().splitlines()) == lines  # nobody is training any more


def test_ctrl_c_of_torchrun_stops_the_job_in_seconds(parts, job):
    j = job(parts[2], 2, "--epochs", "100000")
    workers = j.find_workers()
    j.wait_for_epochs()
    start = time.monotonic()
    j.agent.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal sends torchrun
    j.wait(within=30)
    took = time.monotonic() - start
    assert j.wait_gone(workers.values(), within=5) < 5
    out = j.output()
    # Both ranks get the signal; one may hear of the other's first (the exit protocol)
    # and name that instead: either way every rank names the SIGINT.
    for rank in (0, 1):
        assert re.search(rf"\[rank {rank}\] error: (interrupted|rank \d+ was interrupted) \(SIGINT\)", out), out
    assert took < 10, f"took {took:.1f}s"
    print(f"Ctrl-C: job gone {took:.1f}s later")


def test_ctrl_c_while_a_worker_is_blocked_in_a_wait(parts, job):
    """Rank 1 stopped, rank 0 blocked waiting for it (default timeout, 300 s): Ctrl-C
    still ends rank 0 within seconds (its watchdog acts for the blocked main thread)."""
    j = job(parts[2], 2, "--epochs", "100000")
    workers = j.find_workers()
    j.wait_for_epochs()
    os.kill(workers[1], signal.SIGSTOP)
    time.sleep(1.0)  # rank 0 is now inside a wait for rank 1
    start = time.monotonic()
    j.agent.send_signal(signal.SIGINT)
    took = j.wait_gone([workers[0]], within=20)
    assert took < 8, f"rank 0 took {took:.1f}s"
    assert "[rank 0] error: interrupted (SIGINT); stopping" in j.output(), j.output()
    os.kill(workers[1], signal.SIGCONT)  # it gets its pending SIGINT now
    j.wait(within=20)
    assert j.wait_gone(workers.values(), within=5) < 5
    print(f"rank 0 gone {took:.1f}s after Ctrl-C, job {time.monotonic() - start:.1f}s")


def test_bad_timeout_value_names_the_variable(tmp_path):
    """(Every bad value is checked in tests/dist/test_failures.py; this is the command line.)"""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "SARCOMPILE_TIMEOUT": "-5"}
    done = subprocess.run([sys.executable, "-m", "sarcompile.train", "--parts", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == (
        "error: SARCOMPILE_TIMEOUT must be a number of seconds > 0 (how long one wait for a peer worker may "
        "take; default 300), got '-5'"
    ), done.stderr
