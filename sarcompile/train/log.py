"""What a run reports: the JSONL log (one record per epoch, with every rank's traffic and time
ledger), the line printed per epoch, and the summary each worker prints at the end.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import torch

from sarcompile.data.rundir import _atomic_write
from sarcompile.errors import RunDirError
from sarcompile.dist import cpu_cache
from sarcompile.dist.collectives import global_sum
from sarcompile.dist.traffic import TIME_LEDGER, stats
from sarcompile.dist.memory import (
    MMAP_THRESHOLD,
    MemoryProbe,
    active_allocator,
    allocator_tuned,
    find_allocator,
    huge_pages_requested,
)
from sarcompile.train.config import ALWAYS_LOGGED, PHASES, TASKS, TrainConfig


RUN_NAME = "run.json"  # the run's id, in its run directory; every log record carries it


def _run_id(out: Path, resume: bool) -> str | None:
    """The run's id: for a fresh run a new one, saved in ``out/run.json`` (atomically); when
    resuming the saved one, or None for a run directory from before ids (its log's records
    carry none)."""
    path = out / RUN_NAME
    if resume:
        try:
            run = json.loads(path.read_text()).get("run")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, AttributeError) as e:
            raise RunDirError(f"cannot read the run's id from '{path}' ({e}): the run directory is damaged; "
                              "start a fresh run in another --out") from None
        if not isinstance(run, str):
            raise RunDirError(f"'{path}' holds no run id: the run directory is damaged; start a fresh run in "
                              "another --out")
        return run
    run = uuid.uuid4().hex
    _atomic_write(path, lambda f: f.write((json.dumps({"run": run}) + "\n").encode()))
    return run


def _check_log_owner(path: Path, run: str | None) -> None:
    """Refuse to resume into a log that holds another run's records (resuming rewrites the
    log, keeping its own run's records up to the checkpoint) or that is damaged before its
    last line (a kill may cut only the last one short)."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):
                continue
            raise RunDirError(f"the log '{path}' is damaged at line {i} of {len(lines)} (not a JSON record): "
                              "resuming would drop it; repair or move the log, or pass another --log") from None
        if not isinstance(rec, dict) or rec.get("run") != run:
            whose = f"run {rec.get('run')}" if isinstance(rec, dict) and rec.get("run") else "a run without an id"
            raise RunDirError(
                f"the log '{path}' holds another run's records (line {i}: {whose}; this run is "
                f"{run or 'one without an id'}): resuming would overwrite them; pass this run's own log with "
                "--log, or another path"
            )


def _prepare_log(path: Path, keep_through: int) -> None:
    """Keep the log's lines of epochs <= ``keep_through`` (0: start empty), atomically."""
    kept = []
    if keep_through > 0 and path.is_file():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            if isinstance(rec, dict) and isinstance(rec.get("epoch"), int) and rec["epoch"] <= keep_through:
                kept.append(line + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, lambda f: f.write("".join(kept).encode()))


def _comm_summary(cfg: TrainConfig) -> str:
    """The communication reduction options for the start line ('' when exact)."""
    parts = []
    if cfg.staleness != 1:
        parts.append(f"staleness={cfg.staleness}")
    if cfg.bounded_staleness is not None:
        parts.append(f"bounded_staleness={cfg.bounded_staleness}")
    if cfg.compress is not None:
        parts.append(f"compress={cfg.compress}" + ("" if cfg.error_feedback else " (stochastic rounding)"))
    if parts and cfg.compress_layers is not None:
        parts.append(f"layers {' '.join(cfg.compress_layers)}")
    return "".join(", " + p for p in parts)


def _own_row(rank: int, world_size: int, values: list[float]) -> torch.Tensor:
    """``values`` in row ``rank`` of a zero ``[world_size, len(values)]`` float64 tensor, so
    that summing the tensors of all workers gathers everyone's row."""
    table = torch.zeros(world_size, len(values), dtype=torch.float64)
    table[rank] = torch.tensor(values, dtype=torch.float64)
    return table


def _comm_row(rank: int, world_size: int) -> torch.Tensor:
    """This worker's bytes since ``stats.reset()`` (sent per phase, then received) in its row."""
    return _own_row(rank, world_size, [stats.sent.get(p, 0) for p in PHASES] +
                    [stats.received.get(p, 0) for p in PHASES])


def _time_row(rank: int, world_size: int, step_s: float, optimizer_s: float) -> torch.Tensor:
    """This worker's time ledger of a step of ``step_s`` seconds (TIME_LEDGER) in its row."""
    ledger = stats.time_ledger(step_s, optimizer_s)
    return _own_row(rank, world_size, [ledger[k] for k in TIME_LEDGER])


def _comm_record(table: torch.Tensor) -> dict[str, dict[str, list[int]]]:
    """The log's ``comm`` field from the gathered ``[world_size, 2 * len(PHASES)]`` table:
    bytes per rank, by direction and phase; idle optional phases left out."""
    out: dict[str, dict[str, list[int]]] = {}
    for d, direction in enumerate(("sent", "received")):
        out[direction] = {}
        for i, phase in enumerate(PHASES):
            column = [int(v) for v in table[:, d * len(PHASES) + i]]
            if phase in ALWAYS_LOGGED or any(column):
                out[direction][phase] = column
    return out


def _fmt(acc: float | None) -> str:
    return "   -  " if acc is None else f"{acc:.4f}"


def _metric(rec: dict[str, Any]) -> str:
    """The metric an epoch's record holds (acc, rocauc or rmse: see sarcompile.train.tasks)."""
    return next(name for name in TASKS.values() if f"val_{name}" in rec)


def _epoch_line(rec: dict[str, Any]) -> str:
    m = _metric(rec)
    return (
        f"epoch {rec['epoch']:>4}  loss {rec['loss']:.6f}  {'' if m == 'acc' else m + ' '}train "
        f"{_fmt(rec[f'train_{m}'])}  val {_fmt(rec[f'val_{m}'])}  test {_fmt(rec[f'test_{m}'])}  {rec['epoch_s']:.2f}s"
    )


def _report(records: list[dict[str, Any]], probe: MemoryProbe, rank: int, world_size: int, start: int, floor: int,
            estimate: int) -> None:
    """Final accuracies and every worker's peak memory above its floor (the resident size
    after the imports) next to the plan's estimate of it, printed by rank 0."""
    peaks = gather_peaks(probe, rank, world_size, floor, estimate)
    if rank != 0:
        return
    if records:
        r, m = records[-1], _metric(records[-1])
        print(f"final (epoch {r['epoch']}): " + "  ".join(f"{k}_{m} {_fmt(r[f'{k}_{m}'])}" for k in ("train", "val", "test")),
              flush=True)
    else:
        print(f"nothing to train: the checkpoint is at epoch {start}, --epochs asks for no more" if start else
              "nothing to train: --epochs 0", flush=True)
        return
    for r, peak in enumerate(peaks):
        print(peak_line(r, peak, "training"), flush=True)
    print(f"allocator: {_allocator_line()}", flush=True)
    for r in range(world_size):
        print(f"worker {r}: per epoch {_time_line(records, r)}", flush=True)
    if world_size > 1:  # one worker communicates nothing
        for r in range(world_size):
            print(f"worker {r}: per epoch {_traffic_line(records, r)}", flush=True)


def gather_peaks(probe: MemoryProbe, rank: int, world_size: int, floor: int, estimate: int) -> list[dict[str, int]]:
    """Every worker's memory, on every rank (one all-reduce): ``peak_above_floor_bytes``
    (its resident peak during ``probe`` above ``floor``, the resident size after the
    imports: :func:`~sarcompile.dist.memory.floor_bytes`), ``estimate_bytes`` (the
    plan's estimate of that peak) and ``added_bytes`` (the peak above the probe's start)."""
    keys = ("peak_above_floor_bytes", "estimate_bytes", "added_bytes")
    mem = global_sum(_own_row(rank, world_size, [probe.peak_bytes - floor, estimate, probe.added_bytes]))
    return [dict(zip(keys, map(int, row))) for row in mem.tolist()]  # (float64: exact below 2**53 bytes)


def peak_line(rank: int, peak: dict[str, int], during: str) -> str:
    """One worker's line of :func:`gather_peaks`' figures, in MiB; ``during``: what the probe covered."""
    mib = {k: v / 2**20 for k, v in peak.items()}
    return (f"worker {rank}: peak {mib['peak_above_floor_bytes']:.0f} MiB above the imports (plan's estimate "
            f"{mib['estimate_bytes']:.0f} MiB), +{mib['added_bytes']:.0f} MiB during {during}")


def _allocator_line() -> str:
    """Which malloc the workers ran with, and how to run with tcmalloc when they did not."""
    name = active_allocator()
    if name != "glibc":
        return name
    if allocator_tuned():
        pages = "; tensors of 2 MiB or more on huge pages, for fewer page faults" if huge_pages_requested() else ""
        kept = (f"; freed tensors of {MMAP_THRESHOLD >> 10} KiB or more kept for reuse by sarcompile's CPU cache, "
                "never more than were in use at once" if cpu_cache.installed() else "")
        return (f"glibc's malloc; sc.init() fixed its mmap threshold at {MMAP_THRESHOLD >> 10} KiB, so freed "
                f"tensors leave no holes in its heap{kept}{pages} (SARCOMPILE_MALLOC=off: glibc's own, see "
                "docs/benchmarks.md)")
    hint = "LD_PRELOAD=$(sarcompile allocator) before torchrun" if find_allocator() else \
        "install tcmalloc and LD_PRELOAD=$(sarcompile allocator)"
    return f"glibc's malloc (it keeps freed memory in heap holes; {hint} for less memory, see docs/benchmarks.md)"


def _time_line(records: list[dict[str, Any]], rank: int) -> str:
    """The median training step of ``rank`` and its time ledger's median parts (the first
    epoch, which warms caches and allocates the optimizer's state, left out when there are others)."""
    steady = records[1:] or records

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    step = median([sum(rec["time"][k][rank] for k in TIME_LEDGER) for rec in steady])  # the rank's own step
    parts = {k: median([rec["time"][k][rank] for rec in steady]) for k in TIME_LEDGER}
    share = lambda k: f" ({100 * parts[k] / step:.0f}%)" if step > 0 else ""
    return (f"step {step:.2f} s: compute {parts['compute']:.2f} s, waiting on the exchange "
            f"{parts['exchange_wait']:.2f} s{share('exchange_wait')}, all-reduce {parts['allreduce']:.2f} s"
            f"{share('allreduce')}, optimizer {parts['optimizer']:.2f} s")


def _traffic_line(records: list[dict[str, Any]], rank: int) -> str:
    """Mean bytes per epoch that ``rank`` sent and received, by phase, from the records."""
    short = {"forward": "fwd", "backward": "bwd", "allreduce": "allreduce"}
    halves = []
    for direction in ("sent", "received"):
        sizes = [
            f"{short[p]} {_size(sum(rec['comm'][direction][p][rank] for rec in records) / len(records))}"
            for p in ALWAYS_LOGGED
        ]
        halves.append(f"{direction} " + ", ".join(sizes))
    return "; ".join(halves)


def _size(nbytes: float) -> str:
    """``nbytes`` in a fixed-width binary unit: '  1.2 MiB', '512.0 B  '."""
    for unit in ("B  ", "KiB", "MiB"):
        if nbytes < 1024:
            return f"{nbytes:5.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:5.1f} GiB"
