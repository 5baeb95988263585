"""benchmarks/turns.py: benchmark runs take turns epoch by epoch, a failed run is dropped
while the others finish, and a worker whose driver is gone exits instead of waiting."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

from commands import ROOT, import_script

turns = import_script(ROOT / "benchmarks" / "turns.py")

# A stand-in for vs_dgl_worker.py: NAME RANK RANKS EPOCHS JOURNAL FAIL_AT [--turns PREFIX].
# Each "epoch" appends "NAME RANK k" to the journal, with a pause that lets a run that broke
# the protocol (ran out of turn) show up interleaved. Rank 0 ends a turn once every rank
# has noted it, as the all-reduce that ends a real run's epoch holds it back (without that,
# a rank slow to start wrote its set-up line into the next run's turn).
WORKER = """
import os, sys, time
sys.path.insert(0, {bench!r})
from turns import Turns
name, rank, ranks, epochs, journal, fail_at = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                               sys.argv[5], int(sys.argv[6]))
t = Turns(sys.argv[8] if len(sys.argv) > 8 else None, rank)
def note(tag):
    with open(journal, "a") as f:
        f.write(f"{{name}} {{rank}} {{tag}}\\n")
    open(f"{{journal}}.{{name}}.{{rank}}.{{tag}}", "w").close()  # this rank is through the turn
def end_turn(tag):
    deadline = time.monotonic() + 20
    while rank == 0 and not all(os.path.exists(f"{{journal}}.{{name}}.{{r}}.{{tag}}") for r in range(ranks)):
        if time.monotonic() > deadline:
            sys.exit(f"rank 0 of {{name}}: the other ranks did not finish turn {{tag}}")
        time.sleep(0.005)
    t.give()
note("setup"); end_turn("setup")
for k in range(1, epochs + 1):
    t.take()
    if k == fail_at:
        sys.exit(3)
    time.sleep(0.02)
    note(k); end_turn(k)
t.take(); note("report")
""".format(bench=str(ROOT / "benchmarks"))


def _run(tmp: Path, name: str, epochs: int, ranks: int = 1, fail_at: int = 0) -> "turns.Run":
    script = tmp / "worker.py"
    script.write_text(WORKER)
    journal = tmp / "journal"
    # several "ranks" of one run: one shell starting them all and failing if one fails, as
    # torchrun starts its workers
    starts = " ".join(f"{sys.executable} {script} {name} {r} {ranks} {epochs} {journal} {fail_at} \"$@\" & pids+=($!);"
                      for r in range(ranks))
    shell = f"pids=(); {starts} for p in \"${{pids[@]}}\"; do wait $p || exit $?; done"
    return turns.Run(["bash", "-c", shell, "run"], dict(os.environ), ranks, tmp / f"{name}.log")


def test_runs_take_turns_epoch_by_epoch(tmp_path):
    runs = [_run(tmp_path, "a", 3), _run(tmp_path, "b", 3, ranks=2), _run(tmp_path, "c", 3)]
    assert turns.take_turns(runs, epochs=3, timeout=30) == [True, True, True]
    lines = (tmp_path / "journal").read_text().split()
    events = [tuple(lines[i:i + 3]) for i in range(0, len(lines), 3)]
    turn_of = lambda e: (e[0], e[2])  # noqa: E731  (both ranks of b share each turn)
    order = list(dict.fromkeys(turn_of(e) for e in events))
    assert order == [("a", "setup"), ("b", "setup"), ("c", "setup"),
                     *[(n, str(k)) for k in (1, 2, 3) for n in "abc"],
                     ("a", "report"), ("b", "report"), ("c", "report")]
    # no turn's lines are split by another's: each run's turn is whole before the next starts
    assert len(order) == len([k for k, _ in itertools.groupby(map(turn_of, events))])
    assert sum(1 for e in events if e[0] == "b") == 2 * 5  # both ranks of b, every turn


def test_a_failed_run_is_dropped_and_the_others_finish(tmp_path, capsys):
    runs = [_run(tmp_path, "a", 3), _run(tmp_path, "b", 3, fail_at=2), _run(tmp_path, "c", 3)]
    assert turns.take_turns(runs, epochs=3, timeout=30) == [True, False, True]
    assert "FAILED (epoch 2" in capsys.readouterr().out
    lines = (tmp_path / "journal").read_text().splitlines()
    assert "b 0 2" not in lines and "a 0 report" in lines and "c 0 3" in lines


def test_a_run_that_overruns_its_turn_is_killed_within_the_timeout(tmp_path, capsys):
    stuck = turns.Run([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), 1, tmp_path / "s.log")
    start = time.monotonic()
    assert turns.take_turns([stuck, _run(tmp_path, "a", 1)], epochs=1, timeout=2) == [False, True]
    assert time.monotonic() - start < 15
    assert "FAILED (set-up" in capsys.readouterr().out


def test_a_worker_exits_when_its_driver_is_gone(tmp_path):
    go, done = tmp_path / "p.go", tmp_path / "p.done"
    os.mkfifo(go)
    os.mkfifo(done)
    driver_go, driver_done = os.open(go, os.O_RDWR), os.open(done, os.O_RDWR)
    worker = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
                               f"from turns import Turns\nt = Turns({str(tmp_path / 'p')!r}); t.give(); t.take()"],
                              stderr=subprocess.PIPE, text=True)
    assert os.read(driver_done, 1) == b"."  # its turn 0 is over; now it waits for the next
    os.close(driver_go)  # the driver dies: the last writer of the go pipe is gone
    os.close(driver_done)
    _, err = worker.communicate(timeout=10)
    assert worker.returncode != 0 and "driver is gone" in err


def test_without_a_driver_every_turn_is_at_once(tmp_path):
    journal = tmp_path / "journal"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    subprocess.run([sys.executable, str(script), "solo", "0", "1", "2", str(journal), "0"], check=True, timeout=30)
    assert journal.read_text().split("\n")[:-1] == ["solo 0 setup", "solo 0 1", "solo 0 2", "solo 0 report"]


def test_run_all_without_interleaving_runs_each_start_to_end(tmp_path, capsys):
    runs = [_run(tmp_path, "a", 2), _run(tmp_path, "b", 2, fail_at=1), _run(tmp_path, "c", 2)]
    assert turns.run_all(runs, epochs=2, timeout=30, interleave=False) == [True, False, True]
    assert "FAILED (exit 3)" in capsys.readouterr().out
    assert (tmp_path / "journal").read_text().splitlines() == [
        "a 0 setup", "a 0 1", "a 0 2", "a 0 report", "b 0 setup", "c 0 setup", "c 0 1", "c 0 2", "c 0 report"]


def test_run_all_without_interleaving_kills_a_stuck_run_and_its_workers_within_the_timeout(tmp_path, capsys):
    """A stuck run is killed as in turns, with the workers its launcher started (as
    torchrun starts its ranks): none is left running."""
    pid = tmp_path / "worker.pid"
    stuck = turns.Run(["bash", "-c", f"sleep 60 & echo $! > {pid}; wait"], dict(os.environ), 1, tmp_path / "s.log")
    start = time.monotonic()
    assert turns.run_all([stuck, _run(tmp_path, "a", 1)], epochs=1, timeout=2, interleave=False) == [False, True]
    assert time.monotonic() - start < 15
    assert "FAILED (run past 2 s" in capsys.readouterr().out
    worker = int(pid.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{worker}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{worker}").exists(), "the stuck run's worker outlived it"
