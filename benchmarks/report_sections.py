"""The benchmarks page's sections: per benchmark, what it measures (for users), how to run
it, which result files it shows, and how their JSON becomes Markdown tables.

Kept apart from benchmarks/report.py, which assembles the page, the README's regions and the
check: this module is the page's content, that one its machinery. Reads JSON only (no torch),
so that the page can be rebuilt anywhere in a second. Each renderer shows the current
figures, summarised for a reader; the scripts' own ``--table`` flags print every field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

MiB = 2**20
Results = dict[str, dict]  # result file name (in benchmarks/results/) -> its JSON


@dataclass(frozen=True)
class Section:
    """One benchmark on the page. ``title`` is its heading (other pages link to its anchor:
    keep it stable); ``about`` says what it measures and how to read it; ``run`` is how to run
    it; ``files`` are the result files it shows; ``render`` turns those present into Markdown
    lines (it is called only when at least one is present)."""

    title: str
    about: str
    run: str
    files: tuple[str, ...]
    render: Callable[[Results], list[str]]


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str) -> list[str]:
    """A Markdown table: ``align`` has one letter per column, ``l`` or ``r``."""
    if len(align) != len(header):
        raise ValueError(f"table: {len(header)} columns but align {align!r} has {len(align)} letters")
    rule = ["---:" if a == "r" else "---" for a in align]
    return [f"| {' | '.join(map(str, line))} |" for line in (header, rule, *rows)]


def mib(n: float) -> str:
    return f"{n / MiB:.0f} MiB"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def span(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    """``lo-hi`` (or one value where they are equal, as formatted)."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


# --- coverage: the zoos and the model sweeps ---------------------------------------------------

ZOOS = {"pyg_zoo.json": "`torch_geometric.nn` (conv classes, option variants, ready-made models; dropout variants)",
        "pyg_hetero_zoo.json": "PyG heterogeneous (`HeteroConv`, `to_hetero`, HGT, ...)",
        "dgl_zoo.json": "`dgl.nn` (conv classes, option variants; dropout variants)",
        "dgl_hetero_zoo.json": "DGL heterogeneous (`HeteroGraphConv`, RGCN, ...)"}
SWEEPS = {"models_sweep.json": "PyG and plain torch (typed ones among them)",
          "dgl_models_sweep.json": "DGL (typed ones among them)"}
FAILURES = ("WRONG", "CRASH", "HANG")


def zoo_table(data: Results) -> list[str]:
    """A row per zoo: its cases by outcome (the counts its sweep wrote)."""
    rows = []
    for name, label in ZOOS.items():
        if name in data:
            c = data[name]["meta"]["counts"]
            rows.append((label, sum(c.values()), c["exact"], c["refused"], c["n/a"], sum(c[k] for k in FAILURES)))
    return table(("zoo", "cases", "exact", "refused", "not applicable", "wrong, crash or hang"), rows, "lrrrrr")


def sweep_table(data: Results) -> list[str]:
    """A row per model sweep: each model's outcome in eval and in train mode."""
    rows = []
    for name, label in SWEEPS.items():
        if name in data:
            records = data[name]["records"]
            cells = []
            for mode in ("eval", "train"):
                mine = [r["outcome"] for r in records if r["mode"] == mode]
                exact, refused = mine.count("exact"), mine.count("refused")
                cells += [exact, refused, len(mine) - exact - refused]
            rows.append((label, len({r["model"] for r in records}), *cells))
    return table(("models sweep", "models", "eval: exact", "refused", "other", "train: exact", "refused", "other"),
                 rows, "lrrrrrrr")


def coverage(data: Results) -> list[str]:
    return [*zoo_table(data), "", *sweep_table(data)]


# --- sarcompile against DGL --------------------------------------------------------------------

OWN_SETTINGS = ("off",)  # sarcompile's own allocator settings: compared with DGL as a user runs it


def _peak(row: dict) -> float:
    return max(w["peak_above_floor_bytes"] for w in row["per_worker"])


def _epoch(row: dict) -> float:
    return max(w["epoch_s"] for w in row["per_worker"])


def _wait(row: dict) -> str:
    """The slowest worker's share of its step spent waiting on the exchange."""
    w = max(row["per_worker"], key=lambda w: w["epoch_s"])
    t = w.get("time_ledger")
    return f"{100 * t['exchange_wait'] / sum(t.values()):.0f}%" if t and row["workers"] > 1 else ""


def dgl_rows(rows: list[dict]) -> list[tuple]:
    """The comparison's rows: peak per worker and epoch, as ratios to DGL's one process with
    the same allocator (epochs at N = 1 only: N workers share the cores)."""
    out = []
    for r in rows:
        setting = "default" if r["allocator"] in OWN_SETTINGS else r["allocator"]
        ref = next((d for d in rows if d["engine"] == "dgl" and d["model"] == r["model"]
                    and d["allocator"] == setting), None)
        estimates = [w["estimate"]["peak_bytes"] for w in r["per_worker"] if "estimate" in w]
        out.append((r["model"].upper() if r["model"] != "sage" else "SAGE", r["allocator"], r["engine"], r["workers"],
                    mib(_peak(r)), ratio(_peak(r), _peak(ref)) if ref else "", f"{_epoch(r):.2f} s",
                    ratio(_epoch(r), _epoch(ref)) if ref and r["workers"] == 1 else "",
                    mib(max(estimates)) if estimates else "", _wait(r)))
    return out


def vs_dgl(data: Results) -> list[str]:
    rows = [r for name in ("vs_dgl_sage.json", "vs_dgl_gat.json", "vs_dgl_rgcn.json")
            for r in data.get(name, {}).get("rows", [])]
    return table(("model", "setting", "engine", "workers", "peak per worker", "vs DGL", "epoch", "vs DGL",
                  "plan estimate", "waiting on the exchange"), dgl_rows(rows), "lllrrrrrrr")


def dgl_headline(data: Results) -> list[str]:
    """The README's summary: SAGE and GAT under the default setting, sarcompile's runs only."""
    rows = [r for name in ("vs_dgl_sage.json", "vs_dgl_gat.json") for r in data.get(name, {}).get("rows", [])]
    mine = [(m, w, p, pr, e, er) for m, s, eng, w, p, pr, e, er, _, _ in dgl_rows(rows)
            if s == "default" and eng == "sarcompile"]
    return table(("model", "workers", "peak memory per worker", "vs DGL's one process", "epoch", "vs DGL"),
                 mine, "lrrrrr")


# --- cost growth, compile time, dense products, one GAT layer ----------------------------------

def growth(data: Results) -> list[str]:
    rows, summary = [], []
    all_rows = data["growth.json"]["rows"]
    for n in dict.fromkeys(r["workers"] for r in all_rows):
        mine = [r for r in all_rows if r["workers"] == n]
        per_edge = [r["epoch_s"] / r["edges"] for r in mine]
        per_node = [r["peak_bytes"] * n / r["nodes"] for r in mine]
        for r, t, m in zip(mine, per_edge, per_node):
            rows.append((n, f"{r['nodes']:,}", f"{r['edges']:,}", f"{r['epoch_s']:.2f}", f"{1e6 * t:.3f}",
                         ratio(t, min(per_edge)), f"{r['peak_bytes'] / MiB:.0f}", f"{m:.0f}", ratio(m, min(per_node))))
        summary.append(f"N = {n}: time per edge within {ratio(max(per_edge), min(per_edge))} of its smallest value, "
                       f"memory per node within {ratio(max(per_node), min(per_node))}.")
    return [*table(("workers", "nodes", "edges", "epoch (s)", "s per M edges", "vs smallest",
                    "peak (MiB, largest worker)", "bytes per node (all workers)", "vs smallest"), rows, "rrrrrrrrr"),
            "", " ".join(summary)]


def compile_time(data: Results) -> list[str]:
    d = data["compile_time.json"]
    stages = ", ".join(f"{k} {1e3 * v:.1f}" for k, v in d["stages_s"].items())
    return [*table(("compile", "median"), [("first model in a fresh process", f"{d['first_s']:.2f} s"),
                                           ("a later model (3-layer SAGE)", f"{1e3 * d['later_s']:.0f} ms"),
                                           ("a 3-layer GAT", f"{1e3 * d['gat_s']:.0f} ms")], "lr"),
            "", f"By stage (ms): {stages}."]


def dense_rate(data: Results) -> list[str]:
    d = data["dense_rate.json"]
    p = d["peak"]
    peak = p["all_threads_gflops"]
    rows = [(f"`{r['product']}`", r["engine"], f"{r['ms']:.1f} ms", f"{r['gflops']:.0f} GFLOP/s",
             f"{100 * r['gflops'] / peak:.0f}%") for r in d["products"]]
    return [(f"FMA peak: {p['one_core_gflops']:.0f} GFLOP/s on one core, **{peak:.0f} GFLOP/s** on {d['threads']} "
            f"threads, at {p['clock_ghz']:.2f} GHz under load ({d['rows']:,} rows, torch {d['torch']})."), "",
            *table(("product", "engine", "time", "rate", "of peak"), rows, "llrrr")]


def gat_single(data: Results) -> list[str]:
    d = data["gat_single.json"]
    pyg, ours = d["results"]["pyg"], d["results"]["sarcompile"]
    return table(("engine", "median step", "peak memory"),
                 [("PyG `GATConv`", f"{pyg['median_s']:.2f} s", mib(pyg["peak_bytes"])),
                  ("sarcompile `GATConv` (compiled, fused)", f"{ours['median_s']:.2f} s", mib(ours["peak_bytes"])),
                  ("ratio", f"**{ratio(ours['median_s'], pyg['median_s'])}**",
                   f"**{ratio(ours['peak_bytes'], pyg['peak_bytes'])}**")], "lrr")


# --- workers: scaling and communication ---------------------------------------------------------

def _added_estimate(w: dict) -> int:
    e = w["estimate"]
    return e["saved_activations"] + e["remote_blocks"] + e["workspace"] + e["gradients"]


def scaling(data: Results) -> list[str]:
    """One row per model, degree and worker count; the modes side by side."""
    by_key: dict[tuple, dict[str, dict]] = {}
    for name in ("scaling_sage_100k.json", "scaling_gat_100k.json"):
        for r in data.get(name, {}).get("rows", []):
            by_key.setdefault((r["model"], r["degree"], r["workers"]), {})[r["mode"]] = r
    rows, worst = [], []
    for (model, degree, n), modes in by_key.items():
        measured = {mode: mib(max(w["measured_added_bytes"] for w in r["per_worker"])) for mode, r in modes.items()}
        sar = modes["sar"]["per_worker"]
        est = [_added_estimate(w) / w["measured_added_bytes"] for r in modes.values() for w in r["per_worker"]]
        worst += est
        recv = max(sum(w["traffic"]["received"].get(k, 0) for k in ("forward", "backward")) for w in sar)
        rows.append((model, degree, n, measured["sar"], mib(max(_added_estimate(w) for w in sar)), span(est),
                     measured.get("stash", ""), measured.get("oneshot", ""), f"{max(w['step_s'] for w in sar):.2f} s",
                     mib(recv)))
    return [*table(("model", "in-degree", "workers", "`sar`: measured", "estimated", "estimate / measured (all modes)",
                    "`stash`", "`oneshot`", "`sar` step", "received per step"), rows, "lrrrrrrrrr"),
            "", f"The estimate is within {span(worst)} of the measurement on every worker of every row."]


def allocator(data: Results) -> list[str]:
    """A row per worker count, a column per setting: median step, peak above the floor and
    page faults of a step (the slowest or largest worker's, medians over the repeats)."""
    summary = data["allocator.json"]["summary"]
    settings = {s["config"]: s["what"] for s in summary}
    rows = []
    for n in sorted({s["workers"] for s in summary}):
        mine = {s["config"]: s for s in summary if s["workers"] == n}
        rows.append((n, *(f"{mine[c]['step_s']:.2f} s, {mib(mine[c]['peak_above_floor_bytes'])}, "
                          f"{mine[c]['step_faults']:.0f}" if c in mine else "" for c in settings)))
    return table(("workers", *(f"{c}: {what}" for c, what in settings.items())), rows, "r" * (1 + len(settings)))


def comm(data: Results) -> list[str]:
    """One row per graph, model and run length; per exchange, how many times fewer bytes it
    sent than `exact` and the final test accuracy's difference to exact's, in points."""
    others = [c for c in dict.fromkeys(r["config"] for d in data.values() for r in d["rows"]) if c != "exact"]
    rows, steps = [], {}
    for d in data.values():
        runs = dict.fromkeys((r["graph"], r["model"]) for r in d["rows"])
        for graph, model in runs:
            mine = {r["config"]: r for r in d["rows"] if (r["graph"], r["model"]) == (graph, model)}
            exact = mine["exact"]
            cells = [f"/{exact['feature_bytes'] / mine[c]['feature_bytes']:.1f}, "
                     f"{100 * (mine[c]['test_acc'] - exact['test_acc']):+.2f}" if c in mine else ""
                     for c in others]
            rows.append((graph, model, d["config"]["epochs"], mib(exact["feature_bytes"]),
                         f"{100 * exact['test_acc']:.2f}", *cells))
            for c, r in mine.items():
                steps.setdefault(c, []).append(r["train_s"])
    return [*table(("graph", "model", "epochs", "exact: sent per step", "test acc", *others),
                   rows, "llrrr" + "r" * len(others)), "",
            "Each exchange's cell: how many times fewer bytes it sent than exact (/x), and its final test accuracy "
            "against exact's (points). Median steps (s): "
            + ", ".join(f"{c} {span(t, '{:.3f}')}" for c, t in steps.items())
            + "."]


# --- graphs bigger than one machine, checkpoints, GPU ------------------------------------------

def ooc_partition(data: Results) -> list[str]:
    rows = []
    for name in ("ooc_partition.json", "ooc_partition_papers.json"):
        for r in data.get(name, {}).get("rows", []):
            o, m = r["ooc"], r["metis"]
            whole = (f"{m['cut']:,}", f"{m['peak_mib']:.0f} MiB", f"{m['seconds']:.0f} s") if m else ("", "", "")
            rows.append((data[name]["meta"]["family"], f"{r['nodes']:,}", f"{r['edges']:,}", o["limit"],
                         f"{o['cut']:,}", f"{o['peak_mib']:.0f} MiB", f"{o['seconds']:.0f} s", *whole,
                         f"{r['random_cut']:,}"))
    return table(("graph", "nodes", "edges", "memory limit", "edge cut", "peak", "time", "whole-graph METIS: cut",
                  "peak", "time", "random cut"), rows, "lrrrrrrrrrr")


def predict_ooc(data: Results) -> list[str]:
    out = []
    for run in data["predict_ooc.json"]["rows"]:
        g, ranks = run["graph"], run["ranks"]
        peak = [r["peak_above_floor_mib"] for r in ranks]
        est = [r["inference_estimate_mib"] for r in ranks]
        failed = sorted({c for r in ranks for c, ok in r["checks"].items() if not ok})
        out += table(("graph", "workers", "peak above floor", "inference estimate", "peak / estimate", "training peak",
                      "checks failed"),
                     [(f"{g['nodes']:,} nodes, {g['edges']:,} edges", len(ranks), f"{span(peak, '{:.0f}')} MiB",
                       f"{span(est, '{:.0f}')} MiB", span([p / e for p, e in zip(peak, est)]),
                       f"{span([r['train_peak_above_floor_mib'] for r in ranks], '{:.0f}')} MiB",
                       ", ".join(failed) or "none")], "lrrrrrl")
        out += ["", "Checks on every rank: " + "; ".join(ranks[0]["checks"]) + "."]
    return out


def checkpoint_overlap(data: Results) -> list[str]:
    d = data["checkpoint_overlap.json"]
    rows = [(label, f"{d[k]['median_train_s']:.3f} s", f"{d[k]['median_epoch_wall_s']:.3f} s",
             f"{d[k]['copy_s_per_checkpoint']:.3f} s" if k != "none" else "") for k, label in
            (("none", "no checkpoint"), ("every_1", f"every epoch ({d['checkpoint_mib']:.0f} MiB)"))]
    return [*table(("", "step", "epoch (wall)", "copy per checkpoint"), rows, "lrrr"), "",
            (f"Every epoch against none: step {ratio(d['every_1']['median_train_s'], d['none']['median_train_s'])}, "
            f"epoch {ratio(d['every_1']['median_epoch_wall_s'], d['none']['median_epoch_wall_s'])} "
            f"({d['workers']} worker, {d['threads_per_worker']} thread).")]


def checkpoint_memory(data: Results) -> list[str]:
    d = data["checkpoint_memory.json"]
    t = d["train_n4"]
    rows = [(f"N={len(d[key])}", r["rank"], mib(r["read_added_bytes"]), mib(r["load_added_bytes"]),
             mib(r["added_bytes"]), mib(r["share_bytes"]), f"{r['added_over_share']:.2f}", mib(r["peak_bytes"]))
            for key in ("resume_n4", "resume_n2") for r in d[key]]
    return [(f"Training on 4 workers, a checkpoint of {mib(d['checkpoint_bytes'])} every epoch: whole-process "
             f"peaks {', '.join(mib(b) for b in t['peak_bytes'])}; the largest is **{t['max_over_median']:.2f}x** "
             "the median."),
            "", *table(("resumed on", "rank", "added: read", "added: load", "added", "share", "added / share", "peak"),
                       rows, "lrrrrrrr")]


def gpu_models(data: Results) -> list[str]:
    d = data["gpu_models.json"]
    rows = []
    for r in d["rows"]:
        ex = r.get("exact")
        if not ex:  # an engine raised: its error is in its entry
            errors = "; ".join(f"{e}: {r[e]['error']}" for e in ("sarcompile", "pyg") if "error" in r.get(e, {}))
            rows.append((r["model"], f"failed ({errors})", "", "", "", ""))
            continue
        ours = r["sarcompile"]
        verdict = f"{'yes' if ex['passed'] else '**NO**'} ({ex['errors'][ex['worst']]:.1e}, {ex['worst']})"
        rows.append((r["model"], verdict,
                     f"{1e3 * ours['step_s']:.1f} ms", f"{r['step_ratio']:.2f}x", mib(ours["peak_bytes"]),
                     f"{r['peak_ratio']:.2f}x" if r.get("peak_ratio") is not None else ""))
    return [(f"{d['device']}: {d['nodes']:,} nodes, {d['edges']:,} edges, {d['features']} features, hidden "
            f"{d['hidden']}, float32, tolerance {d['tolerance']:g}."), "",
            *table(("model", "exact (worst error)", "step", "vs PyG", "peak", "vs PyG"), rows, "llrrrr")]


# --- the page, in order -------------------------------------------------------------------------

SECTIONS = (
    Section("Coverage: the layer zoos and the model sweeps",
            "Every layer class of `torch_geometric.nn` and `dgl.nn` (option variants, ready-made models, dropout "
            "variants), and of their heterogeneous wrappers, compiled and run on one machine and on 1-3 workers, "
            "against the layer's own single-machine output and gradients in float64: each case is *exact*, "
            "*refused* at compile time with a message, or *not applicable* (a class with no graph input, say). "
            "The model sweeps do the same for whole models written as PyG's and DGL's examples write them, in eval "
            "mode against eager and in train mode against the compiled model on one machine (dropout masks are "
            "keyed by node and edge id). Every case with its message: `benchmarks/results/*_zoo.md` and "
            "`*models_sweep.md`; `--load --summary` groups the refusals by cause.",
            "`python benchmarks/pyg_zoo.py`, `benchmarks/pyg_hetero_zoo.py`, `benchmarks/models_sweep.py`, and with "
            "the DGL environment's python (`scripts/dgl_env.sh`) `benchmarks/dgl_zoo.py`, "
            "`benchmarks/dgl_hetero_zoo.py`, `benchmarks/dgl_models_sweep.py` (under a minute each)",
            (*ZOOS, *SWEEPS), coverage),
    Section("sarcompile against DGL",
            "One generated graph (a stochastic block model: 100,000 nodes, 2,000,000 directed edges with a "
            "self-loop per node, 128 features, 16 classes), a 3-layer GraphSAGE (mean, hidden 256) and a 2-layer "
            "GAT (4 heads x 64, then 1 head), trained full-batch by DGL 2.1 in one process and by sarcompile in one "
            "process and on 4 torchrun workers (METIS parts); RGCN is DGL's ogbn-mag example model on both sides, "
            "on a MAG-like typed graph (212k nodes, 2.29M edges). Memory is each process's peak resident size "
            "above its floor (after the imports and a first optimizer step), the largest worker's; time is the "
            "median epoch of the slowest worker after a warm-up. All runs of one model take turns epoch by epoch "
            "(`benchmarks/turns.py`, an untimed epoch before each timed one), so that a slow spell of the machine "
            "hits every run alike; `--repeat K` repeats everything and takes the medians. Settings: `default` is "
            "the environment a user has, `off` is `SARCOMPILE_MALLOC=off`, `tcmalloc` preloads tcmalloc "
            "(`LD_PRELOAD=$(sarcompile allocator)`) into both engines' processes. Ratios compare runs with the "
            "same allocator (`off` against DGL's `default`), epochs at N = 1 only: the 4 workers share 2 cores. "
            "\"Waiting on the exchange\" is the slowest worker's share of its step spent blocked on other "
            "workers' blocks. "
            "How to read the epochs: most of a SAGE step is dense products, the same FLOPs on both sides run by "
            "the same MKL, so sarcompile's margin is the work DGL does and it does not (it keeps the first "
            "layer's aggregation of the unchanged input, and runs a layer's narrow linears as one product). "
            "Without tcmalloc DGL faults its tensors in afresh every step, and its epoch moves with what else "
            "the machine holds; the `tcmalloc` rows compare the engines without that.",
            "`python benchmarks/vs_dgl.py --models sage --workers 1 4 --allocator default off tcmalloc --repeat 3 "
            "--out benchmarks/results/vs_dgl_sage.json` (and `gat`, `rgcn`; needs the DGL environment of "
            "`scripts/dgl_env.sh`; about 15 minutes a model)",
            ("vs_dgl_sage.json", "vs_dgl_gat.json", "vs_dgl_rgcn.json"), vs_dgl),
    Section("Cost growth",
            "The DGL comparison's kind of graph at average degree 20, from 50k to 800k nodes, a 3-layer SAGE 256 "
            "wide with Adam, on 1 and 4 workers; the sizes of one worker count take turns epoch by epoch. Time per "
            "million edges and peak bytes per node should stay flat as the graph grows (the bounds: 1.25x and "
            "1.15x of the smallest, at N = 1). Bytes per node count all workers; at N = 4 they share 2 cores.",
            "`python benchmarks/growth.py` (about 20 minutes)", ("growth.json",), growth),
    Section("Compile time",
            "`sc.distribute(model)` plus its first call, for a 3-layer SAGE 64 wide on a 2,000-node graph, in "
            "fresh processes (medians): the first model in a process, after `import sarcompile`; a later model in "
            "the same process; and a 3-layer GAT. The stages are a later SAGE compile's, as "
            "`plan.compile_seconds` gives them (`plan` is the probe run that sizes the plan).",
            "`python benchmarks/compile_time.py` (about 15 s)", ("compile_time.json",), compile_time),
    Section("Dense products against the CPU's peak",
            "On one process most of a SAGE step is dense products. This measures the CPU's multiply-add peak (a "
            "loop of independent FMAs on every thread, the clock from a chain of dependent adds) and the rate of "
            "SAGE's layer products at 100k rows by `torch.mm` (MKL) and by oneDNN. On an AMD CPU MKL runs its "
            "AVX2 code whatever the CPU has, so on an AVX-512 machine it stays below three quarters of the peak.",
            "`LD_PRELOAD=$(python -m sarcompile allocator) python benchmarks/dense_rate.py` (about 15 s)",
            ("dense_rate.json",), dense_rate),
    Section("One GAT layer against PyG",
            "50,000 nodes, 1,000,000 edges (in-degree 20, plus PyG's self-loops), 4 heads x 64 features, forward "
            "and backward, each engine in its own process on one thread; the median of 5 steps after a warm-up, "
            "and the resident-set peak of one step above the resident size before it.",
            "`python benchmarks/gat_single.py` (or `./scripts/bench.sh`, which sets up the benchmark extras first)",
            ("gat_single.json",), gat_single),
    Section("Memory against the number of workers",
            "A generated graph of 100,000 nodes at in-degree about 10 and 100 (1M and 10M edges), METIS-partitioned "
            "for 1, 2, 4 and 8 workers; a 3-layer GraphSAGE (hidden 256) and a 2-layer GAT (4 heads, hidden 256), "
            "each op in three modes: `sar` (remote blocks fetched again in backward), `stash` (kept from forward) "
            "and `oneshot` (the whole halo at once). Per worker, the memory a step adds above its starting "
            "resident size, measured, against the plan's estimate of it (saved activations, remote blocks, "
            "workspace and gradients); the largest worker's figures. 8 workers share 2 cores, so the steps at "
            "N = 8 are slow.",
            "`python benchmarks/scaling.py --nodes 100000 --degrees 10 100 --models sage --workers 1 2 4 8 --name "
            "scaling_sage_100k` (and `--models gat --name scaling_gat_100k`; `--table` prints a results file; a "
            "stopped run keeps its rows and a rerun measures only the missing ones)",
            ("scaling_sage_100k.json", "scaling_gat_100k.json"), scaling),
    Section("The CPU allocator",
            "Which of sarcompile's CPU memory settings pay for their lines. The DGL comparison's kind of graph at "
            "20,000 nodes and 400,000 edges, its 3-layer SAGE (hidden 256) with Adam, on one process and on 2 "
            "torchrun workers, under each setting: `A` the default (`SARCOMPILE_MALLOC=auto`'s fixed glibc "
            "thresholds, huge pages, the C++ caching allocator of `sarcompile/dist/cpu_cache.py`, and the "
            "exchange's Python buffer pool of that commit), the others each without one of them (`D`: none), "
            "and tcmalloc preloaded (`E`; `F` with the pool). Each cell: the slowest worker's median step, the "
            "largest peak resident size above the floor, and the minor page faults of a step; medians of 2 "
            "repeats, the settings taking turns epoch by epoch on 2 shared cores, where a repeat's steps took up "
            "to twice another's: read the memory and the faults, not the times. What it showed: the pool changed "
            "nothing (at N = 2 a peak of 91 against 92 MiB and fewer faults without it; under tcmalloc, nothing "
            "at all), so it was deleted; the caching allocator cuts the faults 3-8x (`B` against `A`); without "
            "any tuning (`D`) the peaks are 1.25-1.39x; tcmalloc has the lowest peaks (0.92-0.95x of `A`'s) and "
            "no page faults in a step, so it is the allocator to use (`LD_PRELOAD=$(sarcompile allocator)`, "
            "[training](training.md)), and the glibc tuning with the caching allocator, which "
            "`sc.init()` sets up, the fallback without it.",
            "`python benchmarks/allocator.py --nodes 20000 --edges 400000 --repeat 2 --epochs 3` (settings `C` "
            "and `F` are gone with the pool)",
            ("allocator.json",), allocator),
    Section("Communication reduction",
            "4 workers, METIS, two generated graphs of 8,000 nodes with 256 features (`sbm`: average degree 10; "
            "`dense`: 50, with fewer same-class edges and noisier features, so that accuracy differences show), "
            "2-layer SAGE and GCN 256 wide, one run (seed 0) per row. The exchanges: `exact`; `staleK`, the halo "
            "every K-th step; `1bit`, one bit a value with error feedback; `1bit-noef`, the published stochastic "
            "rounding; `int8`. Bytes are the features and gradients sent per training step, all workers. Here, on "
            "2 cores and loopback, packing costs more time than the bytes save; compression pays on a network "
            "(`--table` adds each step with the bytes at 10 Gbit/s, modelled). The dense "
            "SAGE rows have not converged at 40 epochs, hence the 100-epoch rows. See "
            "[trading exactness for bandwidth](approximate.md).",
            "`python benchmarks/comm.py` (about 9 minutes; `--table` prints the full table); the 100-epoch rows: "
            "`python benchmarks/comm.py --name comm_dense_e100 --epochs 100 --graphs dense --models sage --configs "
            "exact 1bit 1bit-noef int8`",
            ("comm.json", "comm_dense_e100.json"), comm),
    Section("Partitioning out of core",
            "`sarcompile partition --parts 8 --memory-limit L` on generated graphs: planted blocks (`sbm`, "
            "average degree 20) and a papers100M-like power-law graph at 1/100 scale (`papers`), each command in "
            "a fresh process; the whole-graph METIS run where it fits the machine, and a random assignment's cut "
            "for scale. Peak is the process's VmHWM. How it works: "
            "[graphs bigger than one machine](out-of-core.md).",
            "`python benchmarks/ooc_partition.py` (about an hour); the papers row: `python "
            "benchmarks/ooc_partition.py --family papers --sizes 1110600 --limit 1GiB`",
            ("ooc_partition.json", "ooc_partition_papers.json"), ooc_partition),
    Section("Predictions out of core",
            "A planted-block graph partitioned with a memory limit, one epoch of SAGE (hidden 16) on 8 torchrun "
            "workers, then `python -m sarcompile.predict` on 8. Each rank must open only the manifest and its own "
            "part file, write only its own rows, keep only its node rows of the part file resident, and peak "
            "within the plan's inference estimate + 15% and below its training peak.",
            "`python benchmarks/predict_ooc.py` (about 11 minutes)", ("predict_ooc.json",), predict_ooc),
    Section("Checkpoints in the background",
            "RGCN (hidden 64, node tables 64 wide) on `sarcompile partition --synthetic mag --scale 0.2`, a "
            "checkpoint of the tables and their Adam moments every epoch against only the final one; medians over "
            "the epochs after the first, runs alternated. The loop only copies the checkpoint; the write's CPU "
            "work competes with the step for the cores, so a machine with a core to spare per worker shows less.",
            "`python benchmarks/checkpoint_overlap.py --scale 0.2 --epochs 6 --repeats 2 --workers 1`",
            ("checkpoint_overlap.json",), checkpoint_overlap),
    Section("Checkpoint memory per worker",
            "RGCN on the MAG-like graph at scale 4 (848k nodes), trained on 4 workers with a sharded checkpoint "
            "every epoch, then resumed on 4 and, from the same checkpoint, on 2. A resume's \"added\" is what "
            "reading the checkpoint and loading it into the model raised the resident size by; a worker's "
            "\"share\" is its rows of the node tables and their Adam moments plus the replicated state. The bounds: "
            "peaks within 1.2x of the median worker's, and a resume adding at most 1.1x its share.",
            "`python benchmarks/checkpoint_memory.py --scale 4 --epochs 3` (about 8 minutes)",
            ("checkpoint_memory.json",), checkpoint_memory),
    Section("Whole models on a GPU",
            "examples/train_sage.py's SAGE against the same layers in PyG, and examples/train_pyg.py's SAGE -> "
            "BatchNorm -> GAT model compiled unchanged against itself eager, on one device: output, loss and "
            "every parameter's gradient after a training step within 1e-4 in float32 (errors relative to the "
            "reference's largest magnitude), the median step (forward, loss, backward) and the peak of "
            "`torch.cuda.max_memory_allocated` above the shared inputs. 200k nodes, 4M edges.",
            "`bash benchmarks/gpu_check.sh` on a CUDA machine (the kernel tests, then `benchmarks/gpu_models.py`, "
            "then `benchmarks/kernels.py`; at most 8 minutes on one GPU)",
            ("gpu_models.json",), gpu_models),
)
