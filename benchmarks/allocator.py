"""Does sarcompile's CPU memory machinery pay for its lines? One training job under each allocator setting.

    python benchmarks/allocator.py                                  # 50k nodes / 1M edges, N = 1, 2, 3 repeats
    python benchmarks/allocator.py --nodes 20000 --edges 400000 --repeat 1 --epochs 2   # a quick look

The job is benchmarks/vs_dgl.py's: its SBM graph (symmetric, self-loops, 128 features, 16
classes), METIS-partitioned for 1 and 2 workers, and its three-layer SAGE (256 hidden) with
Adam, full-batch; one plain process for N=1, torchrun (gloo) for N=2. It runs under each
setting of :data:`CONFIGS`, which switch off the pieces one at a time:

* the glibc tuning (``SARCOMPILE_MALLOC=auto``: fixed mmap and trim thresholds, so freed
  large tensors leave the resident set; ``off``: glibc's own thresholds);
* the huge-page request made at import (``THP_MEM_ALLOC_ENABLE``; a value set beforehand,
  ``0`` here, is left alone);
* the C++ caching allocator in torch's place (``SARCOMPILE_CPU_CACHE=0`` turns it off);
* tcmalloc preloaded (``LD_PRELOAD`` of ``sarcompile allocator``'s path). sarcompile then
  leaves glibc's thresholds, the cache and huge pages alone by itself (tune_allocator and
  request_huge_pages do nothing off glibc).

The exchange also had a Python buffer pool of its own when this benchmark's record in
results/allocator.json was measured (at d80acb0): settings ``C`` (without it) and ``F``
(tcmalloc with it) there. It changed nothing measurable, so it was deleted, and with it those two
settings (their letters are not reused, so that the record still reads).

Each run is its own process (or torchrun group) and reports, per worker, the median timed
step, the peak resident size above its floor (``VmHWM`` after the imports and torch's lazy
optimizer imports, as vs_dgl_worker.py), the peak within a timed step (``VmHWM`` reset
before each), and the minor page faults of a timed step (``getrusage``), with what the
process actually ran with (allocator, tuned, cache figures). The machine is two
shared cores, so all runs of a repeat take turns epoch by epoch (benchmarks/turns.py: a
slow spell hits every setting's same round), the order rotates between repeats, and the
figures are medians over ``--repeat`` fresh repeats. Writes benchmarks/results/allocator.json
and allocator.png and prints a table with ratios to ``A`` (today's default).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from harness import partition, write_result  # (benchmarks/: on the path above)
from turns import Run, Turns, run_all

RESULTS = HERE / "results"
MiB = 2**20
TCMALLOC = "<tcmalloc>"  # stands for the library's path in CONFIGS

# name -> (what it is, the environment it adds). Every run starts from an environment
# without any of these variables (nor MALLOC_*), so each says all it sets.
CONFIGS: dict[str, tuple[str, dict[str, str]]] = {
    "A": ("default: tuning + huge pages + C++ cache", {}),
    "B": ("no C++ cache", {"SARCOMPILE_CPU_CACHE": "0"}),
    "D": ("none (glibc's own thresholds)", {"SARCOMPILE_MALLOC": "off"}),
    "E": ("tcmalloc, nothing else", {"LD_PRELOAD": TCMALLOC, "SARCOMPILE_MALLOC": "off"}),
    "G": ("no huge pages", {"THP_MEM_ALLOC_ENABLE": "0"}),
}
_CLEARED = ("LD_PRELOAD", "SARCOMPILE_MALLOC", "SARCOMPILE_CPU_CACHE", "THP_MEM_ALLOC_ENABLE")


# -- one run (a worker process) ---------------------------------------------------------------

def worker(a: argparse.Namespace) -> None:
    import torch.distributed as dist
    from vs_dgl_worker import sc_model

    import sarcompile as sc
    from sarcompile.dist import cpu_cache, memory

    rank, world = sc.init()
    turns = Turns(a.turns, rank)
    floor = memory.floor_bytes()
    part = sc.load_partition(a.parts)
    x, y = part.node_data["x"], part.node_data["y"]
    torch.manual_seed(0)
    model = sc.distribute(sc_model("sage", x.shape[1], a.hidden, a.classes))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    total = sc.global_sum(torch.tensor(float(y.numel())))

    def step() -> float:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(part.graph, x), y, reduction="sum") / total
        loss.backward()
        sc.sync_gradients(model)
        opt.step()
        return float(sc.global_sum(loss.detach()))

    losses = [step()]  # warm-up: compiles, caches, optimizer state
    turns.give()
    times, faults, step_peaks = [], [], []
    run_peak = 0  # the run's VmHWM: read before each reset, so no stretch is missed
    for _ in range(a.epochs):
        turns.take()
        if turns.driven:
            step()  # back to the steady state after waiting (turns.py)
        run_peak = max(run_peak, memory.status_bytes("VmHWM"))
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS: from here, the peak within this step
        flt0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt0)
        step_peaks.append(memory.status_bytes("VmHWM"))
        turns.give()
    turns.take()
    cache = cpu_cache.stats()
    mine = {"rank": rank, "world": world, "floor_bytes": floor,
            "peak_above_floor_bytes": max(run_peak, *step_peaks) - floor,
            "step_peak_above_floor_bytes": max(step_peaks) - floor,
            "step_s": statistics.median(times), "step_times": times, "step_faults": statistics.median(faults),
            "losses": losses, "threads": torch.get_num_threads(),
            # what the process actually ran with, to check each setting did what it says
            "active_allocator": memory.active_allocator(), "tuned": memory.allocator_tuned(),
            "huge_pages": os.environ.get("THP_MEM_ALLOC_ENABLE") == "1", "cpu_cache": cpu_cache.installed(),
            "cpu_cache_stats": None if cache is None else dataclasses.asdict(cache)}
    everyone = [mine]
    if world > 1:
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
    sc.shutdown()
    if rank == 0:
        tmp = Path(a.out).with_suffix(".tmp")
        tmp.write_text(json.dumps(everyone))
        tmp.replace(a.out)


# -- the driver -------------------------------------------------------------------------------

def _runs(a: argparse.Namespace, tmp: Path, tcmalloc: str | None) -> list[tuple[dict, Run, Path]]:
    """(row tag, Run, its JSON record) for every setting and worker count."""
    from vs_dgl import launcher

    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in _CLEARED}
    runs = []
    for name in a.configs:
        extra = {k: (tcmalloc if v == TCMALLOC else v) for k, v in CONFIGS[name][1].items()}
        if tcmalloc is None and TCMALLOC in CONFIGS[name][1].values():
            sys.exit(f"setting {name} preloads tcmalloc, which is not installed here (python -m sarcompile "
                     "allocator says how to install it); leave it out with --configs")
        for n in a.workers:
            out = tmp / f"{name}{n}.json"
            env = {**base, **extra, "OMP_NUM_THREADS": str(max((os.cpu_count() or 1) // n, 1))}
            cmd = launcher(n) + [str(Path(__file__).resolve()), "--worker", "--parts", str(tmp / f"parts{n}"),
                                 "--out", str(out), "--epochs", str(a.epochs), "--hidden", str(a.hidden),
                                 "--classes", str(a.classes)]
            runs.append(({"config": name, "workers": n}, Run(cmd, env, n, out.with_suffix(".log")), out))
    return runs


def measure(a: argparse.Namespace) -> list[dict]:
    """One row per run that finished: its setting, worker count, repeat and workers' records."""
    from vs_dgl import make_graph

    from sarcompile.dist.memory import find_allocator

    tcmalloc = find_allocator("tcmalloc")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_graph(tmp / "graph.pt", a.nodes, a.edges, a.features, a.classes)
        for n in a.workers:
            partition(["--edges", str(tmp / "graph.pt")], n, tmp / f"parts{n}")
        runs = _runs(a, tmp, tcmalloc)
        for r in range(a.repeat):
            turn = runs[r % len(runs):] + runs[:r % len(runs)]  # a different order each repeat
            for _, _, out in turn:
                out.unlink(missing_ok=True)
            finished = run_all([run for _, run, _ in turn], a.epochs, a.timeout, interleave=True)
            for (tag, _, out), ok in zip(turn, finished):
                if ok and out.exists():
                    rows.append({**tag, "repeat": r, "per_worker": json.loads(out.read_text())})
                    print(f"repeat {r}: {line(rows[-1])}", flush=True)
    return rows


# Per run, over its workers: the slowest step and the largest peaks and fault counts.
FIGURES = ("step_s", "peak_above_floor_bytes", "step_peak_above_floor_bytes", "step_faults")


def figures(row: dict) -> dict[str, float]:
    return {k: max(w[k] for w in row["per_worker"]) for k in FIGURES}


def line(row: dict) -> str:
    f = figures(row)
    return (f"{row['config']} N={row['workers']}: step {f['step_s']:.2f} s, peak {f['peak_above_floor_bytes'] / MiB:.0f} "
            f"MiB (in a step {f['step_peak_above_floor_bytes'] / MiB:.0f}), {f['step_faults']:.0f} faults a step")


def summarise(rows: list[dict]) -> list[dict]:
    """One entry per (setting, workers): each figure's median over the repeats, and every repeat's."""
    out = []
    for name in dict.fromkeys(r["config"] for r in rows):
        for n in sorted({r["workers"] for r in rows if r["config"] == name}):
            mine = [figures(r) for r in rows if r["config"] == name and r["workers"] == n]
            out.append({"config": name, "what": CONFIGS[name][0], "workers": n, "repeats": len(mine),
                        **{k: statistics.median(f[k] for f in mine) for k in FIGURES},
                        "each": {k: [f[k] for f in mine] for k in FIGURES}})
    return out


def _ratio(s: dict, ref: dict | None, key: str) -> str:
    return f"{s[key] / ref[key]:.2f}x" if ref and ref[key] else "-"


def table(summary: list[dict]) -> str:
    """Markdown: one line per (workers, setting), ratios to A on as many workers."""
    out = [("| N | setting | step (s) | vs A | peak above floor (MiB) | vs A | peak in a step (MiB) | faults a step "
            "| vs A |"), "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in sorted({s["workers"] for s in summary}):
        ref = next((s for s in summary if s["config"] == "A" and s["workers"] == n), None)
        for s in (s for s in summary if s["workers"] == n):
            out.append(f"| {n} | {s['config']}: {s['what']} | {s['step_s']:.2f} | {_ratio(s, ref, 'step_s')} | "
                       f"{s['peak_above_floor_bytes'] / MiB:.0f} | {_ratio(s, ref, 'peak_above_floor_bytes')} | "
                       f"{s['step_peak_above_floor_bytes'] / MiB:.0f} | {s['step_faults']:.0f} | "
                       f"{_ratio(s, ref, 'step_faults')} |")
    return "\n".join(out)


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("step_s", "median step (s)", 1), ("peak_above_floor_bytes", "peak above floor (MiB)", MiB),
              ("step_faults", "minor page faults a step", 1))
    names = list(dict.fromkeys(s["config"] for s in summary))
    workers = sorted({s["workers"] for s in summary})
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4))
    width = 0.8 / len(workers)
    for ax, (key, label, unit) in zip(axes, panels):
        for j, n in enumerate(workers):
            xs, ys = [], []
            for i, name in enumerate(names):
                s = next((s for s in summary if s["config"] == name and s["workers"] == n), None)
                if s is None:
                    continue
                x = i + (j - (len(workers) - 1) / 2) * width
                xs.append(x)
                ys.append(s[key] / unit)
                ax.plot([x] * len(s["each"][key]), [v / unit for v in s["each"][key]], "k.", markersize=3)
            ax.bar(xs, ys, width, label=f"N={n}")
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel(label)
        ax.legend(fontsize="small")
    fig.suptitle("SAGE on an SBM graph, per setting (bars: medians over repeats; dots: each repeat): "
                 + "; ".join(f"{n} {CONFIGS[n][0]}" for n in names), fontsize="x-small", wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--edges", type=int, default=1_000_000, help="directed edges, self-loops included")
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    ap.add_argument("--epochs", type=int, default=3, help="timed steps of each run, after one warm-up")
    ap.add_argument("--repeat", type=int, default=3, help="fresh runs of every setting, taking turns")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a turn may take")
    ap.add_argument("--out", default=str(RESULTS / "allocator.json"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one run (started by the driver)
    ap.add_argument("--parts", help=argparse.SUPPRESS)
    ap.add_argument("--turns", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return
    rows = measure(a)
    summary = summarise(rows)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {k: getattr(a, k) for k in ("nodes", "edges", "features", "classes", "hidden", "workers", "configs",
                                         "epochs", "repeat")}
    write_result(out.stem, {"config": config, "settings": {k: {"what": v[0], "env": v[1]} for k, v in CONFIGS.items()},
                "summary": summary, "runs": rows}, out.parent)
    plot(summary, out.with_suffix(".png"))
    print(table(summary))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
