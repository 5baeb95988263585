"""What the four zoo sweeps share (``pyg_zoo.py``, ``pyg_hetero_zoo.py``, ``dgl_zoo.py``,
``dgl_hetero_zoo.py``): a case's record and how it is judged, the sweep over world sizes,
the Markdown table, the README's summary and the command line.

A zoo script says what its cases are and how one runs: eagerly and compiled on one machine
(handed to :func:`reference`), on a pool of workers (its ``case(part, payload)`` for
``zoo_pool.Pool`` and the rows it puts back together, handed to :func:`distributed`), and how
its graphs are partitioned (handed to :func:`sweep`). Each case ends as exactly one of
``exact``, ``refused``, ``n/a``, ``WRONG``, ``CRASH`` or ``HANG`` (see :func:`judge`).

Neither PyG nor DGL is imported here (the DGL zoos run under torch 2.2 in DGL's
environment).
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import json
import math
import os
import re
import shlex
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Collection

import torch
from harness import commit, write_result
from torch import nn
from zoo_pool import Pool, describe_error, start_server

DT = torch.float64
TOL = 1e-9
WORLD_SIZES = (1, 2, 3)
DETAIL_CHARS = 240  # of a detail in the table (the JSON keeps it whole)

EXACT, REFUSED, NA, WRONG, CRASH, HANG = "exact", "refused", "n/a", "WRONG", "CRASH", "HANG"
OUTCOMES = (EXACT, REFUSED, NA, WRONG, CRASH, HANG)

Compare = Callable[[dict, dict], "tuple[float, float, str]"]


@dataclass
class Record:
    name: str
    group: str
    outcome: str = ""
    detail: str = ""
    diffs: dict[str, float | None] = field(default_factory=dict)  # run -> max abs diff
    errors: dict[str, str] = field(default_factory=dict)  # run -> "Type: message"
    seconds: float = 0.0
    # What the runs are compared with: "eager", or "compiled" (the compiled model on one
    # machine) where the eager model draws random masks (dropout in training)
    oracle: str = "eager"


# --- comparing -----------------------------------------------------------------------------
def diff(got: torch.Tensor | None, want: torch.Tensor | None) -> tuple[float, float]:
    """(max abs difference, the same relative to max(1, |want|)); a missing gradient is zeros."""
    if got is None and want is None:
        return 0.0, 0.0
    if got is None:
        got = torch.zeros_like(want)
    if want is None:
        want = torch.zeros_like(got)
    if got.shape != want.shape:
        return float("inf"), float("inf")
    if not want.numel():
        return 0.0, 0.0
    both_nan = torch.isnan(got) & torch.isnan(want)
    d = torch.where(both_nan, torch.zeros_like(got), (got.to(DT) - want.to(DT)).abs())
    d = torch.nan_to_num(d, nan=float("inf"))
    m = float(d.max())
    scale = max(1.0, float(torch.nan_to_num(want.to(DT).abs(), nan=0.0).max()))
    return m, m / scale


def _record_diff(rec: Record, run: str, got: dict, want: dict, compare: Compare, tol: float = TOL) -> float:
    m, r, what = compare(got, want)
    if r > tol:
        rec.errors[run] = f"differs: {what} off by {m:.3g}"
    return m


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else ""


def _where(tb: str) -> str:
    """The innermost 'File ..., line ..., in ...' of a traceback, shortened."""
    lines = [ln.strip() for ln in tb.splitlines() if ln.strip().startswith("File ")]
    if not lines:
        return "?"
    last = lines[-1].replace('File "', "").replace('"', "")
    for root in (str(Path(__file__).resolve().parents[1]) + "/", "site-packages/"):
        if root in last:
            last = last.split(root, 1)[1]
    return last


# --- one case ------------------------------------------------------------------------------
SEED = 0  # of the compiled models' dropout masks, on one machine and on every worker


def distribute(model: nn.Module) -> nn.Module:
    """``sc.distribute(model)`` with its dropout masks seeded alike wherever it runs: the
    model's own (``seed``) and the attention layers' streams, which draw their seeds from
    torch's RNG when first compiled (seeded here)."""
    import sarcompile as sc

    torch.manual_seed(SEED)
    return sc.distribute(model, seed=SEED)


def reference(case: Any, build: Callable[[str], nn.Module], eager: Callable[[nn.Module], dict],
              compiled: Callable[[nn.Module], dict], library: str,
              compare: Compare, tol: float = TOL) -> tuple[Record, dict | None, dict | None]:
    """A zoo's ``case`` (its ``name``, ``group``, ``build``, ``na``) on one machine: the eager
    model (``eager(build(name))``) and a copy of it compiled (``compiled(model)``, which
    distributes it, see :func:`distribute`). Returns the case's record so far, the result to
    compare with and the model state, or None for both when the case is decided here: ``n/a`` where the case has no model
    (``na`` says why) or the eager ``library`` fails, ``refused`` / ``CRASH`` where the
    compiled model raises (the workers are not run then: they would fail the same way).
    A relative difference over ``tol`` is a difference.

    A model whose eager runs differ under two RNG seeds draws random masks (dropout in
    training): the compiled model draws its own, keyed by node and edge id, so the runs are
    compared with the compiled model on one machine (``oracle="compiled"``) instead; its eval
    mode, a case of its own in the zoos, is compared with eager."""
    rec = Record(case.name, case.group)
    if case.build is None:
        rec.outcome, rec.detail = NA, case.na or ""
        return rec, None, None
    try:
        model = build(case.name)
        state = copy.deepcopy(model.state_dict())
        compiled_model, again = copy.deepcopy(model), copy.deepcopy(model)
        torch.manual_seed(1)
        want = eager(model)
        torch.manual_seed(2)
        random = compare(eager(again), want)[1] > tol
    except Exception as e:
        why = _first_line(e) or f"(no message, at {_where(traceback.format_exc())})"
        rec.outcome, rec.detail = NA, f"eager {library} fails here: {type(e).__name__}: {why}"
        return rec, None, None
    try:
        if random:
            want, rec.oracle = compiled(copy.deepcopy(compiled_model)), "compiled"
        got = compiled(compiled_model)
    except Exception as e:
        err = describe_error(e)
        rec.errors["local"] = f"{err['type']}: {err['message']}"
        rec.outcome = REFUSED if err["sarcompile"] else CRASH
        rec.detail = f"{err['type']}: {err['message']}"
        if not err["sarcompile"]:
            rec.detail = f"one machine: {rec.detail} (at {_where(err['traceback'])})"
        return rec, None, None
    rec.diffs["local"] = _record_diff(rec, "local", got, want, compare, tol)
    return rec, want, state


def distributed(rec: Record, want: dict, pool: Pool, payload: dict, assemble: Callable[[list[dict]], dict],
                compare: Compare, tol: float = TOL) -> None:
    """Runs one case on every worker of ``pool`` and records the run (``"2w"``): a timeout (a
    hang), the root cause where a worker raised, else the worst difference from ``want``
    (relative, over ``tol``) of the rows the workers gave (``assemble(results)``, in the whole
    graph's order) with each rank's parameter gradients."""
    run = f"{pool.world_size}w"
    try:
        results = pool.run(payload)
    except TimeoutError as e:
        rec.errors[run], rec.diffs[run] = f"hang|TimeoutError: {e}", None
        return
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        root = next((e for e in errors if not e["comm"]), errors[0])  # the cause, not a peer's timeout
        tag = "refused" if root["sarcompile"] and not root["comm"] else "crash"
        rec.errors[run] = f"{tag}|{root['type']}: {root['message']}" + (
            "" if root["sarcompile"] else f" (at {_where(root['traceback'])})")
        rec.diffs[run] = None
        if not (len(errors) == pool.world_size and all(e["sarcompile"] and not e["comm"] for e in errors)):
            pool.close()  # peers may be mid-exchange: a fresh group for the next case
        return
    got = assemble(results)
    worst = 0.0
    for r in results:  # every rank holds the all-reduced parameter gradients
        got["grads"] = r["grads"]
        worst = max(worst, _record_diff(rec, run, got, want, compare, tol))
    rec.diffs[run] = worst


def node_rows(results: list[dict], want: dict, num_nodes: int, features: int) -> dict:
    """A homogeneous zoo's worker results (``out`` and ``x_grad`` rows by ``global_ids``,
    ``edge_grad`` rows by ``edge_ids``) put back in the whole graph's order: NaN rows where an
    output came in another width, NaN where no edge gradient came, no input gradient where
    no worker had one (``num_nodes`` x ``features`` inputs)."""
    got = {"out": torch.zeros_like(want["out"]), "x_grad": None, "edge_grad": None}
    x_grad = torch.zeros(num_nodes, features, dtype=DT)
    edge_grad = None if want["edge_grad"] is None else torch.full_like(want["edge_grad"], float("nan"))
    any_x_grad = False
    for r in results:
        got["out"][r["global_ids"]] = r["out"].to(got["out"].dtype) if r["out"].shape[1:] == want["out"].shape[1:] \
            else torch.full_like(got["out"][r["global_ids"]], float("nan"))
        if r["x_grad"] is not None:
            any_x_grad = True
            x_grad[r["global_ids"]] = r["x_grad"]
        if edge_grad is not None and r["edge_grad"] is not None:
            edge_grad[r["edge_ids"]] = r["edge_grad"]
    got["x_grad"] = x_grad if any_x_grad else None
    got["edge_grad"] = edge_grad
    return got


def _label(run: str) -> str:
    if run == "local":
        return "one machine"
    w = int(run.removesuffix("w"))
    return f"{w} worker" + ("s" if w > 1 else "")


def judge(rec: Record) -> None:
    """The outcome from every run: a crash anywhere is a CRASH, else a run that timed out a
    HANG, else a difference anywhere WRONG, else a refusal anywhere refused, else exact. The
    detail says what each run did (runs that did the same are listed together)."""
    if rec.outcome:
        return
    kinds = {k: v.split("|", 1)[0] if "|" in v else ("differs" if v.startswith("differs") else "crash")
             for k, v in rec.errors.items()}
    if "crash" in kinds.values():
        rec.outcome = CRASH
    elif "hang" in kinds.values():
        rec.outcome = HANG
    elif "differs" in kinds.values():
        rec.outcome = WRONG
    elif "refused" in kinds.values():
        rec.outcome = REFUSED
    else:
        rec.outcome = EXACT
        rec.detail = "max abs diff: " + ", ".join(f"{_label(k)} {v:.1e}" for k, v in rec.diffs.items())
        if rec.oracle == "compiled":
            rec.detail = f"trained (dropout) as the compiled model on one machine; {rec.detail}"
        return
    said: dict[str, list[str]] = {}
    for run in ["local", *(f"{w}w" for w in WORLD_SIZES)]:
        if run in rec.errors:
            v = rec.errors[run]
            text = v.split("|", 1)[1] if v.startswith(("crash|", "refused|", "hang|")) else v.removeprefix("differs: ")
            if v.startswith("differs"):
                text = "WRONG, " + text
        elif run in rec.diffs:
            text = "exact"
        else:
            continue
        said.setdefault(text, []).append(_label(run))
    rec.detail = "; ".join(f"{', '.join(runs)}: {text}" for text, runs in said.items())


# --- running one model ---------------------------------------------------------------------
def leaf(t: torch.Tensor) -> torch.Tensor:
    """A copy of an input that collects its gradient (an integer one cannot)."""
    t = t.clone()
    return t.requires_grad_(True) if t.is_floating_point() else t


def loss_weight(out: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``w``'s first rows, one per row of ``out`` (a worker may hold none), its columns
    repeated to as many as ``out`` has entries per row, shaped like ``out``: the weights of
    the loss ``sum(out * w)`` whose gradients the zoos compare."""
    cols = math.prod(out.shape[1:])
    return w[: out.shape[0]].repeat(1, -(-cols // w.shape[1]))[:, :cols].reshape(out.shape)


def param_grads(model: nn.Module, skip: Collection[str] = ()) -> dict[str, torch.Tensor | None]:
    """A copy of each trainable parameter's gradient (None where nothing reached it), but those
    named in ``skip``."""
    return {k: None if p.grad is None else p.grad.clone() for k, p in model.named_parameters()
            if p.requires_grad and k not in skip}


def run_node_model(model: nn.Module, forward: Callable[[torch.Tensor, torch.Tensor | None], Any], x: torch.Tensor,
                   edge: torch.Tensor | None, w: torch.Tensor) -> dict:
    """A one-type zoo's run: ``forward(x, e)`` (``model`` on its graph, given the edge tensor
    ``e`` or None) on copies of the inputs, then the output and the gradients of ``sum(out *
    w)`` w.r.t. ``x``, the edge tensor and every parameter."""
    x, e = leaf(x), None if edge is None else leaf(edge)
    out = forward(x, e)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the model returned {type(out).__name__}, not a tensor")
    kept = out.detach().clone()  # reversible layers (GroupAddRev) free their output's storage in backward
    if out.requires_grad:
        (out * loss_weight(out, w)).sum().backward()
    return {
        "out": kept,
        "x_grad": x.grad,
        "edge_grad": None if e is None or not e.is_floating_point() else e.grad,
        "grads": param_grads(model),
    }


def compare_nodes(got: dict, want: dict) -> tuple[float, float, str]:
    """A one-type zoo's comparison: max abs and relative difference over the output and the
    gradients of :func:`run_node_model`, and where the worst is."""
    worst = (0.0, 0.0, "")
    items = [("output", got["out"], want["out"]), ("x grad", got["x_grad"], want["x_grad"]),
             ("edge grad", got["edge_grad"], want["edge_grad"])]
    if set(got["grads"]) != set(want["grads"]):
        return float("inf"), float("inf"), f"parameters differ: {sorted(set(got['grads']) ^ set(want['grads']))}"
    items += [(f"grad of {k}", got["grads"][k], g) for k, g in want["grads"].items()]
    for what, a, b in items:
        m, r = diff(a, b)
        if r > worst[1] or (r == worst[1] == float("inf") and not worst[2]):
            worst = (m, r, what)
    return worst


def node_case(part: Any, payload: dict, build: Callable[[str], nn.Module], run: Callable[..., dict]) -> dict:
    """A one-type zoo's case on a worker (``payload``: the case's ``name``, the model's
    ``state``, the whole graph's ``edge`` tensor or None): the compiled model on this part
    (``run(model, x, graph, edge, w)``), gradients synced, with the rows' global ids."""
    import sarcompile as sc

    model = build(payload["name"])
    model.load_state_dict(payload["state"])
    edge = None if payload["edge"] is None else payload["edge"][part.graph.edge_ids]
    try:
        r = run(distribute(model), part.node_data["x"], part.graph, edge, part.node_data["w"])
        sc.sync_gradients(model)
        r["grads"] = param_grads(model)
    except Exception as e:
        return {"error": describe_error(e)}
    r["edge_ids"] = part.graph.edge_ids
    r["global_ids"] = part.global_ids
    return r


def node_distributed(rec: Record, want: dict, pool: Pool, payload: dict, num_nodes: int, features: int) -> None:
    """:func:`distributed` for a one-type zoo (workers running :func:`node_case`)."""
    distributed(rec, want, pool, payload, lambda results: node_rows(results, want, num_nodes, features),
                compare_nodes)


# --- the sweep -----------------------------------------------------------------------------
def build_each(cases: dict[str, Any], build: Callable[[str], nn.Module]) -> None:
    """Build every case's model once (``build(name)``, cases without one skipped, failures
    ignored: the workers judge them). A zoo does it in the workers' fork server
    (``zoo_pool.in_server``), so that what a layer class sets up once per process is
    done once for all workers: PyG generates each class's propagate code, 1.4 s a zoo."""
    for name, case in cases.items():
        try:
            if case.build is not None:
                build(name)
        except Exception:
            pass


def sweep(names: list[str], world_sizes: tuple[int, ...], log: Callable[[str], Any], *,
          reference: Callable[[str], tuple[Record, dict | None, dict | None]],
          partition: Callable[[str, int, list[str]], dict[str, str]],
          distributed: Callable[[Record, dict, dict, Pool, str], None],
          case: Callable[[Any, dict], dict], frontend: str, width: int) -> list[Record]:
    """Every case in ``names`` on one machine (``reference(name)``), then those it did not
    decide on each world size: ``partition(tmp, world_size, names)`` writes the parts and
    says each case's directory, ``distributed(rec, want, state, pool, dir)`` runs the case on
    a :class:`Pool` of ``world_size`` workers running ``case`` (a fresh one after a pool was
    closed), every world size at once. Logs a line per case and world size (the name padded
    to ``width``); returns the judged records."""
    start_server(case, frontend)  # its imports overlap the single-machine runs
    pool = functools.partial(Pool, case=case, frontend=frontend)
    torch.set_num_threads(1)
    records, refs = [], {}
    for name in names:
        t = time.monotonic()
        rec, want, state = reference(name)
        rec.seconds = time.monotonic() - t
        records.append(rec)
        if want is not None:
            refs[name] = (want, state)
    todo = [r for r in records if r.name in refs]
    spent: dict[tuple[str, int], float] = {}  # (case, world size): seconds

    def one_size(tmp: str, ws: int) -> None:
        dirs = partition(tmp, ws, [r.name for r in todo])
        workers = None
        try:
            for rec in todo:
                t = time.monotonic()
                if workers is None or workers.closed:
                    workers = pool(ws)
                distributed(rec, *refs[rec.name], workers, dirs[rec.name])
                spent[rec.name, ws] = time.monotonic() - t
                log(f"  {ws} workers  {rec.name:<{width}} {rec.errors.get(f'{ws}w', 'ok')[:100]}")
        finally:
            if workers is not None:
                workers.close()

    # The world sizes run side by side, one thread each: a pool mostly waits (on its
    # workers, or they on this process), and two cores do not fill with one pool at a time.
    with tempfile.TemporaryDirectory(prefix="zoo-parts-") as tmp, ThreadPoolExecutor(len(world_sizes)) as ex:
        for done in [ex.submit(one_size, tmp, ws) for ws in world_sizes if todo]:
            done.result()
    for (name, _), seconds in spent.items():
        next(r for r in records if r.name == name).seconds += seconds
    runs = lambda d: dict(sorted(d.items(), key=lambda kv: (kv[0] != "local", kv[0])))  # one machine, 1w, 2w, ...
    for rec in records:  # (in the order of the world sizes, not of the threads' finishing)
        rec.diffs, rec.errors = runs(rec.diffs), runs(rec.errors)
    for rec in records:
        judge(rec)
    return records


# --- output --------------------------------------------------------------------------------
def counts(records: list[Record]) -> dict[str, int]:
    return {o: sum(r.outcome == o for r in records) for o in OUTCOMES}


def _totals(records: list[Record], noun: str) -> str:
    return f"{len(records)} {noun}: " + ", ".join(f"{n} {o}" for o, n in counts(records).items()) + "."


def header(meta: dict, title: str, library: str, compared: str, *, seconds: bool = True) -> str:
    """A table's first line: ``<title>, <date>: `<command>` (<seconds> s; sarcompile <commit>,
    torch <version>, <library> <version>; <compared> 1, 2, 3 gloo workers)`` (without the
    seconds unless ``seconds``); ``compared`` says what ran, up to the world sizes."""
    took = f"{meta['seconds']:.0f} s; " if seconds else ""
    return (f"{title}, {meta['date']}: `{meta['command']}` ({took}sarcompile {meta.get('sarcompile', '?')}, "
            f"torch {meta['torch']}, {library} {meta[library]}; {compared} "
            f"{', '.join(str(w) for w in meta['world_sizes'])} gloo workers)")


def table(records: list[Record], meta: dict, header: str, *, column: str, noun: str,
          untagged: Collection[str]) -> str:
    """The Markdown table: ``header``, a row per case (its group in parentheses after the
    name unless the group is ``untagged``), a row per class the zoo skipped and the totals
    (``"149 layers and models: ..."``, ``noun`` naming the cases)."""
    lines = [header, "", f"| {column} | outcome | detail |", "| --- | --- | --- |"]
    for r in records:
        detail = r.detail if len(r.detail) <= DETAIL_CHARS else r.detail[: DETAIL_CHARS - 1] + "…"
        detail = detail.replace("|", "\\|").replace("\n", " ")
        name = r.name if r.group in untagged else f"{r.name} ({r.group})"
        outcome = f"**{r.outcome}**" if r.outcome in (WRONG, CRASH, HANG) else r.outcome
        lines.append(f"| `{name}` | {outcome} | {detail} |")
    for name, why in meta.get("skipped", {}).items():
        lines.append(f"| `{name}` | skipped | {why} |")
    lines += ["", _totals(records, noun)]
    return "\n".join(lines)


def _short(detail: str, class_prefix: str = "") -> str:
    """The gist of a refusal: without the error class, the layer path and the class name
    (``class_prefix`` + the name, where the message starts with it), up to the first
    sentence."""
    why = re.sub(r"^(\w+Error: )?(layer '[^']*': )*", "", detail.replace("\n", " "))
    if class_prefix:
        why = re.sub(rf"^{re.escape(class_prefix)}(\w+)\.?", "", why)
    why = why.strip()
    why = re.sub(r"^could not be lowered: its forward failed while traced with symbolic tensors and a graph in "
                 r"place of edge_index \((\w+: )?", "forward not traceable: ", why)
    why = why.split(". ")[0].split("; ")[0]
    return (why[:117] + "…" if len(why) > 118 else why).replace("|", "\\|")


def summary(records: list[Record], header: str, groups: dict[str, str], *, column: str, class_prefix: str = "",
            empty_tables: bool = True, total: str | None = None) -> str:
    """The README's form of the table: ``header``, then per group (``groups``: group ->
    title) the counts, the exact cases in one line and a row per other case with the first
    clause of its reason; a group with none gets an empty table only where
    ``empty_tables``; the totals last where ``total`` names the cases."""
    lines = [header, ""]
    for group, title in groups.items():
        rows = [r for r in records if r.group == group]
        lines.append(f"**{title}** ({len(rows)}): " + ", ".join(f"{n} {o}" for o, n in counts(rows).items() if n) + ".")
        lines.append("exact: " + ", ".join(f"`{r.name}`" for r in rows if r.outcome == EXACT) + ".")
        others = [r for r in rows if r.outcome != EXACT]
        if others or empty_tables:
            lines += ["", f"| {column} | outcome | why |", "| --- | --- | --- |"]
            lines += [f"| `{r.name}` | {r.outcome} | {_short(r.detail, class_prefix)} |" for r in others]
        lines.append("")
    if total is not None:
        lines.append(_totals(records, total))
    return "\n".join(lines).rstrip()


# --- the command line ----------------------------------------------------------------------
def main(argv: list[str] | None, *, doc: str, script: str, results: Path, frontend: str,
         cases: Callable[[], dict], sweep: Callable[..., list[Record]], table: Callable[[list[Record], dict], str],
         summary: Callable[[list[Record], dict], str], describe: Callable[[], dict],
         skipped: Callable[[], dict[str, str]] | None = None, record: type[Record] = Record) -> int:
    """A zoo's command line (``--only``, ``--table``, ``--summary``, ``--load``, ``--out``,
    ``--world-sizes``, ``--list``; see the zoo's docstring ``doc``). A sweep's results go to
    ``--out``, or to ``results`` for a full sweep, with the table beside them as ``.md``.
    Their ``meta`` holds the run, the versions (``frontend``'s too), what ``describe()`` says
    of the graph, and ``skipped()``'s classes where the zoo has them; saved records load as
    ``record`` (a subclass of :class:`Record` for a sweep whose records say more)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run these cases only (names as in the table)")
    ap.add_argument("--table", action="store_true", help="print the Markdown table")
    ap.add_argument("--summary", action="store_true", help="print the README's shorter form of the table")
    ap.add_argument("--load", action="store_true", help="do not run: read the saved results")
    ap.add_argument("--out", type=Path, help=f"results file (default {results} for a full sweep; the table goes "
                                              "beside it as .md)")
    ap.add_argument("--world-sizes", type=int, nargs="+", default=list(WORLD_SIZES))
    ap.add_argument("--list", action="store_true", help="list the case names")
    args = ap.parse_args(argv)

    library = importlib.import_module(frontend)

    if args.list:
        print("\n".join(cases()))
        return 0
    out = args.out or (None if args.only else results)
    if args.load:
        data = json.loads((args.out or results).read_text())
        records = [record(**r) for r in data["records"]]
        meta = data["meta"]
    else:
        names = list(cases())
        if args.only:
            unknown = [n for n in args.only if n not in cases()]
            if unknown:
                ap.error(f"unknown case(s) {unknown}; see --list")
            names = args.only
        t = time.monotonic()
        records = sweep(names, tuple(args.world_sizes), log=lambda s: print(s, file=sys.stderr, flush=True))
        meta = {
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python " + " ".join(shlex.quote(a) for a in [
                os.path.relpath(script) if not os.path.isabs(sys.argv[0]) else script, *sys.argv[1:]]),
            "seconds": time.monotonic() - t,
            "sarcompile": commit(mark_dirty=True) or "unknown",
            "torch": torch.__version__.split("+")[0],
            frontend: library.__version__,
            **describe(),
            "world_sizes": list(args.world_sizes),
            "tolerance": TOL,
            **({} if skipped is None else {"skipped": skipped() if not args.only else {}}),
            "counts": counts(records),
        }
        if out is not None:
            write_result(out.stem, {"meta": meta, "records": [r.__dict__ for r in records]}, out.parent)
            out.with_suffix(".md").write_text(table(records, meta) + "\n")
            print(f"wrote {out} and {out.with_suffix('.md')}", file=sys.stderr)
    if args.table:
        print(table(records, meta))
    elif args.summary:
        print(summary(records, meta))
    else:
        print(", ".join(f"{n} {o}" for o, n in counts(records).items()))
        for r in records:
            if r.outcome in (WRONG, CRASH, HANG):
                print(f"{r.outcome}: {r.name}: {r.detail}")
    return 0
