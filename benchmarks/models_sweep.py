"""The models sweep: do whole models, written as PyG's examples write them, train unchanged on N
workers?

The layer zoos (``pyg_zoo.py`` and its siblings) measure layers one at a time. This sweep
takes whole node-level models written the way PyG's examples and tutorials write them
(``benchmarks/models_pyg.py``; DGL's are in ``models_dgl.py``, swept by
``dgl_models_sweep.py``): dropout everywhere, the graph passed as ``edge_index``, inside a
``Data``, kept on the module, with a ``training`` flag beside it, ready-made
``torch_geometric.nn.models`` with their dropout / jk / norm options, typed models
(``to_hetero``, HGT, HAN, ``HeteroConv``, RGCN) with learnable tables of featureless types
under any name, plain-torch message passing, Lightning-style wrappers.
Each runs on synthetic graphs of its dataset's shape, small: a Cora-shaped citation graph
(300 nodes, 6 isolated), an ogbn-mag-shaped typed graph (paper / author / field /
institution) and its homogeneous view; float64.

Each model runs in eval mode and in train mode, each mode a case:

* **eval**: the compiled model on one machine (``sc.distribute(model)(graph, x)``) and on 1, 2
  and 3 gloo workers, against the eager model: outputs, input gradients and parameter
  gradients of the loss ``sum(out * w)`` (a node table's gradient rows where each worker
  holds its own rows);
* **train**: where two eager runs under different seeds differ (dropout), against the
  compiled model on one machine (``zoo_sweep.reference``, seeded alike everywhere by
  ``zoo_sweep.distribute``: its masks are keyed by node and edge id, the same on any number
  of workers, not torch's), and the compiled training output must differ from eval's
  (dropout applied); where they do not differ, against eager as in eval.

A case ends as exactly one of ``exact`` (every run within 1e-7, relative to max(1, |want|)),
``refused`` (a ``sarcompile.SarcompileError``, its message quoted), ``n/a`` (eager itself
fails, or is random in eval mode), ``WRONG``, ``CRASH`` (any other exception) or ``HANG`` (a
worker did not answer in ``zoo_pool.JOB_TIMEOUT_S``).

A model that keeps its graph on the module (``self.edge_index``, DGL's ``self.g``) is built
with the graph of the run: the library's graph eagerly, ``sc.Graph`` on one machine, the
worker's ``part.graph`` on a worker (:attr:`Model.keeps` names the attribute).

Usage::

    python benchmarks/models_sweep.py                   # full sweep -> benchmarks/results/models_sweep.json, .md
    python benchmarks/models_sweep.py --only "GCN [eval]" "GAT [train]" --table   # some cases (not saved)
    python benchmarks/models_sweep.py --load --table    # print the table of the saved results
    python benchmarks/models_sweep.py --load --summary  # ... in the README's form (refusals by cause)
    python benchmarks/models_sweep.py --list            # the case names

The judging of runs, the worker pool and the command line are the zoos'
(``benchmarks/zoo_sweep.py``, ``benchmarks/zoo_pool.py``); this file adds what whole models
need (two modes, typed inputs and outputs, node tables, graphs kept on modules) and is shared
with ``dgl_models_sweep.py``. Neither PyG nor DGL is imported at its top.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo_sweep  # noqa: E402
from dgl_zoo import float64_default  # noqa: E402  (neither imports DGL)
from zoo_pool import Pool, describe_error, in_server  # noqa: E402
from zoo_sweep import (  # noqa: E402, F401  (the outcomes: tests read them)
    CRASH, DT, EXACT, HANG, NA, REFUSED, WORLD_SIZES, WRONG, Record, diff,
)

TOL = 1e-7  # relative to max(1, |want|), float64
MODES = ("eval", "train")
BUILD_SEED = 0
W_COLS = 64  # width of the per-node loss weights; outputs use their first columns
CHECK = "check"  # the group of models that check the harness itself: run by the tests, not in the sweep
WRONG_ON_WORKERS = "deliberately wrong on workers"
DROPOUT_ONLY_EAGER = "deliberately without dropout when compiled"
NOT_ROW_LOCAL = "deliberately not row-local"
RESULTS = Path(__file__).resolve().parent / "results" / "models_sweep.json"
FRONTEND = "torch_geometric"


# --- graphs shaped like the examples' datasets, small ---------------------------------------
CITATION = {"nodes": 300, "isolated": 6, "links": 700, "features": 32, "classes": 7}  # Cora / CiteSeer
MAG_NODES = {"paper": 150, "author": 100, "field": 20, "institution": 10}  # ogbn-mag
MAG_FEATURES = {"paper": 16, "author": 12}  # field and institution have none
MAG_CLASSES = 6
MAG_LINKS = {("author", "writes", "paper"): 300, ("paper", "cites", "paper"): 400,
             ("paper", "has_topic", "field"): 200, ("author", "affiliated_with", "institution"): 120}


def citation_graph() -> tuple[torch.Tensor, torch.Tensor]:
    """``src, dst`` of an undirected citation graph shaped like Cora and CiteSeer, small:
    every link stored both ways, no self-loops or duplicates, skewed degrees (a few hubs),
    the last nodes isolated (CiteSeer has such); in shuffled order."""
    gen = torch.Generator().manual_seed(2052)
    n = CITATION["nodes"] - CITATION["isolated"]
    src = torch.randint(0, n, (CITATION["links"],), generator=gen)
    popularity = torch.arange(1, n + 1, dtype=DT) ** -0.8
    dst = torch.randperm(n, generator=gen)[torch.multinomial(popularity, CITATION["links"], True, generator=gen)]
    keep = src != dst
    links = torch.unique(torch.stack([torch.minimum(src, dst), torch.maximum(src, dst)])[:, keep], dim=1)
    both = torch.cat([links, links.flip(0)], dim=1)
    both = both[:, torch.randperm(both.size(1), generator=gen)]
    return both[0], both[1]


def citation_features() -> tuple[torch.Tensor, torch.Tensor]:
    """Bag-of-words rows normalised to sum 1 (``T.NormalizeFeatures()``), and the loss weights."""
    gen = torch.Generator().manual_seed(7)
    n, f = CITATION["nodes"], CITATION["features"]
    words = (torch.rand(n, f, generator=gen) < 0.15).to(DT)
    words[torch.arange(n), torch.randint(0, f, (n,), generator=gen)] = 1.0
    return words / words.sum(1, keepdim=True), torch.randn(n, W_COLS, generator=gen, dtype=DT)


def mag_graph() -> dict[tuple[str, str, str], tuple[torch.Tensor, torch.Tensor]]:
    """The relations of an ogbn-mag-shaped graph, each with its reverse (``T.ToUndirected``
    names them ``rev_<name>``): random links among all but the last two nodes of each type,
    ``cites`` with duplicate edges."""
    gen = torch.Generator().manual_seed(2053)
    edges = {}
    for (s, r, d), m in MAG_LINKS.items():
        src = torch.randint(0, MAG_NODES[s] - 2, (m,), generator=gen)
        dst = torch.randint(0, MAG_NODES[d] - 2, (m,), generator=gen)
        if s == d:
            dup = torch.randint(0, m, (20,), generator=gen)
            src, dst = torch.cat([src, src[dup]]), torch.cat([dst, dst[dup]])
        edges[(s, r, d)] = (src, dst)
    for (s, r, d), (src, dst) in list(edges.items()):
        edges[(d, f"rev_{r}", s)] = (dst, src)
    return edges


def mag_features() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Features of the types that have them, and loss weights for every type."""
    gen = torch.Generator().manual_seed(8)
    x = {t: torch.randn(MAG_NODES[t], f, generator=gen, dtype=DT) for t, f in MAG_FEATURES.items()}
    return x, {t: torch.randn(n, W_COLS, generator=gen, dtype=DT) for t, n in MAG_NODES.items()}


def assignment(num_nodes: int | dict[str, int], world_size: int) -> torch.Tensor | dict[str, torch.Tensor]:
    """Random parts (per type for a typed graph), so that neighbours live on every worker."""
    gen = torch.Generator().manual_seed(world_size)
    if isinstance(num_nodes, dict):
        return {t: torch.randint(0, world_size, (n,), generator=gen) for t, n in num_nodes.items()}
    return torch.randint(0, world_size, (num_nodes,), generator=gen)


# --- what a sweep is made of ---------------------------------------------------------------
@dataclass
class Kind:
    """A graph the models run on, with its inputs, in each form a run takes it."""

    eager: Callable[[], Any]  # a fresh copy of the graph(s) as the library holds them
    graphs: tuple  # the same as sarcompile Graphs / HeteroGraphs (a model gets a list when several)
    inputs: dict[str, Any]  # the model's inputs by name: a tensor, or a dict per node type / relation
    w: dict[str, torch.Tensor]  # loss weights per node type ("" on a graph of one type)
    num_nodes: int | dict[str, int]
    edge_inputs: frozenset[str] = frozenset()  # the inputs that are per edge (the others per node)

    @property
    def typed(self) -> bool:
        return isinstance(self.num_nodes, dict)


Call = Callable[[nn.Module, Any, dict, bool], Any]  # (model, graph, inputs, training) -> output


@dataclass
class Model:
    """A model as its user writes it: how it is built and called, on which kind of graph."""

    name: str
    group: str
    kind: str
    build: Callable[[Any], nn.Module]  # given the eager graph (a model that keeps its graph stores it)
    call: Call
    has: str = ""  # what in it the sweep exercises, for the table
    keeps: str | None = None  # the attribute the model keeps its graph in
    out_type: str = ""  # the node type of a tensor output's rows on a typed graph


@dataclass
class Case:
    """One model in one mode (the name is ``"<model> [<mode>]"``)."""

    name: str
    model: Model
    mode: str
    na: str | None = None

    @property
    def group(self) -> str:
        return self.model.group

    @property
    def build(self) -> Callable[[Any], nn.Module]:
        return self.model.build


@dataclass
class ModelRecord(Record):
    """A case's record, with its model, its mode and what the model has."""

    model: str = ""
    mode: str = ""
    has: str = ""


def _per_key(v: Any) -> dict:
    """A tensor as ``{"": tensor}``; a dict per node type or relation as it is."""
    return v if isinstance(v, dict) else {"": v}


def _out_diff(a: dict, b: dict) -> float:
    """The largest relative difference between two runs' outputs (types both have)."""
    return max((diff(a["out"][k], v)[1] for k, v in b["out"].items() if k in a["out"]), default=0.0)


def _models(records: list[Record]) -> str:
    """The models of some cases, each with its modes unless it is there in every mode."""
    modes: dict[str, list[str]] = {}
    for r in records:
        modes.setdefault(r.model, []).append(r.mode)
    return ", ".join(f"`{m}`" + ("" if len(ms) == len(MODES) else f" ({', '.join(ms)})") for m, ms in modes.items())


def _quote(detail: str, chars: int = 240) -> str:
    """A message for a table cell: without its error class, cut at ``chars``."""
    text = re.sub(r"^\w+Error: ", "", detail.replace("\n", " "))
    return (text if len(text) <= chars else text[: chars - 1] + "…").replace("|", "\\|")


def _key_label(name: str, key: Any) -> str:
    return name if key == "" else f"{name}[{key[1] if isinstance(key, tuple) else key}]"


class Sweep:
    """A models sweep: its ``models`` and the ``kinds`` of graph they run on (both made on
    first use, by every worker alike), the front-end package the workers import, and where
    the results go. ``worker`` is the sweep module's own worker function (the pool's fork
    server imports that module)."""

    def __init__(self, models: Callable[[], list[Model]], kinds: Callable[[], dict[str, Kind]], *, frontend: str,
                 library: str, title: str, results: Path, worker: Callable[[Any, dict], dict], doc: str, script: str):
        self._models, self._kinds = models, kinds
        self.frontend, self.library, self.title, self.results = frontend, library, title, results
        self.worker, self.doc, self.script = worker, doc, script
        self._more_dirs: dict[tuple[str, int], list[str]] = {}

    # -- cases and models -------------------------------------------------------------------
    @functools.cached_property
    def cases(self) -> dict[str, Case]:
        return {f"{m.name} [{mode}]": Case(f"{m.name} [{mode}]", m, mode) for m in self._models() for mode in MODES}

    @property
    def listed(self) -> dict[str, Case]:
        """The cases of the sweep (the harness's own checks left out)."""
        return {n: c for n, c in self.cases.items() if c.group != CHECK}

    @functools.cached_property
    def kinds(self) -> dict[str, Kind]:
        return self._kinds()

    def build_each(self) -> None:
        """Every model built once (in eval mode), as ``zoo_sweep.build_each`` does for a zoo."""
        zoo_sweep.build_each({n: c for n, c in self.cases.items() if c.mode == MODES[0]}, self.build)

    def build(self, name: str, graph: Any = None) -> nn.Module:
        """Case ``name``'s model, float64, in its mode, keeping ``graph`` (the eager one when
        None) if it keeps one; lazy parameters initialised by one eager call in eval mode."""
        case = self.cases[name]
        kind = self.kinds[case.model.kind]
        eager_graph = kind.eager()
        torch.manual_seed(BUILD_SEED)
        with float64_default():
            model = case.model.build(eager_graph).to(DT)
            if any(isinstance(p, nn.parameter.UninitializedParameter) for p in model.parameters()):
                model.eval()
                with torch.no_grad():
                    case.model.call(model, eager_graph, kind.inputs, False)
        model.train(case.mode == "train")
        if graph is not None and case.model.keeps:
            setattr(model, case.model.keeps, graph)
        return model

    # -- one run ----------------------------------------------------------------------------
    def run(self, model: nn.Module, case: Case, graph: Any, inputs: dict, w: dict, *, training: bool) -> dict:
        """``model`` (eager or compiled) called as its user calls it, in ``training`` mode; its
        outputs per node type and the gradients of ``sum(out * w)`` w.r.t. every floating input
        (an input nothing reached: zeros) and every parameter."""
        leaves = {k: {key: zoo_sweep.leaf(t) for key, t in v.items()} if isinstance(v, dict) else zoo_sweep.leaf(v)
                  for k, v in inputs.items()}
        with float64_default():
            model.train(training)
            out = case.model.call(model, graph, leaves, training)
            if isinstance(out, torch.Tensor):
                out = {case.model.out_type: out}
            if not isinstance(out, dict) or not all(isinstance(v, torch.Tensor) for v in out.values()):
                raise TypeError(f"the model returned {type(out).__name__}, not a tensor or a dict of tensors")
            model.zero_grad()
            loss = sum((v * zoo_sweep.loss_weight(v, w[k])).sum() for k, v in out.items() if v.requires_grad)
            if isinstance(loss, torch.Tensor):
                loss.backward()
        grads = {}
        for name, v in leaves.items():
            for key, t in _per_key(v).items():
                if t.is_floating_point():
                    grads[(name, key)] = torch.zeros_like(t) if t.grad is None else t.grad
        return {"out": {k: v.detach() for k, v in out.items()}, "x_grad": grads,
                "grads": zoo_sweep.param_grads(model)}

    @staticmethod
    def compare(got: dict, want: dict) -> tuple[float, float, str]:
        """Max abs and relative difference over outputs, input and parameter gradients (a
        worker's node-table rows put back among the others), and where the worst is."""
        items = []
        for what, label in (("out", "output"), ("x_grad", "grad of input")):
            if set(got[what]) != set(want[what]):
                differ = sorted(map(str, set(got[what]) ^ set(want[what])))
                return float("inf"), float("inf"), f"{label} keys differ: {differ}"
            items += [(f"{label} {_key_label(*k) if isinstance(k, tuple) else k}".strip(), got[what][k], v)
                      for k, v in want[what].items()]
        params = {**got["grads"], **got.get("table_grads", {})}
        if set(params) != set(want["grads"]):
            return float("inf"), float("inf"), f"parameters differ: {sorted(set(params) ^ set(want['grads']))}"
        items += [(f"grad of {k}", params[k], g) for k, g in want["grads"].items()]
        worst = (0.0, 0.0, "")
        for what, a, b in items:
            m, r = diff(a, b)
            if r > worst[1] or (r == worst[1] == float("inf") and not worst[2]):
                worst = (m, r, what)
        return worst

    # -- one machine ------------------------------------------------------------------------
    def reference(self, name: str) -> tuple[Record, dict | None, dict | None]:
        """The case on one machine as the zoos judge one (``zoo_sweep.reference``: against
        eager, or against the compiled model on one machine where eager is random), and two
        checks of a random one: in eval mode eager must not be random (``n/a`` if it is, as
        in a model that bakes ``training=True`` in), and in train mode the compiled model must
        apply its dropout (:meth:`_check_dropout_applied`)."""
        case = self.cases[name]
        kind = self.kinds[case.model.kind]
        training = case.mode == "train"

        def eager(model: nn.Module, training: bool = training) -> dict:
            return self.run(model, case, kind.eager(), kind.inputs, kind.w, training=training)

        whole = kind.graphs[0] if len(kind.graphs) == 1 else list(kind.graphs)

        def compiled(model: nn.Module) -> dict:
            if case.model.keeps:
                setattr(model, case.model.keeps, whole)
            return self.run(zoo_sweep.distribute(model), case, whole, kind.inputs, kind.w, training=training)

        rec, want, state = zoo_sweep.reference(case, self.build, eager, compiled, self.library, self.compare, TOL)
        rec = ModelRecord(**rec.__dict__, model=case.model.name, mode=case.mode, has=case.model.has)
        if want is not None and rec.oracle == "compiled":
            if not training:
                rec.outcome, rec.detail = NA, f"eager {self.library} is random in eval mode"
                return rec, None, None
            self._check_dropout_applied(rec, eager, want)
        return rec, want, state

    def _check_dropout_applied(self, rec: Record, eager: Callable[..., dict], want: dict) -> None:
        """Where eager's training output differs from its eval output, the compiled training
        output (``want``) must too: its dropout applied, not left out."""
        model = self.build(rec.name)
        torch.manual_seed(1)
        idle, trained = eager(copy.deepcopy(model), training=False), eager(copy.deepcopy(model))
        if _out_diff(trained, idle) > TOL >= _out_diff(want, idle):
            rec.errors["local"] = "differs: the compiled output in training equals eval's: dropout left out"

    # -- workers ----------------------------------------------------------------------------
    def worker_case(self, part: Any, payload: dict) -> dict:
        """One case on a worker: its rows of the inputs, the compiled model on its part (its
        parts of every graph, for a model taking several), gradients synced; the node tables'
        gradient rows apart, with their types."""
        import sarcompile as sc
        from sarcompile.graph.tables import table_type

        case = self.cases[payload["name"]]
        kind = self.kinds[case.model.kind]
        more = [sc.load_partition(d) for d in payload["more"]]
        if any(not torch.equal(p.global_ids, part.global_ids) for p in more):
            raise RuntimeError("the parts of a kind's graphs hold different nodes: their rows would not match")
        graph = part.graph if not more else [part.graph, *(p.graph for p in more)]
        ids = _per_key(part.global_ids)
        g = part.graph
        edge_ids = {rel: g[rel].edge_ids for rel in g.edge_types} if kind.typed else {"": g.edge_ids}
        inputs = {}
        for name, v in kind.inputs.items():
            rows = edge_ids if name in kind.edge_inputs else ids
            inputs[name] = {k: t[rows[k]] for k, t in v.items()} if isinstance(v, dict) else v[rows[""]]
        w = {k: v[ids[k]] for k, v in kind.w.items()}
        try:
            model = self.build(case.name, graph)
            model.load_state_dict(payload["state"])
            r = self.run(zoo_sweep.distribute(model), case, graph, inputs, w, training=case.mode == "train")
            sc.sync_gradients(model)
            tables = {k: t for k, p in model.named_parameters() if (t := table_type(p)) is not None}
            r["grads"] = zoo_sweep.param_grads(model, skip=tables)
            # (rows nothing reached have no gradient: zeros, as the zoos count them)
            r["table_grads"] = {k: (t, torch.zeros_like(p) if p.grad is None else p.grad)
                                for k, p in model.named_parameters() if (t := tables.get(k)) is not None}
        except Exception as e:
            return {"error": describe_error(e)}
        r["ids"], r["edge_ids"] = ids, edge_ids
        return r

    def assemble(self, case: Case, results: list[dict], want: dict) -> dict:
        """The workers' rows in the whole graph's order (NaN where none came, or they came in
        another width); each node table's gradient from its rows on every worker."""
        kind = self.kinds[case.model.kind]

        def put(like: torch.Tensor, pieces: list) -> torch.Tensor:
            out = torch.full_like(like, float("nan"))
            for rows, v in pieces:
                if v is not None and v.shape[1:] == like.shape[1:] and v.shape[0] == rows.numel():
                    out[rows] = v.to(out.dtype)
            return out

        got: dict = {"out": {}, "x_grad": {}, "table_grads": {}}
        for k, full in want["out"].items():
            got["out"][k] = put(full, [(r["ids"][k], r["out"].get(k)) for r in results])
        for k in set().union(*(r["out"] for r in results)) - set(want["out"]):
            got["out"][k] = results[0]["out"][k]
        for (name, key), full in want["x_grad"].items():
            rows = "edge_ids" if name in kind.edge_inputs else "ids"
            got["x_grad"][(name, key)] = put(full, [(r[rows][key], r["x_grad"].get((name, key))) for r in results])
        for k, (t, _) in results[0]["table_grads"].items():
            pieces = [(r["ids"].get(t, r["ids"].get("")), r["table_grads"][k][1]) for r in results]
            full = want["grads"].get(k)
            if full is None:  # no gradient eagerly: the rows the workers give, compared with zeros
                full = torch.zeros(sum(rows.numel() for rows, _ in pieces), *pieces[0][1].shape[1:], dtype=DT)
            got["table_grads"][k] = put(full, pieces)
        return got

    # -- the sweep --------------------------------------------------------------------------
    def distributed(self, rec: Record, want: dict, state: dict, pool: Pool, part_dir: str) -> None:
        case = self.cases[rec.name]
        payload = {"name": rec.name, "state": state, "dir": part_dir,
                   "more": self._more_dirs.get((case.model.kind, pool.world_size), [])}
        zoo_sweep.distributed(rec, want, pool, payload, lambda results: self.assemble(case, results, want),
                              self.compare, TOL)

    def partition(self, tmp: str, world_size: int, names: list[str]) -> dict[str, str]:
        """Every graph of the kinds these cases run on, cut into ``world_size`` random parts
        under ``tmp`` (a kind's graphs alike, so their rows match); each case's directory."""
        import sarcompile as sc

        dirs = {}
        for kind in sorted({self.cases[n].model.kind for n in names}):
            k = self.kinds[kind]
            paths = [os.path.join(tmp, f"{re.sub(r'[^A-Za-z0-9]+', '-', kind)}-{i}-w{world_size}")
                     for i in range(len(k.graphs))]
            for graph, path in zip(k.graphs, paths):
                sc.partition(graph, world_size, path, method=assignment(k.num_nodes, world_size))
            dirs[kind] = paths[0]
            self._more_dirs[(kind, world_size)] = paths[1:]
        return {n: dirs[self.cases[n].model.kind] for n in names}

    def sweep(self, names: list[str], world_sizes=WORLD_SIZES, log=print) -> list[Record]:
        return zoo_sweep.sweep(names, world_sizes, log, reference=self.reference, partition=self.partition,
                               distributed=self.distributed, width=max(map(len, self.cases)),
                               case=self.worker, frontend=self.frontend)

    # -- output -----------------------------------------------------------------------------
    def _header(self, meta: dict, seconds: bool = True) -> str:
        graphs = "; ".join(meta["graphs"])
        return zoo_sweep.header(meta, self.title, self.frontend, f"float64; {graphs}; each model in eval and train "
                                f"mode; compared: one machine and", seconds=seconds)

    def table(self, records: list[Record], meta: dict) -> str:
        """A row per model: what it has, its outcome in each mode (what train was compared
        with), and the detail of each mode."""
        by_model: dict[str, dict[str, Record]] = {}
        for r in records:
            by_model.setdefault(r.model, {})[r.mode] = r
        lines = [self._header(meta), "", "| model | group | has | eval | train | detail |",
                 "| --- | --- | --- | --- | --- | --- |"]
        for model, modes in by_model.items():
            cells, details = [], []
            for mode in MODES:
                r = modes.get(mode)
                if r is None:
                    cells.append("")
                    continue
                outcome = f"**{r.outcome}**" if r.outcome in (WRONG, CRASH, HANG) else r.outcome
                cells.append(outcome + (" (vs compiled)" if r.oracle == "compiled" else ""))
                details.append(f"{mode}: {r.detail}")
            detail = "; ".join(d if len(d) <= zoo_sweep.DETAIL_CHARS else d[: zoo_sweep.DETAIL_CHARS - 1] + "…"
                               for d in details).replace("|", "\\|").replace("\n", " ")
            any_r = next(iter(modes.values()))
            lines.append(f"| `{model}` | {any_r.group} | {any_r.has} | {cells[0]} | {cells[1]} | {detail} |")
        lines += ["", self._counts(records)]
        return "\n".join(lines)

    @staticmethod
    def _counts(records: list[Record]) -> str:
        parts = []
        for mode in MODES:
            rows = [r for r in records if r.mode == mode]
            counts = ", ".join(f"{n} {o}" for o, n in zoo_sweep.counts(rows).items())
            parts.append(f"{mode}: {counts}")
        models = len({r.model for r in records})
        return f"{models} models, {len(records)} cases. " + "; ".join(parts) + "."

    def summary(self, records: list[Record], meta: dict) -> str:
        """The README's form: the counts per mode, the exact models, and the refusals grouped
        by cause (how many cases, which models, one message quoted)."""
        lines = [self._header(meta, seconds=False), "", self._counts(records), ""]
        for mode in MODES:
            exact = [r.model for r in records if r.mode == mode and r.outcome == EXACT]
            lines.append(f"exact in {mode} ({len(exact)}): " + ", ".join(f"`{m}`" for m in exact) + ".")
        lines += ["", "| refused: cause | cases | models | message (one of them) |", "| --- | ---: | --- | --- |"]
        for cause, rows in refusals_by_cause(records).items():
            lines.append(f"| {cause} | {len(rows)} | {_models(rows)} | {_quote(rows[0].detail)} |")
        others: dict[tuple[str, str], list[Record]] = {}
        for r in records:
            if r.outcome not in (EXACT, REFUSED):
                others.setdefault((r.outcome, r.detail), []).append(r)
        if others:
            lines += ["", "| outcome | cases | models | detail |", "| --- | ---: | --- | --- |"]
            lines += [f"| {outcome} | {len(rows)} | {_models(rows)} | {_quote(detail)} |"
                      for (outcome, detail), rows in others.items()]
        return "\n".join(lines)

    def main(self, argv: list[str] | None, describe: Callable[[], dict]) -> int:
        return zoo_sweep.main(argv, doc=self.doc, script=self.script, results=self.results, frontend=self.frontend,
                              cases=lambda: self.listed, sweep=self.sweep, table=self.table, summary=self.summary,
                              describe=describe, record=ModelRecord)


# Refusal causes, roughly in the order of issue 52's list: a message matching a pattern is that
# cause (the first that matches).
CAUSES = (
    ("dropout on N workers", r"[Dd]ropout|NodeDropout"),
    ("the graph not passed as an argument (kept on the module, in a Data, a list, frames)", r"\bno graph\b"),
    ("an assignment into part of a tensor (`x[mask] = 0`)", r"does not support item assignment|assignment into part"),
    ("a Python loop over a tensor's rows (`enumerate(torch.split(param, 1))`)", r"was iterated"),
    ("a Python argument or control flow traced as a value", r"control flow|Proxy"),
    ("a reduction over all nodes (`z.mean(0)`)", r"reduces over the node axis"),
    ("a new axis or shape not followed (`stack`, `einsum`, `zeros`)", r"stack|einsum|unsqueeze|zeros|new axis"),
    ("a node table not recognised", r"param tensor of shape|first axis of size 1"),
    ("cached normalisation (`cached=True`)", r"cached=True"),
    ("the graph used as a tensor (message passing in plain torch)",
     r"uses the graph argument|edge_index\[\d\]|is used as a tensor"),
    ("node ids as features (`x=None`)", r"got no features"),
)


def refusals_by_cause(records: list[Record]) -> dict[str, list[Record]]:
    """The refused cases grouped by the cause their message names (:data:`CAUSES`; another
    message is its own cause, by its gist), the largest group first."""
    groups: dict[str, list[Record]] = {}
    for r in records:
        if r.outcome != REFUSED:
            continue
        text = " ".join(v for v in r.errors.values()) or r.detail
        cause = next((c for c, pattern in CAUSES if re.search(pattern, text)), None) or zoo_sweep._short(r.detail)
        groups.setdefault(cause, []).append(r)
    order = Counter({c: len(v) for c, v in groups.items()})
    return {c: groups[c] for c, _ in order.most_common()}


# --- the PyG and plain-torch models ----------------------------------------------------------
def _pyg_kinds() -> dict[str, Kind]:
    """The citation graph (``edge_index``; with per-edge weights, GDC-style), the same as a
    ``sc.Graph`` for models written with sarcompile's layers, as the normalised sparse
    ``adj_t`` the OGB examples build (``D^-1/2 (A+I) D^-1/2`` of ``T.ToSparseTensor()``'s
    ``torch.sparse_csr`` matrix; compiled, ``sc.Graph.from_adjacency`` of it), the mag graph (``HeteroData``'s
    dicts) and its homogeneous view (``edge_type`` per edge, no features: AIFB-style)."""
    import sarcompile as sc
    from torch_geometric.data import HeteroData

    src, dst = citation_graph()
    n = CITATION["nodes"]
    x, w = citation_features()
    edge_index = torch.stack([src, dst])
    weight = torch.rand(src.numel(), generator=torch.Generator().manual_seed(9), dtype=DT) + 0.5
    whole = sc.Graph.from_edges(src, dst, n)
    adj_t = _normalised_adjacency(src, dst, n)
    cit = dict(graphs=(whole,), inputs={"x": x, "edge_weight": weight}, w={"": w}, num_nodes=n,
               edge_inputs=frozenset({"edge_weight"}))
    data = HeteroData()
    for t, count in MAG_NODES.items():
        data[t].num_nodes = count
    for rel, (s, d) in mag_graph().items():
        data[rel].edge_index = torch.stack([s, d])
    mx, mw = mag_features()
    typed = data.to_homogeneous()
    tw = torch.randn(typed.num_nodes, W_COLS, generator=torch.Generator().manual_seed(10), dtype=DT)
    return {
        "citation": Kind(eager=lambda: edge_index.clone(), **cit),
        "citation (sc.Graph)": Kind(eager=lambda: whole, **cit),
        "citation (normalised adj_t)": Kind(eager=lambda: adj_t.clone(), graphs=(sc.Graph.from_adjacency(adj_t),),
                                            inputs={"x": x}, w={"": w}, num_nodes=n),
        "mag": Kind(eager=lambda: dict(data.edge_index_dict), graphs=(sc.HeteroGraph.from_pyg(data),),
                    inputs={"x": mx}, w=mw, num_nodes=dict(MAG_NODES)),
        "mag (homogeneous)": Kind(eager=lambda: typed.edge_index.clone(), graphs=(sc.Graph.from_pyg(typed),),
                                  inputs={"edge_type": typed.edge_type}, w={"": tw}, num_nodes=typed.num_nodes,
                                  edge_inputs=frozenset({"edge_type"})),
    }


def _normalised_adjacency(src: torch.Tensor, dst: torch.Tensor, n: int) -> torch.Tensor:
    """``D^-1/2 (A+I) D^-1/2`` of the edges ``src -> dst`` as a ``torch.sparse_csr`` ``adj_t``
    (rows the destinations), as the OGB examples normalise ``T.ToSparseTensor()``'s."""
    loops = torch.arange(n)
    rows, cols = torch.cat([dst, loops]), torch.cat([src, loops])
    a = torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.ones(rows.numel(), dtype=DT), (n, n)).coalesce()
    (rows, cols), values = a.indices(), a.values()
    inv = torch.zeros(n, dtype=DT).index_add(0, rows, values).pow(-0.5)
    return torch.sparse_coo_tensor(a.indices(), inv[rows] * values * inv[cols], (n, n)).to_sparse_csr()


def _pyg_models() -> list[Model]:
    import models_pyg as P
    from torch_geometric.data import Data
    from torch_geometric.nn import models as M

    f, h, c = CITATION["features"], 16, CITATION["classes"]
    std = lambda m, g, i, t: m(i["x"], g)  # noqa: E731  (forward(x, edge_index))
    typed = lambda m, g, i, t: m(i["x"], g)  # noqa: E731  (forward(x_dict, edge_index_dict))
    metadata = (list(MAG_NODES), list(mag_graph()))

    def example(name, build, has, **kw):
        return Model(name, "example", "citation", build, kw.pop("call", std), has, **kw)

    def ready(name, build, has):
        return Model(name, "ready-made", "citation", build, std, has)

    return [
        example("GCN (gcn.py, cached)", lambda g: P.GCN(f, h, c), "F.dropout, cached=True"),
        example("GCN (edge_weight)", lambda g: P.GCN(f, h, c, cached=False), "F.dropout, edge weights",
                call=lambda m, g, i, t: m(i["x"], g, i["edge_weight"])),
        example("GAT (gat.py)", lambda g: P.GAT(f, 8, c, heads=8), "F.dropout, GATConv(dropout=0.6)"),
        example("GATv2", lambda g: P.GATv2(f, 8, c), "nn.Dropout, GATv2Conv(dropout=), residual"),
        example("APPNP (citation/appnp.py)", lambda g: P.APPNPNet(f, 32, c), "F.dropout, APPNP propagation"),
        example("SGC (sgc.py)", lambda g: P.SGC(f, c), "SGConv(cached=True), no dropout"),
        example("TAGCN (tagcn.py)", lambda g: P.TAGCN(f, h, c), "F.dropout"),
        example("ChebNet (citation/cheb.py)", lambda g: P.ChebNet(f, h, c), "F.dropout, ChebConv(K=2)"),
        example("ClusterGCN", lambda g: P.ClusterGCN(f, h, c), "F.dropout in a loop"),
        example("GCNII (gcn2_cora.py)", lambda g: P.GCNII(f, h, c), "F.dropout, x_0 residual, 4 layers"),
        example("JK-Net (cat)", lambda g: P.JKNet(f, h, c, "cat"), "JumpingKnowledge('cat'), F.dropout"),
        example("JK-Net (lstm)", lambda g: P.JKNet(f, h, c, "lstm"), "JumpingKnowledge('lstm'), F.dropout"),
        example("AGNN (agnn.py)", lambda g: P.AGNN(f, h, c), "F.dropout, AGNNConv"),
        example("DeeperGCN (res+)", lambda g: P.DeeperGCN(f, h, c), "DeepGCNLayer(dropout=0.1), GENConv softmax"),
        example("Sequential + JK (docs)", lambda g: P.sequential_jk(f, h, c), "nn.Dropout in PyG's Sequential"),
        example("GraphSAGE (ogbn-arxiv)", lambda g: P.SAGE(f, h, c), "BatchNorm1d, F.dropout, forward(x, adj_t)"),
        Model("GCN on a normalised adj_t (ogbn-arxiv)", "example", "citation (normalised adj_t)",
              lambda g: P.ArxivGCN(f, h, c), std, "GCNConv(cached=True), BatchNorm1d, F.dropout, forward(x, adj_t)"),
        Model("GCN(normalize=False) on adj_t (ogbn-products)", "example", "citation (normalised adj_t)",
              lambda g: P.ProductsGCN(f, h, c), std, "GCNConv(normalize=False), F.dropout, forward(x, adj_t)"),
        example("GIN (node-level, cat)", lambda g: P.GIN(f, h, c), "BatchNorm1d in the MLP, F.dropout"),
        example("tutorial GCNConv (MessagePassing)", lambda g: P.TutorialNet(f, h, c),
                "hand-written MessagePassing, F.dropout"),
        Model("DropEdge GCN", "convention", "citation", lambda g: P.DropEdgeGCN(f, h, c), std, "dropout_edge"),
        Model("SAGE with a training flag", "convention", "citation", lambda g: P.FlagSAGE(f, h, c),
              lambda m, g, i, t: m(i["x"], g, training=t), "forward(x, edge_index, training=...)"),
        Model("GCN on a Data", "convention", "citation", lambda g: P.DataGCN(f, h, c),
              lambda m, g, i, t: m(Data(x=i["x"], edge_index=g)), "forward(data)"),
        Model("SAGE keeping its graph", "convention", "citation", lambda g: P.StoredGraphSAGE(g, f, h, c),
              lambda m, g, i, t: m(i["x"]), "self.edge_index, forward(x)", keeps="edge_index"),
        Model("SAGE heads, stack-mean", "convention", "citation", lambda g: P.HeadEnsemble(f, h, c), std,
              "torch.stack(outs).mean(0), x.dim(), nn.Dropout"),
        ready("models.GCN(dropout, jk=cat)", lambda g: M.GCN(f, h, 2, c, dropout=0.5, jk="cat"), "dropout=, jk"),
        ready("models.GraphSAGE(dropout, batch_norm, jk=max)",
              lambda g: M.GraphSAGE(f, h, 2, c, dropout=0.5, norm="batch_norm", jk="max"), "dropout=, norm, jk"),
        ready("models.GIN(dropout, batch_norm)", lambda g: M.GIN(f, h, 2, c, dropout=0.5, norm="batch_norm"),
              "dropout=, norm"),
        ready("models.GAT(v2, heads, dropout)", lambda g: M.GAT(f, h, 2, c, dropout=0.6, heads=4, v2=True),
              "dropout= (features and attention)"),
        ready("models.PNA(dropout)", lambda g: M.PNA(f, h, 2, c, dropout=0.3, aggregators=["mean", "max", "std"],
                                                     scalers=["identity", "amplification"],
                                                     deg=torch.tensor([6, 60, 80, 60, 40, 20, 14])),
              "dropout=, degree scalers"),
        ready("models.EdgeCNN(dropout)", lambda g: M.EdgeCNN(f, h, 2, c, dropout=0.2), "dropout="),
        Model("plain torch: index_add_ mean", "plain torch", "citation", lambda g: P.IndexAddGCN(f, h, c), std,
              "index_add_ over edge_index, F.dropout"),
        Model("plain torch: scatter_add_ mean", "plain torch", "citation", lambda g: P.ScatterMeanGNN(f, h, c), std,
              "scatter_add_ (expanded index), index_add_ degree, F.dropout"),
        Model("plain torch: index_select + scatter max", "plain torch", "citation", lambda g: P.EdgeMaxNet(f, h, c),
              std, "index_select, PyG scatter(reduce='max') in forward, F.dropout"),
        Model("plain torch: degree-normalised GCN", "plain torch", "citation", lambda g: P.DegreeNormGCN(f, h, c),
              std, "degree, D^-1/2 A D^-1/2 with index_add_, F.dropout"),
        Model("plain torch: MLP baseline", "plain torch", "citation", lambda g: P.MLP(f, h, c), std,
              "no graph use, BatchNorm1d, F.dropout"),
        Model("sarcompile.nn SAGE", "plain torch", "citation (sc.Graph)", lambda g: P.ScSAGE(f, h, c),
              lambda m, g, i, t: m(g, i["x"]), "sc.nn layers, nn.Dropout"),
        Model("Lightning GraphSAGE", "wrapper", "citation", lambda g: P.LitGraphSAGE(f, h, c), std,
              "LightningModule-like, GraphSAGE(dropout, norm=BatchNorm1d)"),
        Model("Lightning around GAT", "wrapper", "citation", lambda g: P.LitNodeClassifier(P.GAT(f, 8, c, heads=4)),
              std, "LightningModule-like wrapper, dropout"),
        Model("to_hetero SAGE (mag)", "typed", "mag",
              lambda g: P.MagToHetero(metadata, MAG_NODES, 16, h, MAG_CLASSES), typed,
              "to_hetero, nn.Dropout, tables field_emb / inst_table", out_type="paper"),
        Model("HGT (hgt_dblp.py)", "typed", "mag",
              lambda g: P.HGT(metadata, MAG_NODES, h, MAG_CLASSES, featureless=("field", "institution")), typed,
              "HGTConv, ParameterDict tables by type", out_type="author"),
        Model("HAN (han_imdb.py)", "typed", "mag", lambda g: P.HAN(metadata, MAG_NODES, MAG_CLASSES), typed,
              "HANConv(dropout=0.6) in a model, bare nn.Parameter tables", out_type="paper"),
        Model("HeteroConv GNN (hetero_conv_dblp.py)", "typed", "mag", lambda g: P.HeteroGNN(h, MAG_CLASSES), typed,
              "HeteroConv of GCN/SAGE/GAT, F.dropout", out_type="author"),
        Model("RGCN (rgcn.py, featureless)", "typed", "mag (homogeneous)",
              lambda g: P.EntityRGCN(sum(MAG_NODES.values()), h, MAG_CLASSES, len(mag_graph())),
              lambda m, g, i, t: m(g, i["edge_type"]), "RGCNConv(x=None), F.dropout"),
        Model("Lightning around HGT", "wrapper", "mag",
              lambda g: P.LitHGT(P.HGT(metadata, MAG_NODES, h, MAG_CLASSES, featureless=("field", "institution"))),
              typed, "LightningModule-like wrapper of a typed model", out_type="author"),
        Model(WRONG_ON_WORKERS, CHECK, "citation", lambda g: P.WrongOnWorkers(f, c), std, "x * 2 on workers"),
        Model(DROPOUT_ONLY_EAGER, CHECK, "citation", lambda g: P.DropoutOnlyEager(f, c), std, "no dropout compiled"),
        Model(NOT_ROW_LOCAL, CHECK, "citation", lambda g: P.NotRowLocal(f, c), std, "x.flip(0)"),
    ]


def _describe() -> dict:
    src, _ = citation_graph()
    mag = mag_graph()
    return {"graphs": [f"citation {CITATION['nodes']} nodes, {src.numel()} edges",
                       "mag " + ", ".join(f"{t} {n}" for t, n in MAG_NODES.items())
                       + f", {sum(s.numel() for s, _ in mag.values())} edges"]}


def _worker_case(part, payload: dict) -> dict:
    return SWEEP.worker_case(part, payload)


SWEEP = Sweep(_pyg_models, _pyg_kinds, frontend=FRONTEND, library="PyG", title="Models sweep (PyG)",
              results=RESULTS, worker=_worker_case, doc=__doc__, script=__file__)


if in_server(__name__):  # the workers fork with every model built once
    SWEEP.build_each()

if __name__ == "__main__":
    sys.exit(SWEEP.main(None, _describe))
