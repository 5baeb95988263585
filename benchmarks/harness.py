"""What the benchmarks share: the launcher, the graphs they generate, their figures and
their results files.

- :func:`launch` runs a Python script or module in fresh processes: one plain process, or
  ``--nproc-per-node N`` workers under torchrun (``python -m torch.distributed.run
  --standalone``), with a bounded wait; :func:`command` is the same command line for a
  caller that starts it itself (benchmarks/turns.py).
- :func:`partition` is ``sarcompile partition`` in a fresh process, as a user runs it.
- :func:`sbm_file` writes the learnable planted-block graph the training benchmarks use;
  :func:`random_graph` is the single-layer benchmarks' graph of uniform in-degree.
- :func:`figure` is the row (or grid) of matplotlib panels every figure here is.
- :func:`write_result` writes ``results/<name>.json`` atomically, with the machine, the
  command, the commit and the date beside the benchmark's own payload.

Only the standard library is imported here at module level: the zoos import this file in
DGL's environment too, and torch and matplotlib load only where a function needs them.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS_ENV = "SARCOMPILE_BENCH_RESULTS"  # a folder for results instead of benchmarks/results (smoke runs)
FLAGS = ("avx512f", "avx2", "fma")  # the CPU flags a result records: what the kernels' speed depends on
STOP_GRACE_S = 30  # what a timed-out command gets to stop its workers before they are killed
TAIL_LINES = 80  # of a failed command's output, in its error: torchrun's own report of a failure is 40


# --- results ------------------------------------------------------------------------------
def results_dir() -> Path:
    """Where results go: ``$SARCOMPILE_BENCH_RESULTS`` if set, else benchmarks/results."""
    return Path(os.environ.get(RESULTS_ENV) or HERE / "results")


def machine() -> dict[str, Any]:
    """This machine as results record it: lscpu's model name, which of :data:`FLAGS` the CPU
    has (in that order), and the number of cores Python sees."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    fields = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in out.splitlines() if ":" in line)}
    flags = set(fields.get("Flags", "").split())
    return {"cpu": fields.get("Model name"), "flags": [f for f in FLAGS if f in flags], "cores": os.cpu_count()}


def commit(mark_dirty: bool = False) -> str | None:
    """The checkout's short commit, or None outside a git checkout (or without git); with
    ``mark_dirty``, ``+dirty`` after it when sarcompile/ has uncommitted changes (a row
    measured then is not quite that commit's)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    if head and mark_dirty and git("status", "--porcelain", "--", "sarcompile"):
        head += "+dirty"
    return head or None


def invocation(argv: Sequence[str] | None = None) -> str:
    """The benchmark's command line as a user would type it from the repository root:
    ``python benchmarks/x.py --flag value``, quoted for a shell."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve() if argv else None
    if script is not None and script.is_relative_to(ROOT):
        argv[0] = str(script.relative_to(ROOT))
    return shlex.join(["python", *argv])


def provenance() -> dict[str, Any]:
    """The fields :func:`write_result` adds: machine, command, commit, date (UTC, ISO 8601)."""
    return {"machine": machine(), "command": invocation(), "commit": commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def write_result(name: str, payload: dict, directory: Path | None = None) -> Path:
    """Write ``payload`` with :func:`provenance`'s fields (which replace any of the same
    name) to ``<directory>/<name>.json`` (default :func:`results_dir`); return the path.
    Atomic: the JSON goes to a temporary file beside it that then replaces it, so a reader,
    or a run stopped half-way, never sees a half-written file."""
    directory = results_dir() if directory is None else Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    tmp = directory / f".{name}.json.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps({**payload, **provenance()}, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# --- launching ----------------------------------------------------------------------------
class LaunchError(RuntimeError):
    """A launched command failed or ran out of time: the message names the command, its exit
    code (or the timeout) and the end of what it printed."""

    def __init__(self, cmd: Sequence[str], returncode: int | None, output: str, timeout: float | None = None):
        self.cmd, self.returncode, self.output = list(cmd), returncode, output
        why = f"did not finish in {timeout:g} s and was killed" if returncode is None else f"exited {returncode}"
        tail = "\n".join(output.strip().splitlines()[-TAIL_LINES:])
        super().__init__(f"{shlex.join(self.cmd)} {why}; the end of its output:\n{tail}")


@dataclass
class Launched:
    """A finished command: its exit code (0 unless ``check=False``), what it printed, how long it took."""

    cmd: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def command(args: Sequence[str], nproc: int | None = None) -> list[str]:
    """The command line running ``args`` (a script and its arguments, or ``-m module ...``):
    this Python for ``nproc`` None, else ``nproc`` workers under torchrun on this machine."""
    if nproc is None:
        return [sys.executable, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args]


def launch(args: Sequence[str], nproc: int | None = None, env: dict[str, str] | None = None, timeout: float = 3600,
           *, check: bool = True, on_line: Callable[[str], None] | None = None, base_env: dict[str, str] | None = None,
           echo: bool = False) -> Launched:
    """Run :func:`command` ``(args, nproc)`` from the repository root and wait at most
    ``timeout`` seconds. The environment is ``base_env`` (default this process's) with
    ``env`` over it. Both outputs are captured; ``on_line`` sees each stdout line (with its
    newline) as it comes, for a caller that prints progress or times epochs; ``echo`` prints
    the command line (``$ ...``, without the interpreter's path) before it starts.

    On a timeout the command is stopped with its workers (:func:`_stop`). Raises :class:`LaunchError` on a timeout, and on a non-zero
    exit unless ``check`` is False."""
    cmd = command(args, nproc)
    if echo:
        print("$ " + shlex.join(cmd[1:]), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**(os.environ if base_env is None else base_env), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    err: list[str] = []

    def pump(stream, into: list[str], each: Callable[[str], None] | None) -> None:
        for line in stream:
            into.append(line)
            if each is not None:
                each(line)

    # Both pipes drain at once: a worker that fills one while we read the other would block.
    readers = [threading.Thread(target=pump, args=(proc.stdout, out, on_line), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, err, None), daemon=True)]
    start = time.perf_counter()
    for r in readers:
        r.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        for r in readers:
            r.join(timeout=10)
        raise LaunchError(cmd, None, "".join(out) + "".join(err), timeout) from None
    for r in readers:
        r.join()
    done = Launched(cmd, proc.returncode, "".join(out), "".join(err), time.perf_counter() - start)
    if check and done.returncode != 0:
        raise LaunchError(cmd, done.returncode, done.stdout + done.stderr)
    return done


def _stop(proc: subprocess.Popen) -> None:
    """Stop ``proc`` and every process under it. torchrun starts each worker in a session of
    its own, so a process-group kill misses them: SIGTERM asks the agent to stop its workers
    (a plain script just ends), and whatever is left after :data:`STOP_GRACE_S` is killed."""
    family = _descendants(proc.pid)
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_GRACE_S)
    for pid in [proc.pid, *family, *_descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def _descendants(pid: int) -> list[int]:
    """The processes under ``pid`` now, children first (from /proc; none elsewhere)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):  # (a process may end while we read)
            parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        frontier = [p for p, pp in parent.items() if pp in frontier]
        found += frontier
    return found


def partition(source: Sequence[str], parts: int, out: Path, env: dict[str, str] | None = None, **launch_args
              ) -> Launched:
    """``sarcompile partition SOURCE... --parts PARTS --out OUT`` in a fresh process (through
    :func:`launch`, which ``launch_args`` go to); SOURCE is the graph's flags
    (``["--edges", "graph.pt"]``, ``["--synthetic", "mag", "--scale", "1"]``)."""
    return launch(["-m", "sarcompile", "partition", *source, "--parts", str(parts), "--out", str(out)], None, env,
                  **launch_args)


# --- graphs -------------------------------------------------------------------------------
def sbm_file(path: Path, nodes: int, pairs_per_node: float, *, classes: int = 16, p_in: float = 0.7,
             features: int = 64, self_loops: bool = False, noise: float = 0.0) -> None:
    """Save the training benchmarks' graph where ``sarcompile partition --edges`` reads it: a
    stochastic block model (examples/make_graph.py's, seed 0) of ``nodes`` nodes, ``classes``
    classes and ``pairs_per_node * nodes`` random pairs, both directions of each (so the
    average in-degree is ``2 * pairs_per_node``), ``p_in`` of them inside a class; with
    ``self_loops`` one per node more. ``noise`` > 0 adds Gaussian noise of that std (seed 1)
    to the features and then standardises them: harder to learn, so that accuracies differ."""
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    from make_graph import sbm

    data = sbm(nodes, classes, pairs_per_node, p_in, features, seed=0)
    if self_loops:
        loops = torch.arange(nodes)
        data["src"] = torch.cat([data["src"], loops])
        data["dst"] = torch.cat([data["dst"], loops])
    if noise:
        x = data["x"] + noise * torch.randn(data["x"].shape, generator=torch.Generator().manual_seed(1))
        data["x"] = (x - x.mean(0)) / x.std(0)  # standardised: raw values ~noise wide slow Adam down
    torch.save(data, path)


def random_graph(nodes: int, degree: int, seed: int = 0):
    """Edges ``(src, dst)`` giving every node ``degree`` in-edges from uniformly random sources."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    dst = torch.arange(nodes).repeat_interleave(degree)
    src = torch.randint(0, nodes, (nodes * degree,), generator=gen)
    return src, dst


# --- figures ------------------------------------------------------------------------------
@contextlib.contextmanager
def figure(path: Path, panels: int = 1, *, rows: int = 1, size: tuple[float, float] = (4.5, 3.5), dpi: int = 100,
           title: str | None = None) -> Iterator[list]:
    """A figure of ``rows`` x ``panels`` axes, each ``size`` inches (width, height), yielded
    row by row as one flat list; on leaving, it is laid out, saved to ``path`` (PNG) and
    closed. matplotlib draws off-screen (Agg): benchmarks run on machines without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, panels, figsize=(size[0] * panels, size[1] * rows), squeeze=False)
    try:
        yield [ax for row in axes for ax in row]
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
