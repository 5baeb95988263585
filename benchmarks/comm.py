"""Communication reduction: bytes, time and accuracy of stale halos and compression.

    python benchmarks/comm.py                  # the full run (~10 min on 2 cores); resumable
    python benchmarks/comm.py --table          # the README's markdown table from results/comm.json
    python benchmarks/comm.py --quick          # a tiny check of the script (results/comm_quick.json)
    python benchmarks/comm.py --name comm_dense_e100 --epochs 100 --graphs dense --models sage \
        --configs exact 1bit 1bit-noef int8    # dense SAGE is still improving at epoch 40

For two generated SBM graphs (``sbm``: average degree ~10; ``dense``: ~50, both after
symmetrising), the models SAGE and GCN (2 layers, hidden 256) and each configuration

    exact      exact SAR (the default)
    stale2/5/10  --staleness K: remote rows refreshed every K iterations (DIGEST)
    1bit       --compress 1bit, error feedback (the default)
    1bit-noef  --compress 1bit --no-error-feedback: stochastic rounding (Sylvie as published)
    int8       --compress int8, error feedback

it partitions the graph (METIS, 4 parts), trains 40 epochs under
``torchrun --standalone --nproc-per-node 4 -m sarcompile.train`` and records from the
trainer's per-epoch log: the feature/gradient bytes a training step sends (forward +
backward, summed over workers, mean over epochs), the parameter all-reduce bytes, their
ratio to exact's, the median training-step time (``train_s``) and epoch time, the final
(last-epoch) test accuracy, the test accuracy at the best validation epoch, and the final
accuracy's difference to exact's in points.

Node features are 256 wide. Compression sends each row as ``width * bits / 8`` bytes plus
4 bytes of per-row ``lo`` and ``scale`` (bfloat16), so 1 bit cuts a float32 row by
``32 / (1 + 32 / width)``: 28x at width 256, but only 25.6x at 128 -- too close to the 25x
target for layers whose rows are narrower. With 256-wide features (and hidden 256) every
layer's exchanged rows are 256 wide, except where a layer exchanges its transformed
output (as GCN's last layer may: ``num_classes`` wide), which no input width changes.
The features get extra Gaussian noise (then are standardised per column), and the dense
graph fewer same-class edges (``GRAPHS``), so that not every configuration reaches 100%:
accuracy differences stay visible. Each row is one run (seed 0): final accuracies move by a few
tenths of a point between seeds, so read differences that small as ties.

A modelled slow link: loopback communication between processes on one machine is nearly
free, so the measured ``train_s`` is taken as the compute time, and the epoch time over a
10 Gbit/s link is modelled as ``median train_s + max over workers of (bytes sent +
received per training step: features, gradients, all-reduce) * 8 / 10e9``.

Rows are written to benchmarks/results/comm.json (atomically, after each run) with
comm.png; a rerun with the same sizes measures only the rows missing from it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from harness import LaunchError, commit, figure, launch, partition, results_dir, sbm_file, write_result

# name -> (average degree after symmetrising, fraction of edges inside a class, std of the
# Gaussian noise added to the features). The dense graph has fewer same-class edges: with
# 50 neighbours at 0.7 GCN reaches 100% test accuracy, whatever the features' noise.
GRAPHS = {"sbm": (10, 0.7, 10.0), "dense": (50, 0.4, 20.0)}
MODELS = ("sage", "gcn", "gin", "gat")
CONFIGS = {
    "exact": [],
    "stale2": ["--staleness", "2"],
    "stale5": ["--staleness", "5"],
    "stale10": ["--staleness", "10"],
    "1bit": ["--compress", "1bit"],
    "1bit-noef": ["--compress", "1bit", "--no-error-feedback"],
    "int8": ["--compress", "int8"],
}
LINK_BITS_PER_S = 10e9  # the modelled slow link
FEATURE_PHASES = ("forward", "backward")


def _summarise(records: list[dict]) -> dict:
    """One row's numbers from the trainer's per-epoch log records."""

    def per_epoch(direction: str, phases: tuple[str, ...]) -> list[float]:
        """Bytes of ``phases`` per worker, mean over epochs."""
        ranks = len(records[0]["comm"][direction]["forward"])
        return [statistics.fmean(sum(r["comm"][direction].get(p, [0] * ranks)[k] for p in phases) for r in records)
                for k in range(ranks)]

    best = max(records, key=lambda r: r["val_acc"])  # the first best epoch
    sent_fb = sum(per_epoch("sent", FEATURE_PHASES))
    link = [s + r for s, r in zip(per_epoch("sent", FEATURE_PHASES + ("allreduce",)),
                                  per_epoch("received", FEATURE_PHASES + ("allreduce",)))]
    train_s = statistics.median(r["train_s"] for r in records)
    return {
        "epochs": len(records),
        "feature_bytes": sent_fb,  # forward + backward sent per training step, all workers
        "allreduce_bytes": sum(per_epoch("sent", ("allreduce",))),
        "train_s": train_s,
        "epoch_s": statistics.median(r["epoch_s"] for r in records),
        "link_bytes_max": max(link),  # the busiest worker's sent + received per step
        "modelled_10g_s": train_s + max(link) * 8 / LINK_BITS_PER_S,
        "test_acc": records[-1]["test_acc"],
        "val_acc": records[-1]["val_acc"],
        "best_val_acc": best["val_acc"],
        "best_val_test_acc": best["test_acc"],
        "best_epoch": best["epoch"],
        "loss": records[-1]["loss"],
    }


def run(a: argparse.Namespace, save, rows: list[dict]) -> list[dict]:
    """Every (graph, model, config) not yet in ``rows``, in turn; ``save(rows)`` after each,
    so a long run that is stopped keeps what it measured and a rerun goes on from there."""
    done_before = {(r["graph"], r["model"], r["config"]) for r in rows}
    env = {"OMP_NUM_THREADS": "1", "SARCOMPILE_TIMEOUT": "900"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name in a.graphs:
            todo = [(m, c) for m in a.models for c in a.configs if (name, m, c) not in done_before]
            if not todo:
                continue
            graph, parts = tmp / f"{name}.pt", tmp / f"parts_{name}"
            degree, p_in, noise = GRAPHS[name]
            sbm_file(graph, a.nodes, degree / 2, p_in=p_in, features=a.features, noise=noise)  # degree on average
            partition(["--edges", str(graph)], a.workers, parts, env=env)
            for model, config in todo:
                out = tmp / f"run_{name}_{model}_{config}"
                t0 = time.perf_counter()
                try:  # keep going after a failure; say what failed
                    launch(["-m", "sarcompile.train", "--parts", str(parts), "--model", model, "--layers",
                            str(a.layers), "--hidden", str(a.hidden), "--epochs", str(a.epochs), "--checkpoint-every",
                            "0", "--no-progress", "--out", str(out), *CONFIGS[config]], a.workers, env,
                           timeout=a.timeout)
                except LaunchError as e:
                    print(f"{name} {model} {config}: FAILED: {e}", flush=True)
                    continue
                log = out / "log.jsonl"
                records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
                row = {"graph": name, "model": model, "config": config, "args": CONFIGS[config],
                       "commit": commit(mark_dirty=True), "wall_s": round(time.perf_counter() - t0, 1), **_summarise(records)}
                rows.append(row)
                save(rows)
                print(_line(row, rows), flush=True)
    return rows


def _exact(rows: list[dict], row: dict) -> dict | None:
    return next((r for r in rows if (r["graph"], r["model"], r["config"]) == (row["graph"], row["model"], "exact")),
                None)


def _line(row: dict, rows: list[dict]) -> str:
    ex = _exact(rows, row)
    ratio = f"x{ex['feature_bytes'] / row['feature_bytes']:.1f} fewer" if ex and row["feature_bytes"] else ""
    return (f"{row['graph']:<5} {row['model']:<4} {row['config']:<9} features+grads "
            f"{row['feature_bytes'] / 2**20:7.2f} MiB/step {ratio:<12} step {row['train_s']:.3f}s  "
            f"epoch {row['epoch_s']:.3f}s  10G {row['modelled_10g_s']:.3f}s  test {row['test_acc']:.4f}  "
            f"({row['wall_s']:.0f}s)")


ORDER = {c: i for i, c in enumerate(CONFIGS)}


def _sorted(rows: list[dict]) -> list[dict]:
    graphs = list(GRAPHS)
    return sorted(rows, key=lambda r: (graphs.index(r["graph"]) if r["graph"] in graphs else 99,
                                       MODELS.index(r["model"]) if r["model"] in MODELS else 99,
                                       ORDER.get(r["config"], 99)))


def targets(rows: list[dict]) -> list[str]:
    """Whether each of the issue's targets is met, from the rows measured."""
    out = []
    onebit = [r for r in rows if r["config"] in ("1bit", "1bit-noef") and _exact(rows, r)]
    if onebit:
        cuts = [(_exact(rows, r)["feature_bytes"] / r["feature_bytes"], r) for r in onebit]
        worst, wr = min(cuts, key=lambda c: c[0])
        out.append(f"- 1-bit cuts feature/gradient bytes by >= 25x: {'met' if worst >= 25 else 'NOT met'} "
                   f"(smallest cut x{worst:.1f}, {wr['graph']} {wr['model']} {wr['config']})")
    sage = [r for r in rows if r["model"] == "sage" and r["config"] == "1bit" and _exact(rows, r)]
    if sage:
        deltas = [(100 * (r["test_acc"] - _exact(rows, r)["test_acc"]), r) for r in sage]
        worst, wr = min(deltas, key=lambda d: d[0])
        out.append(f"- SAGE, 1-bit with error feedback, final test accuracy no more than 1 point below exact: "
                   f"{'met' if worst >= -1 else 'NOT met'} (worst {worst:+.2f} points, {wr['graph']})")
    pairs = [(r, n) for r in rows if r["config"] == "1bit" for n in rows
             if n["config"] == "1bit-noef" and (n["graph"], n["model"]) == (r["graph"], r["model"])]
    if pairs:
        worse = [f"{r['graph']} {r['model']} ({100 * (r['test_acc'] - n['test_acc']):+.2f})" for r, n in pairs
                 if r["test_acc"] < n["test_acc"]]
        out.append(f"- error feedback no worse than without it (final test accuracy, 1-bit): "
                   f"{f'met ({len(pairs)} graph/model pairs)' if not worse else 'NOT met on ' + ', '.join(worse)}")
    return out


def table(rows: list[dict], config: dict) -> str:
    """The rows as the README's markdown table, then the targets."""
    intro = (f"{config['nodes']} nodes, {config['features']} features, {config['layers']} layers x "
             f"{config['hidden']} hidden, {config['workers']} workers, {config['epochs']} epochs. Bytes are per "
             f"training step, summed over workers; times are medians over epochs (step: the training step alone).")
    header = ("| graph | model | config | features+grads sent | vs exact | all-reduce | step | epoch "
              "| step at 10 Gbit/s (modelled) | final test acc | vs exact (points) | test acc at best val |")
    lines = [intro, "", header, "|" + " --- |" * 12]
    for r in _sorted(rows):
        ex = _exact(rows, r)
        cut = f"/{ex['feature_bytes'] / r['feature_bytes']:.1f}" if ex and r["feature_bytes"] else "-"
        if r["config"] == "exact":
            cut = "1"
        delta = f"{100 * (r['test_acc'] - ex['test_acc']):+.2f}" if ex else "-"
        lines.append(f"| {r['graph']} | {r['model']} | {r['config']} | {r['feature_bytes'] / 2**20:.2f} MiB "
                     f"| {cut} | {r['allreduce_bytes'] / 2**20:.2f} MiB | {r['train_s']:.3f} s "
                     f"| {r['epoch_s']:.3f} s | {r['modelled_10g_s']:.3f} s | {100 * r['test_acc']:.2f} "
                     f"| {delta} | {100 * r['best_val_test_acc']:.2f} |")
    return "\n".join(lines + ["", "Targets:", *targets(rows)])


def _plot(rows: list[dict], path: Path) -> None:
    from matplotlib import colormaps
    from matplotlib.ticker import NullFormatter

    panels = [(g, m) for g in GRAPHS for m in MODELS
              if any((r["graph"], r["model"]) == (g, m) for r in rows)]
    if not panels:
        return
    colors = dict(zip(CONFIGS, colormaps["tab10"].colors))
    with figure(path, len(panels), rows=2) as axes:
        for col, (g, m) in enumerate(panels):
            mine = [r for r in _sorted(rows) if (r["graph"], r["model"]) == (g, m)]
            ax = axes[col]
            for r in mine:
                ax.scatter(r["feature_bytes"] / 2**20, 100 * r["test_acc"], color=colors.get(r["config"]),
                           label=r["config"])
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # the decades only: minor labels overlap
            ax.set_xlabel("features + gradients sent per step (MiB)")
            ax.set_ylabel("final test accuracy (%)")
            ax.set_title(f"{m}, {g} graph")
            ax = axes[len(panels) + col]
            xs = range(len(mine))
            ax.bar([x - 0.2 for x in xs], [r["train_s"] for r in mine], width=0.4, label="step (measured)")
            ax.bar([x + 0.2 for x in xs], [r["modelled_10g_s"] for r in mine], width=0.4, label="step at 10 Gbit/s")
            ax.set_xticks(list(xs), [r["config"] for r in mine], rotation=45, fontsize=7)
            ax.set_ylabel("seconds")
        axes[0].legend(fontsize=7)
        axes[len(panels)].legend(fontsize=7)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8000)
    ap.add_argument("--features", type=int, default=256)
    ap.add_argument("--graphs", nargs="+", choices=list(GRAPHS), default=list(GRAPHS))
    ap.add_argument("--models", nargs="+", default=["sage", "gcn"])
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--name", default="comm")
    ap.add_argument("--quick", action="store_true",
                    help="check the script: 1000 nodes, 3 epochs, 2 workers, sbm, sage, exact and 1bit")
    ap.add_argument("--table", action="store_true", help="print results/NAME.json as a markdown table; run nothing")
    a = ap.parse_args()
    if a.quick:
        a.nodes, a.epochs, a.workers, a.graphs, a.models = 1000, 3, 2, ["sbm"], ["sage"]
        a.configs, a.name = ["exact", "1bit"], "comm_quick"
    out = results_dir()
    sizes = ("nodes", "features", "workers", "layers", "hidden", "epochs")
    config = {k: getattr(a, k) for k in sizes}

    def save(rows: list[dict]) -> None:
        write_result(a.name, {"config": config, "graphs": GRAPHS, "rows": _sorted(rows)})
        _plot(rows, out / f"{a.name}.png")

    # Resume: rows measured by an earlier run with the same sizes are kept, not redone.
    previous = out / f"{a.name}.json"
    rows = []
    if previous.exists():
        old = json.loads(previous.read_text())
        if a.table:  # the earlier run's sizes, whatever the flags say
            config = old["config"]
        same = all(old["config"].get(k) == config[k] for k in sizes) and old.get("graphs") == json.loads(
            json.dumps(GRAPHS))
        rows = old["rows"] if same else []
    if a.table:
        print(table(rows, config))
    else:
        run(a, save, rows)
        print(table(rows, config))


if __name__ == "__main__":
    main()
