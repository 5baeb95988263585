"""Benchmark runs that take turns: one timed epoch of each run in a round, then the next round.

This machine's speed swings by a third between minutes (shared cores), so two runs made one
after the other compare two spells of the machine as much as two engines. Here every run
is started and set up (to the end of its warm-up epoch) alone; then round k gives each run,
in turn, its k-th timed epoch while the others wait. A slow spell hits every run's epochs
of the same rounds, and their medians compare like with like. Runs waiting their turn
block on a pipe (no CPU); they stay resident, which is harmless while memory is ample and
each run's peak is measured in its own process.

A turn is two epochs, and only the second is timed. A run back from waiting is not in
the state it trains in: memory its allocator gave back to the kernel has sat free for
seconds, long enough for this VM to report it free to the host (virtio-balloon's free page
reporting), so the next step's fresh pages are faulted in from the host. A pause of 5 s
before each step took DGL's SAGE step here from 1.30-1.33 s to 1.90-1.96 s; with one
untimed step after the pause, 1.22-1.27 s. It would tax most the runs that unmap and
re-fault their tensors every step (glibc's own thresholds: DGL, ``SARCOMPILE_MALLOC=off``),
so without the extra epoch, taking turns would favour sarcompile's default setting.

The protocol is two FIFOs per run, made by :func:`take_turns`: the driver writes one byte per
worker process to ``PREFIX.go`` to start a turn; the run's rank 0 writes one byte to
``PREFIX.done`` when the turn's epoch is over (the epoch ends in an all-reduce, so every
rank is through it). The worker side is :class:`Turns`, given ``--turns PREFIX``:

    turns = Turns(prefix)        # None: no driver, every turn is the worker's at once
    ... warm-up epoch ...; turns.give()                   # turn 0: set up
    for _ in range(epochs): turns.take(); epoch(); timed(epoch()); turns.give()
    turns.take()                 # the last turn: report and exit

A run that dies or overruns ``timeout`` is killed (its whole process group: torchrun and its
workers) and reported; the others go on. If the driver dies, a waiting worker reads
end-of-file and exits. :func:`run_all` runs a list either way: in turns, or each start to
end, one after the other.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


class Turns:
    """A worker process's side (every rank of a run makes one)."""

    def __init__(self, prefix: str | None, rank: int = 0):
        self.go = os.open(f"{prefix}.go", os.O_RDONLY) if prefix else None
        # the driver holds both FIFOs open read-write, so neither open blocks
        self.done = os.open(f"{prefix}.done", os.O_WRONLY) if prefix and rank == 0 else None

    @property
    def driven(self) -> bool:
        """Whether a driver hands out the turns."""
        return self.go is not None

    def take(self) -> None:
        """Wait for the driver to start this run's next turn."""
        if self.go is not None and os.read(self.go, 1) == b"":
            sys.exit("the benchmark's driver is gone (its turn pipe closed)")

    def give(self) -> None:
        """Tell the driver this run's turn is over (rank 0's word serves the run)."""
        if self.done is not None:
            os.write(self.done, b".")


@dataclass
class Run:
    """One benchmark run: its command (the worker script's, before ``--turns``), environment,
    worker processes (for ``go`` bytes) and where its output goes."""

    cmd: list[str]
    env: dict[str, str]
    processes: int
    log: Path


@dataclass
class _Live:
    run: Run
    proc: subprocess.Popen
    go: int
    done: int


def _fifo(path: Path) -> int:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return os.open(path, os.O_RDWR)


def _given(live: _Live, timeout: float) -> bool:
    """Whether the run ended its turn within ``timeout`` (False: it exited or overran)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([live.done], [], [], 0.5)
        if ready:
            os.read(live.done, 1)
            return True
        if live.proc.poll() is not None:
            return False
    return False


def _start(run: Run, *extra: str) -> subprocess.Popen:
    """The run's command (with ``extra`` arguments), its output to its log, in a process
    group of its own: killing a run kills its workers too, not torchrun alone."""
    with open(run.log, "w") as log:
        return subprocess.Popen([*run.cmd, *extra], env=run.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _drop(run: Run, proc: subprocess.Popen, why: str = "") -> bool:
    """Kill a failed run (if it still runs) and print why, its exit status and its log's
    tail; False, for ``ok or _drop(...)``."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    tail = run.log.read_text(errors="replace")[-3000:] if run.log.exists() else ""
    cause = f"{why}, " if why else ""
    print(f"FAILED ({cause}exit {proc.returncode}): {' '.join(run.cmd)}\n{tail}", flush=True)
    return False


def _finished(run: Run, proc: subprocess.Popen, timeout: float, why: str = "") -> bool:
    """Whether the run exits with 0 within ``timeout``; else it is killed and reported."""
    try:
        return proc.wait(timeout) == 0 or _drop(run, proc, why)
    except subprocess.TimeoutExpired:
        return _drop(run, proc, f"{why or 'run'} past {timeout:g} s")


def take_turns(runs: list[Run], epochs: int, timeout: float) -> list[bool]:
    """Run ``runs`` in turns (module docstring): each starts alone, then ``epochs`` rounds of
    one epoch each, then each reports and exits alone. ``timeout`` bounds each turn. Returns
    which runs finished (exit 0); a failed one's log tail is printed."""
    lives, ok = [], []
    for i, run in enumerate(runs):
        prefix = f"{run.log}.turn{i}"
        go, done = _fifo(Path(f"{prefix}.go")), _fifo(Path(f"{prefix}.done"))
        lives.append(_Live(run, _start(run, "--turns", prefix), go, done))
        ok.append(_given(lives[-1], timeout) or _drop(run, lives[-1].proc, "set-up"))
    for k in range(epochs + 1):  # the timed epochs, then the last turn: report and exit
        for i, live in enumerate(lives):
            if not ok[i]:
                continue
            os.write(live.go, b"." * live.run.processes)
            if k < epochs:
                ok[i] = _given(live, timeout) or _drop(live.run, live.proc, f"epoch {k + 1}")
            else:
                ok[i] = _finished(live.run, live.proc, timeout, "report")
    for live in lives:
        os.close(live.go)
        os.close(live.done)
    return ok


def run_one(run: Run, timeout: float) -> bool:
    """Run one benchmark run alone, start to end; whether it finished (else it is killed
    past ``timeout``, as in turns, and its log's tail is printed)."""
    return _finished(run, _start(run), timeout)


def run_all(runs: list[Run], epochs: int, timeout: float, interleave: bool) -> list[bool]:
    """Which of ``runs`` finished: run in turns (:func:`take_turns`), or each start to end."""
    if interleave:
        return take_turns(runs, epochs, timeout)
    return [run_one(run, timeout) for run in runs]
