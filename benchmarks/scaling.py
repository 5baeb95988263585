"""Memory and time against the number of workers: sar vs stash vs oneshot.

    python benchmarks/scaling.py                       # the full run (long on 2 cores)
    python benchmarks/scaling.py --nodes 20000 --degrees 10 --models sage --workers 1 2 4

For each graph density, model, worker count and mode it partitions a generated graph
(METIS), trains a few steps under torchrun (benchmarks/scaling_worker.py) and records per
worker: the measured memory a step adds above its starting resident size, the plan's
estimate of that (saved activations + remote blocks + workspace + parameter gradients,
which are re-created every step), the median step time and the bytes received. Writes
benchmarks/results/scaling.json and scaling.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import LaunchError, figure, launch, partition, results_dir, sbm_file, write_result


def _graph_file(path: Path, nodes: int, degree: int) -> None:
    sbm_file(path, nodes, degree / 2)  # symmetrised: in-degree = degree on average


def run(a: argparse.Namespace, save, rows: list[dict]) -> list[dict]:
    """Every configuration not yet in ``rows``, in turn; ``save(rows)`` after each, so a
    long run that is stopped keeps what it measured and a rerun goes on from there."""
    done_before = {(r["degree"], r["model"], r["workers"], r["mode"]) for r in rows}
    # A fixed mmap threshold makes glibc hand every large tensor back to the OS when it is
    # freed; with the default (adaptive) one, freed memory stays resident and a step's
    # measured peak depends on what earlier steps happened to leave behind.
    env = {"OMP_NUM_THREADS": "1", "SARCOMPILE_TIMEOUT": "900",
           "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for degree in a.degrees:
            graph = tmp / f"graph{degree}.pt"
            _graph_file(graph, a.nodes, degree)
            for n in a.workers:
                todo = [(m, mode) for m in a.models for mode in a.modes if (degree, m, n, mode) not in done_before]
                if not todo:
                    continue
                parts = tmp / f"parts{degree}_{n}"
                partition(["--edges", str(graph)], n, parts, env=env)
                for model, mode in todo:
                    out = tmp / "run.json"
                    out.unlink(missing_ok=True)
                    try:  # keep going after a failure; say what failed
                        launch([str(HERE / "scaling_worker.py"), "--parts", str(parts), "--model", model, "--mode",
                                mode, "--hidden", str(a.hidden), "--epochs", str(a.epochs), "--out", str(out)],
                               n, env, timeout=a.timeout)
                    except LaunchError as e:
                        print(f"deg {degree} {model} N={n} {mode}: FAILED: {e}", flush=True)
                        continue
                    workers = json.loads(out.read_text())
                    row = {"degree": degree, "model": model, "workers": n, "mode": mode, "per_worker": workers}
                    rows.append(row)
                    save(rows)
                    print(_line(row), flush=True)
    return rows


def reestimate(a: argparse.Namespace, save, rows: list[dict]) -> None:
    """Recompute every row's estimate with the current planner, keeping what was measured:
    the graphs and METIS partitions are regenerated exactly as the run made them."""
    from scaling_worker import build

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for degree in sorted({r["degree"] for r in rows}):
            graph = tmp / f"graph{degree}.pt"
            _graph_file(graph, a.nodes, degree)
            for n in sorted({r["workers"] for r in rows if r["degree"] == degree}):
                parts = tmp / f"parts{degree}_{n}"
                partition(["--edges", str(graph)], n, parts)
                for row in rows:
                    if (row["degree"], row["workers"]) == (degree, n):
                        estimates = build(str(parts), row["model"], row["mode"], a.hidden)[2]
                        for w, e in zip(row["per_worker"], estimates):
                            w["estimate"] = {"peak_bytes": e.peak_bytes, **e.breakdown}
                        print(_line(row), flush=True)
    save(rows)


def _estimated_added(w: dict) -> int:
    e = w["estimate"]
    return e["saved_activations"] + e["remote_blocks"] + e["workspace"] + e["gradients"]


def _line(row: dict) -> str:
    worst = max(row["per_worker"], key=lambda w: w["measured_added_bytes"])
    est = max(_estimated_added(w) for w in row["per_worker"])
    step = max(w["step_s"] for w in row["per_worker"])
    recv = max(w["traffic"]["received"].get("forward", 0) + w["traffic"]["received"].get("backward", 0)
               for w in row["per_worker"])
    ratio = est / worst["measured_added_bytes"] if worst["measured_added_bytes"] else float("nan")
    return (f"deg {row['degree']:>4} {row['model']:<5} N={row['workers']} {row['mode']:<8} "
            f"measured {worst['measured_added_bytes'] / 2**20:8.1f} MiB  estimated {est / 2**20:8.1f} MiB "
            f"(x{ratio:.2f})  step {step:6.2f}s  recv {recv / 2**20:7.1f} MiB")


def table(rows: list[dict]) -> str:
    """The rows as the README's markdown table (max over workers)."""
    lines = ["| model | in-degree | workers | mode | measured (max worker) | estimated | est/measured "
             "| step (median, max worker) | received per step |", "|" + " --- |" * 9]
    for r in sorted(rows, key=lambda r: (r["model"], r["degree"], r["workers"])):
        measured = max(w["measured_added_bytes"] for w in r["per_worker"])
        est = max(_estimated_added(w) for w in r["per_worker"])
        worst = max(_estimated_added(w) / w["measured_added_bytes"] for w in r["per_worker"])
        step = max(w["step_s"] for w in r["per_worker"])
        recv = max(sum(w["traffic"]["received"].get(k, 0) for k in ("forward", "backward")) for w in r["per_worker"])
        lines.append(f"| {r['model']} | {r['degree']} | {r['workers']} | {r['mode']} | {measured / 2**20:.0f} MiB "
                     f"| {est / 2**20:.0f} MiB | {worst:.2f} | {step:.2f} s | {recv / 2**20:.0f} MiB |")
    return "\n".join(lines)


def _plot(rows: list[dict], path: Path) -> None:
    panels = sorted({(r["degree"], r["model"]) for r in rows})
    with figure(path, len(panels)) as axes:
        for ax, (degree, model) in zip(axes, panels):
            for mode, color in zip(("sar", "stash", "oneshot"), ("tab:blue", "tab:orange", "tab:gray")):
                pts = sorted(((r["workers"], r) for r in rows
                              if (r["degree"], r["model"], r["mode"]) == (degree, model, mode)), key=lambda p: p[0])
                if not pts:
                    continue
                ns = [p[0] for p in pts]
                measured = [max(w["measured_added_bytes"] for w in p[1]["per_worker"]) / 2**20 for p in pts]
                estimated = [max(_estimated_added(w) for w in p[1]["per_worker"]) / 2**20 for p in pts]
                ax.plot(ns, measured, marker="o", color=color, label=f"{mode} measured")
                ax.plot(ns, estimated, marker="x", linestyle="--", color=color, label=f"{mode} estimated")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("workers")
            ax.set_ylabel("memory a step adds per worker (MiB)")
            ax.set_title(f"{model}, in-degree ~{degree}")
        axes[0].legend(fontsize=7)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--degrees", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--models", nargs="+", default=["sage", "gat"])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--modes", nargs="+", default=["sar", "stash", "oneshot"])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--name", default="scaling")
    ap.add_argument("--table", action="store_true", help="print results/NAME.json as a markdown table; run nothing")
    ap.add_argument("--reestimate", action="store_true",
                    help="recompute the estimates of the rows already in results/NAME.json; measure nothing")
    a = ap.parse_args()
    out = results_dir()

    config = {k: v for k, v in vars(a).items() if k not in ("reestimate", "table")}

    def save(rows: list[dict]) -> None:
        write_result(a.name, {"config": config, "rows": rows})
        _plot(rows, out / f"{a.name}.png")

    # Resume: rows measured by an earlier run with the same sizes are kept, not redone.
    previous = out / f"{a.name}.json"
    rows = []
    if previous.exists():
        old = json.loads(previous.read_text())
        if a.reestimate or a.table:  # the earlier run's sizes, whatever the flags say
            config = old["config"]
            a.nodes, a.hidden = config["nodes"], config["hidden"]
        same = all(old["config"].get(k) == getattr(a, k) for k in ("nodes", "hidden", "epochs"))
        rows = old["rows"] if same else []
    if a.table:
        print(table(rows))
    elif a.reestimate:
        reestimate(a, save, rows)
    else:
        run(a, save, rows)


if __name__ == "__main__":
    main()
