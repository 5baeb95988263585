"""The DGL zoo: does every DGL layer compile exactly, or is it refused clearly?

The DGL twin of ``benchmarks/pyg_zoo.py``. For every class in ``dgl.nn.pytorch.conv.__all__``
(and a few option variants), build the model a DGL user writes -- ``forward(self, g, feat[,
edge_weight])`` around one layer with small constructor arguments -- run it eagerly on the
``DGLGraph``, and compare it with ``sc.distribute(model)`` on one machine
(``sc.Graph.from_dgl(g)``) and on 1, 2 and 3 gloo workers (``sc.partition(sc.Graph.from_dgl(g),
n, dir, node_data=..., method="random")`` + ``sc.load_partition``). Graph: 320 nodes with
isolated nodes, self-loops, duplicate edges and a hub; float64; features and float edge
features require grad.

DGL's GraphConv, GATConv, GATv2Conv, DotGatConv, EdgeGATConv, SGConv, AGNNConv, GMMConv,
EdgeConv and GCN2Conv refuse a graph with 0-in-degree nodes; the graph here has 20 isolated
nodes, so those layers are built with ``allow_zero_in_degree=True``, as a user would (adding
self-loops instead would change the graph the other layers see). EGATConv has no such option
and TWIRLSUnfoldingAndAttention divides by in-degrees (TWIRLSConv adds the self-loops itself), so
these two get the same graph with one self-loop per node; the variant ``GraphConv(self-loops
added)`` calls ``dgl.add_self_loop`` in forward, the other way a user gets past the check.

Each layer ends as exactly one of

* ``exact``: output, every parameter gradient, the input gradient and the edge-feature
  gradient equal eager DGL within 1e-9 (relative to max(1, |eager|)) everywhere;
* ``refused``: a ``sarcompile.SarcompileError`` subclass was raised (class, first line);
* ``n/a``: eager DGL itself fails here, or the layer needs inputs a node-level
  ``forward(g, feat)`` does not have (dense adjacency, coordinates, eigenvectors...);
* ``WRONG``: compiled and ran, but differs (max abs difference per run);
* ``CRASH``: any other exception from the compiled model (type and message).

Usage (DGL runs in the torch 2.2 environment of ``scripts/dgl_env.sh``)::

    DGLBACKEND=pytorch python benchmarks/dgl_zoo.py --table         # full sweep -> results/dgl_zoo.json, .md
    python benchmarks/dgl_zoo.py --only GraphConv SAGEConv --table  # a subset (not saved unless --out)
    python benchmarks/dgl_zoo.py --load --table                     # print the table of the saved results
    python benchmarks/dgl_zoo.py --load --summary                   # ... in the README's shorter form

The workers are a small pool of ``torch.multiprocessing`` processes per world size, in one
gloo group on a FileStore, running many cases each. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import queue
import re
import shlex
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("DGLBACKEND", "pytorch")

import torch
import torch.multiprocessing as mp
from torch import nn

DT = torch.float64
TOL = 1e-9
N_NODES = 320
F_IN = 8
EDGE_DIM = 4
NUM_RELATIONS = 3
W_COLS = 64  # width of the per-node loss weights; outputs use their first columns
WORLD_SIZES = (1, 2, 3)
JOB_TIMEOUT_S = 90.0
START_TIMEOUT_S = 180.0
COMM_TIMEOUT_S = "20"  # SARCOMPILE_TIMEOUT in the workers: a peer that died fails fast
DETAIL_CHARS = 240  # of a detail in the table (the JSON keeps it whole)
RESULTS = Path(__file__).resolve().parent / "results" / "dgl_zoo.json"

EXACT, REFUSED, NA, WRONG, CRASH = "exact", "refused", "n/a", "WRONG", "CRASH"
OUTCOMES = (EXACT, REFUSED, NA, WRONG, CRASH)


# --- the graph and the inputs --------------------------------------------------------------
def make_graph(kind: str = "zoo") -> tuple[torch.Tensor, torch.Tensor]:
    """``src, dst`` on 320 nodes: random edges among nodes 0..299, nodes 300..319 isolated,
    30 self-loops, 40 duplicated edges, and a hub (node 7) with 150 in- and 150 out-edges;
    in shuffled order (the same graph as the PyG zoo's). ``kind="self-loops"``: the same
    with exactly one self-loop per node, last (``dgl.add_self_loop(dgl.remove_self_loop(g))``),
    for layers documented to take such a graph."""
    gen = torch.Generator().manual_seed(2024)
    m = 300
    src = torch.randint(0, m, (900,), generator=gen)
    dst = torch.randint(0, m, (900,), generator=gen)
    loops = torch.randperm(m, generator=gen)[:30]
    dup = torch.randint(0, 900, (40,), generator=gen)
    hub_in = torch.randperm(m, generator=gen)[:150]
    hub_out = torch.randperm(m, generator=gen)[:150]
    hub = torch.full((150,), 7)
    src = torch.cat([src, loops, src[dup], hub_in, hub])
    dst = torch.cat([dst, loops, dst[dup], hub, hub_out])
    order = torch.randperm(src.numel(), generator=gen)
    src, dst = src[order], dst[order]
    if kind == "self-loops":
        keep, loops = src != dst, torch.arange(N_NODES)
        src, dst = torch.cat([src[keep], loops]), torch.cat([dst[keep], loops])
    return src, dst


@dataclass
class Inputs:
    src: torch.Tensor
    dst: torch.Tensor
    x: torch.Tensor  # [N, F_IN]
    w: torch.Tensor  # [N, W_COLS] loss weights
    edge: dict[str, torch.Tensor]  # per-edge tensors by kind, in the original edge order


_INPUTS: dict[str, Inputs] = {}


def inputs(kind: str = "zoo") -> Inputs:
    if kind not in _INPUTS:
        _INPUTS[kind] = make_inputs(kind)
    return _INPUTS[kind]


def make_inputs(kind: str = "zoo") -> Inputs:
    src, dst = make_graph(kind)
    gen = torch.Generator().manual_seed(7)
    e = src.numel()
    edge = {
        # positive, some zero (a node whose in-weights are all zero has degree 0)
        "weight": torch.rand(e, generator=gen, dtype=DT) * torch.randint(0, 3, (e,), generator=gen),
        "attr": torch.randn(e, EDGE_DIM, generator=gen, dtype=DT),
        "pseudo": torch.rand(e, 2, generator=gen, dtype=DT),  # GMMConv's pseudo-coordinates
        "type": torch.randint(0, NUM_RELATIONS, (e,), generator=gen),
        "attr_f": torch.randn(e, F_IN, generator=gen, dtype=DT),  # GINEConv: as wide as the nodes
        "dist": torch.rand(e, 1, generator=gen, dtype=DT) * 2,  # AtomicConv / CFConv distances
        # positive: EdgeWeightNorm(norm='both'), and the layers that call it, refuse weights <= 0
        "pweight": torch.rand(e, generator=gen, dtype=DT) + 0.1,
    }
    return Inputs(src, dst, torch.randn(N_NODES, F_IN, generator=gen, dtype=DT),
                  torch.randn(N_NODES, W_COLS, generator=gen, dtype=DT), edge)


def dgl_graph(kind: str = "zoo"):
    import dgl

    inp = inputs(kind)
    return dgl.graph((inp.src, inp.dst), num_nodes=N_NODES)


# --- the models a DGL user writes ----------------------------------------------------------
class Plain(nn.Module):
    """``forward(g, feat)`` around one layer."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, g, feat):
        return self.layer(g, feat)


class WithEdge(nn.Module):
    """``forward(g, feat, e)`` around one layer: ``e`` by position, or by keyword."""

    def __init__(self, layer: nn.Module, keyword: str | None = None):
        super().__init__()
        self.layer, self.keyword = layer, keyword

    def forward(self, g, feat, e):
        if self.keyword:
            return self.layer(g, feat, **{self.keyword: e})
        return self.layer(g, feat, e)


class FirstOfTuple(nn.Module):
    """Layers returning ``(node_out, edge_out)``: the model uses the node output."""

    def __init__(self, layer: nn.Module, with_edge: bool = True):
        super().__init__()
        self.layer, self.with_edge = layer, with_edge

    def forward(self, g, feat, e=None):
        return (self.layer(g, feat, e) if self.with_edge else self.layer(g, feat))[0]


class WithX0(nn.Module):
    """GCN2Conv: ``layer(g, feat, feat_0)`` with the input as feat_0."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, g, feat):
        return self.layer(g, feat, feat)


class NormedWeights(nn.Module):
    """EdgeWeightNorm as its docs use it: normalise the edge weights, then GraphConv(norm='none')."""

    def __init__(self):
        super().__init__()
        import dgl.nn.pytorch.conv as c

        self.norm = c.EdgeWeightNorm(norm="both")
        self.conv = c.GraphConv(F_IN, F_IN, norm="none", allow_zero_in_degree=True)

    def forward(self, g, feat, edge_weight):
        return self.conv(g, feat, edge_weight=self.norm(g, edge_weight))


class Atomic(nn.Module):
    """AtomicConv: the first feature column as the atom type, edge distances."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, g, feat, dist):
        return self.layer(g, feat[:, :1], dist)


class HGT(nn.Module):
    """HGTConv on a homogeneous graph: one node type, the edge types given."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, g, feat, etype):
        ntype = torch.zeros_like(feat[:, 0], dtype=torch.long)
        return self.layer(g, feat, ntype, etype)


def mlp(d_in: int, d_out: int, hidden: int = 8) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


@dataclass
class Case:
    name: str
    group: str  # "conv" or "variant"
    build: Callable[[], nn.Module] | None  # the user's model; None: not applicable (na says why)
    edge: str | None = None  # per-edge argument: a key of Inputs.edge
    eval: bool = False
    na: str | None = None
    graph: str = "zoo"


def _cases() -> list[Case]:
    import dgl.nn.pytorch.conv as c

    f = F_IN
    z = dict(allow_zero_in_degree=True)
    dense = "takes a dense adjacency matrix, not a graph (forward(adj, feat))"
    conv = [
        Case("GraphConv", "conv", lambda: Plain(c.GraphConv(f, f, **z))),
        Case("EdgeWeightNorm", "conv", lambda: NormedWeights(), edge="pweight"),
        Case("GATConv", "conv", lambda: Plain(c.GATConv(f, f, num_heads=2, **z))),
        Case("GATv2Conv", "conv", lambda: Plain(c.GATv2Conv(f, f, num_heads=2, **z))),
        Case("EGATConv", "conv", lambda: FirstOfTuple(c.EGATConv(f, EDGE_DIM, f, EDGE_DIM, num_heads=2)),
             edge="attr", graph="self-loops"),
        Case("EdgeGATConv", "conv", lambda: WithEdge(c.EdgeGATConv(f, EDGE_DIM, f, num_heads=2, **z)),
             edge="attr"),
        Case("TAGConv", "conv", lambda: Plain(c.TAGConv(f, f, k=2))),
        Case("RelGraphConv", "conv", lambda: WithEdge(c.RelGraphConv(f, f, NUM_RELATIONS, regularizer="basis",
                                                                     num_bases=2)), edge="type"),
        Case("SAGEConv", "conv", lambda: Plain(c.SAGEConv(f, f, "mean"))),
        Case("SGConv", "conv", lambda: Plain(c.SGConv(f, f, k=2, **z))),
        Case("APPNPConv", "conv", lambda: Plain(c.APPNPConv(k=3, alpha=0.1))),
        Case("GINConv", "conv", lambda: Plain(c.GINConv(mlp(f, f), "sum"))),
        Case("GINEConv", "conv", lambda: WithEdge(c.GINEConv(mlp(f, f))), edge="attr_f"),
        Case("GatedGraphConv", "conv", lambda: Plain(c.GatedGraphConv(f, f, n_steps=2, n_etypes=1))),
        Case("GatedGCNConv", "conv", lambda: FirstOfTuple(c.GatedGCNConv(f, EDGE_DIM, f)), edge="attr"),
        Case("GMMConv", "conv", lambda: WithEdge(c.GMMConv(f, f, dim=2, n_kernels=2, **z)), edge="pseudo"),
        Case("ChebConv", "conv", lambda: Plain(c.ChebConv(f, f, k=3))),
        Case("AGNNConv", "conv", lambda: Plain(c.AGNNConv(**z))),
        Case("NNConv", "conv", lambda: WithEdge(c.NNConv(f, f, nn.Linear(EDGE_DIM, f * f), "mean")), edge="attr"),
        Case("DenseGraphConv", "conv", None, na=dense),
        Case("DenseSAGEConv", "conv", None, na=dense),
        Case("DenseChebConv", "conv", None, na=dense),
        Case("EdgeConv", "conv", lambda: Plain(c.EdgeConv(f, f, **z))),
        Case("AtomicConv", "conv", lambda: Atomic(c.AtomicConv(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0]),
                                                               torch.tensor([1.0, 1.0]))), edge="dist"),
        Case("CFConv", "conv", lambda: WithEdge(c.CFConv(f, 1, 8, f)), edge="dist"),
        Case("DotGatConv", "conv", lambda: Plain(c.DotGatConv(f, f, num_heads=2, **z))),
        Case("TWIRLSConv", "conv", lambda: Plain(c.TWIRLSConv(f, f, 8, prop_step=2))),
        Case("TWIRLSUnfoldingAndAttention", "conv",
             lambda: Plain(c.TWIRLSUnfoldingAndAttention(f, alp=0, lam=1, prop_step=2)), graph="self-loops"),
        Case("GCN2Conv", "conv", lambda: WithX0(c.GCN2Conv(f, layer=1, alpha=0.1, lambda_=1, **z))),
        Case("HGTConv", "conv", lambda: HGT(c.HGTConv(f, 4, 2, num_ntypes=1, num_etypes=NUM_RELATIONS)),
             edge="type"),
        Case("GroupRevRes", "conv", lambda: Plain(c.GroupRevRes(c.GraphConv(f // 2, f // 2, **z), groups=2))),
        Case("EGNNConv", "conv", None, na="needs node coordinates (coord_feat) and returns updated coordinates"),
        Case("PNAConv", "conv", lambda: Plain(c.PNAConv(f, f, ["mean", "max", "sum"], ["identity", "amplification"],
                                                        delta=2.5))),
        Case("DGNConv", "conv", None, na="needs precomputed Laplacian eigenvectors per node (eig_vec) for its "
                                         "directional aggregators"),
        Case("CuGraphGATConv", "conv", lambda: Plain(c.CuGraphGATConv(f, f, num_heads=2))),
        Case("CuGraphRelGraphConv", "conv", lambda: WithEdge(c.CuGraphRelGraphConv(f, f, NUM_RELATIONS)),
             edge="type"),
        Case("CuGraphSAGEConv", "conv", lambda: Plain(c.CuGraphSAGEConv(f, f))),
    ]
    variant = [
        Case("GraphConv(edge_weight)", "variant", lambda: WithEdge(c.GraphConv(f, f, **z), keyword="edge_weight"),
             edge="weight"),
        Case("GraphConv(norm=right)", "variant", lambda: Plain(c.GraphConv(f, f, norm="right", **z))),
        Case("GraphConv(self-loops added)", "variant", lambda: SelfLoops(c.GraphConv(f, f))),
        Case("SAGEConv(gcn)", "variant", lambda: Plain(c.SAGEConv(f, f, "gcn"))),
        Case("SAGEConv(pool)", "variant", lambda: Plain(c.SAGEConv(f, f, "pool"))),
        Case("SAGEConv(lstm)", "variant", lambda: Plain(c.SAGEConv(f, f, "lstm"))),
        Case("SAGEConv(mean, edge_weight)", "variant",
             lambda: WithEdge(c.SAGEConv(f, f, "mean"), keyword="edge_weight"), edge="weight"),
        Case("GATConv(edge_weight)", "variant",
             lambda: WithEdge(c.GATConv(f, f, num_heads=2, **z), keyword="edge_weight"), edge="weight"),
        Case("GATConv(residual)", "variant", lambda: Plain(c.GATConv(f, f, num_heads=2, residual=True, **z))),
        Case("GINConv(mean, learn_eps)", "variant", lambda: Plain(c.GINConv(mlp(f, f), "mean", learn_eps=True))),
        Case("GINConv(max)", "variant", lambda: Plain(c.GINConv(mlp(f, f), "max"))),
        Case("TAGConv(edge_weight)", "variant", lambda: WithEdge(c.TAGConv(f, f, k=2), keyword="edge_weight"),
             edge="pweight"),
        Case("SGConv(edge_weight)", "variant", lambda: WithEdge(c.SGConv(f, f, k=2, **z), keyword="edge_weight"),
             edge="pweight"),
        Case("APPNPConv(edge_weight)", "variant", lambda: WithEdge(c.APPNPConv(k=3, alpha=0.1),
                                                                   keyword="edge_weight"), edge="pweight"),
        Case("EdgeConv(batch_norm)", "variant", lambda: Plain(c.EdgeConv(f, f, batch_norm=True, **z))),
        Case("NNConv(sum)", "variant", lambda: WithEdge(c.NNConv(f, f, nn.Linear(EDGE_DIM, f * f), "sum")),
             edge="attr"),
        Case("RelGraphConv(bdd)", "variant", lambda: WithEdge(c.RelGraphConv(f, f, NUM_RELATIONS, regularizer="bdd",
                                                                          num_bases=2)), edge="type"),
    ]
    return conv + variant


class SelfLoops(nn.Module):
    """The other way a DGL user gets past the 0-in-degree check: add self-loops in forward."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, g, feat):
        import dgl

        return self.layer(dgl.add_self_loop(g), feat)


_CASES: dict[str, Case] | None = None


def cases() -> dict[str, Case]:
    global _CASES
    if _CASES is None:
        _CASES = {c.name: c for c in _cases()}
    return _CASES


def skipped() -> dict[str, str]:
    """Classes of ``dgl.nn.pytorch.conv.__all__`` not swept, and why."""
    import dgl.nn.pytorch.conv as c

    swept = {n.split("(")[0] for n in cases()}
    return {n: "not in the sweep yet (new in this DGL version)" for n in c.__all__ if n not in swept}


@contextlib.contextmanager
def float64_default():
    """torch's default dtype float64, as a user computing in float64 sets it: layers make
    tensors with it (APPNPConv's edge weights ``torch.ones(g.num_edges(), 1)``)."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(DT)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


def build(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    with float64_default():
        model = cases()[name].build().to(DT)
    model.train(not cases()[name].eval)
    return model


# --- running one model ---------------------------------------------------------------------
def _edge_input(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    t = t.clone()
    return t.requires_grad_(True) if t.is_floating_point() else t


def _loss_weight(out: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    flat = out.reshape(out.shape[0], -1)
    cols = flat.shape[1]
    reps = -(-cols // w.shape[1])
    return w.repeat(1, reps)[:, :cols].reshape(out.shape)


def run_model(model: nn.Module, x: torch.Tensor, graph: Any, edge: torch.Tensor | None, w: torch.Tensor) -> dict:
    """Output and the gradients of ``sum(out * w)`` w.r.t. x, the edge tensor, every parameter
    (eager and compiled alike with torch's default dtype float64)."""
    x = x.clone().requires_grad_(True)
    e = _edge_input(edge)
    with float64_default():
        out = model(graph, x) if e is None else model(graph, x, e)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"the model returned {type(out).__name__}, not a tensor")
        if out.requires_grad:
            (out * _loss_weight(out, w[: out.shape[0]])).sum().backward()
    return {
        "out": out.detach(),
        "x_grad": x.grad,
        "edge_grad": None if e is None or not e.is_floating_point() else e.grad,
        "grads": {k: None if p.grad is None else p.grad.clone() for k, p in model.named_parameters()
                  if p.requires_grad},
    }


def _diff(got: torch.Tensor | None, want: torch.Tensor | None) -> tuple[float, float]:
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


def compare(got: dict, want: dict) -> tuple[float, float, str]:
    """Max abs and relative difference over output and gradients, and where the worst is."""
    worst = (0.0, 0.0, "")
    items = [("output", got["out"], want["out"]), ("x grad", got["x_grad"], want["x_grad"]),
             ("edge grad", got["edge_grad"], want["edge_grad"])]
    if set(got["grads"]) != set(want["grads"]):
        return float("inf"), float("inf"), f"parameters differ: {sorted(set(got['grads']) ^ set(want['grads']))}"
    items += [(f"grad of {k}", got["grads"][k], g) for k, g in want["grads"].items()]
    for what, a, b in items:
        m, r = _diff(a, b)
        if r > worst[1] or (r == worst[1] == float("inf") and not worst[2]):
            worst = (m, r, what)
    return worst


def _error(e: BaseException) -> dict:
    import sarcompile as sc

    msg = str(e).strip().splitlines()
    return {"type": type(e).__name__, "sarcompile": isinstance(e, sc.SarcompileError),
            "comm": isinstance(e, sc.CommError), "message": msg[0] if msg else "",
            "traceback": traceback.format_exc(limit=-6)}


# --- workers -------------------------------------------------------------------------------
def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def _worker_main(rank: int, world_size: int, store_path: str, jobs, results, case: Callable | None = None) -> None:
    os.environ["SARCOMPILE_TIMEOUT"] = COMM_TIMEOUT_S
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        import sarcompile as sc
        import dgl  # noqa: F401  (sarcompile's DGL front-end loads when the program imports DGL)

        store = dist.FileStore(store_path, world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    except Exception:
        results.put((rank, -1, False, traceback.format_exc()))
        return
    results.put((rank, -1, True, None))
    parts: dict[str, Any] = {}
    try:
        while True:
            job = jobs.get()
            if job is None:
                break
            job_id, data = job
            try:
                payload = _loads(data)
                d = payload["dir"]
                if d not in parts:
                    parts[d] = sc.load_partition(d, rank, world_size)
                results.put((rank, job_id, True, _dumps((case or _worker_case)(parts[d], payload))))
            except Exception as e:  # reported to the parent, which judges the case
                results.put((rank, job_id, True, _dumps({"error": _error(e)})))
    finally:
        dist.destroy_process_group()


def _worker_case(part, payload: dict) -> dict:
    import sarcompile as sc

    model = build(payload["name"])
    model.load_state_dict(payload["state"])
    shard = part.graph
    edge = payload["edge"]
    edge = None if edge is None else edge[shard.edge_ids]
    try:
        r = run_model(sc.distribute(model), part.node_data["x"], shard, edge, part.node_data["w"])
        sc.sync_gradients(model)
        r["grads"] = {k: None if p.grad is None else p.grad.clone() for k, p in model.named_parameters()
                      if p.requires_grad}
    except Exception as e:
        return {"error": _error(e)}
    r["edge_ids"] = shard.edge_ids
    r["global_ids"] = part.global_ids
    return r


class Pool:
    """``world_size`` worker processes in one gloo group; :meth:`run` sends one case to all,
    which ``case(part, payload)`` runs on each (this zoo's by default; the heterogeneous zoo
    gives its own)."""

    def __init__(self, world_size: int, case: Callable | None = None):
        ctx = mp.get_context("spawn")
        self.world_size = world_size
        self.closed = False
        self._dir = tempfile.TemporaryDirectory(prefix="dgl-zoo-pool-")
        self.jobs = [ctx.Queue() for _ in range(world_size)]
        self.results = ctx.Queue()
        self._next = 0
        store = os.path.join(self._dir.name, "store")
        self.procs = [ctx.Process(target=_worker_main, args=(r, world_size, store, self.jobs[r], self.results, case),
                                  daemon=True) for r in range(world_size)]
        for p in self.procs:
            p.start()
        for _ in range(world_size):
            rank, _, ok, err = self._get(START_TIMEOUT_S, -1)
            if not ok:
                self.close()
                raise RuntimeError(f"worker {rank} failed to start:\n{err}")

    def _get(self, timeout: float, job_id: int):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            try:
                item = self.results.get(timeout=left)
            except queue.Empty:
                raise TimeoutError from None
            if item[1] == job_id:
                return item
            # a late answer to an earlier, abandoned job: drop it

    def run(self, payload: dict, timeout: float = JOB_TIMEOUT_S) -> list[dict]:
        """One result per rank (a dict with "error" where that rank raised); raises
        TimeoutError when a rank does not answer in time (the pool is then closed)."""
        self._next += 1
        data = _dumps(payload)
        for q in self.jobs:
            q.put((self._next, data))
        out: dict[int, dict] = {}
        try:
            for _ in range(self.world_size):
                rank, _, _, value = self._get(timeout, self._next)
                out[rank] = _loads(value)
        except TimeoutError:
            dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
            self.close()
            raise TimeoutError(f"no answer from ranks {sorted(set(range(self.world_size)) - set(out))} "
                               f"within {timeout:.0f}s (dead: {dead})") from None
        return [out[r] for r in range(self.world_size)]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for q in self.jobs:
            q.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._dir.cleanup()


# --- the sweep -----------------------------------------------------------------------------
@dataclass
class Record:
    name: str
    group: str
    outcome: str = ""
    detail: str = ""
    diffs: dict[str, float | None] = field(default_factory=dict)  # run -> max abs diff
    errors: dict[str, str] = field(default_factory=dict)  # run -> "Type: message"
    seconds: float = 0.0


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else ""


def reference(name: str) -> tuple[Record, dict | None, dict | None]:
    """Eager DGL on the DGLGraph and the compiled model on one machine
    (``sc.Graph.from_dgl``). Returns the record
    so far, the eager result and the model state (None when the case is decided here)."""
    import sarcompile as sc

    case = cases()[name]
    inp = inputs(case.graph)
    rec = Record(name, case.group)
    if case.build is None:
        rec.outcome, rec.detail = NA, case.na or ""
        return rec, None, None
    edge = None if case.edge is None else inp.edge[case.edge]
    try:
        eager = build(name)
        state = copy.deepcopy(eager.state_dict())
        compiled_model = copy.deepcopy(eager)
        want = run_model(eager, inp.x, dgl_graph(case.graph), edge, inp.w)
        if want["out"].shape[0] != N_NODES:
            raise ValueError(f"output has {want['out'].shape[0]} rows, not one per node")
    except Exception as e:
        why = _first_line(e) or f"(no message, at {_where(traceback.format_exc())})"
        rec.outcome, rec.detail = NA, f"eager DGL fails here: {type(e).__name__}: {why}"
        return rec, None, None
    g = sc.Graph.from_dgl(dgl_graph(case.graph))
    try:
        got = run_model(sc.distribute(compiled_model), inp.x, g, edge, inp.w)
    except Exception as e:
        err = _error(e)
        rec.errors["local"] = f"{err['type']}: {err['message']}"
        rec.outcome = REFUSED if err["sarcompile"] else CRASH
        rec.detail = f"{err['type']}: {err['message']}"
        if not err["sarcompile"]:  # the workers are not run: they would crash the same way
            rec.detail = f"one machine: {rec.detail} (at {_where(err['traceback'])})"
        return rec, None, None
    rec.diffs["local"] = _record_diff(rec, "local", got, want)
    return rec, want, state


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


def _record_diff(rec: Record, run: str, got: dict, want: dict) -> float:
    m, r, what = compare(got, want)
    if r > TOL:
        rec.errors[run] = f"differs: {what} off by {m:.3g}"
    return m


def distributed(rec: Record, want: dict, state: dict, pool: Pool, part_dir: str) -> None:
    case = cases()[rec.name]
    inp = inputs(case.graph)
    ws = pool.world_size
    payload = {"name": rec.name, "state": state, "dir": part_dir,
               "edge": None if case.edge is None else inp.edge[case.edge]}
    run = f"{ws}w"
    try:
        results = pool.run(payload)
    except TimeoutError as e:
        rec.errors[run] = f"TimeoutError: {e}"
        rec.diffs[run] = None
        return
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        # the root cause, not a peer's timeout waiting for it
        root = next((e for e in errors if not e["comm"]), errors[0])
        tag = "refused" if root["sarcompile"] and not root["comm"] else "crash"
        rec.errors[run] = f"{tag}|{root['type']}: {root['message']}" + (
            "" if root["sarcompile"] else f" (at {_where(root['traceback'])})")
        rec.diffs[run] = None
        if not (len(errors) == ws and all(e["sarcompile"] and not e["comm"] for e in errors)):
            pool.close()  # peers may be mid-exchange: a fresh group for the next case
        return
    got = {"out": torch.zeros_like(want["out"]), "x_grad": None, "edge_grad": None}
    x_grad = torch.zeros(N_NODES, F_IN, dtype=DT)
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
    worst = 0.0
    for r in results:  # every rank holds the all-reduced parameter gradients
        got["grads"] = r["grads"]
        m = _record_diff(rec, run, got, want)
        worst = max(worst, m)
    rec.diffs[run] = worst


def _label(run: str) -> str:
    if run == "local":
        return "one machine"
    w = int(run.removesuffix("w"))
    return f"{w} worker" + ("s" if w > 1 else "")


def judge(rec: Record) -> None:
    """The outcome from every run: a crash anywhere is a CRASH, else a difference anywhere
    WRONG, else a refusal anywhere refused, else exact. The detail says what each run did
    (runs that did the same are listed together)."""
    if rec.outcome:
        return
    kinds = {k: v.split("|", 1)[0] if "|" in v else ("differs" if v.startswith("differs") else "crash")
             for k, v in rec.errors.items()}
    if "crash" in kinds.values():
        rec.outcome = CRASH
    elif "differs" in kinds.values():
        rec.outcome = WRONG
    elif "refused" in kinds.values():
        rec.outcome = REFUSED
    else:
        rec.outcome = EXACT
        rec.detail = "max abs diff: " + ", ".join(f"{_label(k)} {v:.1e}" for k, v in rec.diffs.items())
        return
    said: dict[str, list[str]] = {}
    for run in ["local", *(f"{w}w" for w in WORLD_SIZES)]:
        if run in rec.errors:
            v = rec.errors[run]
            text = v.split("|", 1)[1] if v.startswith(("crash|", "refused|")) else v.removeprefix("differs: ")
            if v.startswith("differs"):
                text = "WRONG, " + text
        elif run in rec.diffs:
            text = "exact"
        else:
            continue
        said.setdefault(text, []).append(_label(run))
    rec.detail = "; ".join(f"{', '.join(runs)}: {text}" for text, runs in said.items())


def sweep(names: list[str], world_sizes=WORLD_SIZES, log=print) -> list[Record]:
    import sarcompile as sc

    torch.set_num_threads(1)
    records, refs = [], {}
    for name in names:
        t = time.monotonic()
        rec, want, state = reference(name)
        rec.seconds = time.monotonic() - t
        records.append(rec)
        if want is not None:
            refs[name] = (want, state)
    with tempfile.TemporaryDirectory(prefix="dgl-zoo-parts-") as tmp:
        for ws in world_sizes:
            todo = [r for r in records if r.name in refs]
            if not todo:
                break
            dirs = {}
            for kind in sorted({cases()[r.name].graph for r in todo}):
                inp = inputs(kind)
                dirs[kind] = os.path.join(tmp, f"{kind}-w{ws}")
                sc.partition(sc.Graph.from_dgl(dgl_graph(kind)), ws, dirs[kind],
                             node_data={"x": inp.x, "w": inp.w}, method="random")
            pool = None
            try:
                for rec in todo:
                    t = time.monotonic()
                    if pool is None or pool.closed:
                        pool = Pool(ws)
                    distributed(rec, *refs[rec.name], pool, dirs[cases()[rec.name].graph])
                    rec.seconds += time.monotonic() - t
                    log(f"  {ws} workers  {rec.name:<40} {rec.errors.get(f'{ws}w', 'ok')[:100]}")
            finally:
                if pool is not None:
                    pool.close()
    for rec in records:
        judge(rec)
    return records


# --- output --------------------------------------------------------------------------------
def counts(records: list[Record]) -> dict[str, int]:
    return {o: sum(r.outcome == o for r in records) for o in OUTCOMES}


def table(records: list[Record], meta: dict) -> str:
    c = counts(records)
    lines = [
        f"DGL zoo, {meta['date']}: `{meta['command']}` ({meta['seconds']:.0f} s; sarcompile "
        f"{meta.get('sarcompile', '?')}, torch {meta['torch']}, "
        f"dgl {meta['dgl']}; float64, {N_NODES} nodes, {meta['edges']} edges; "
        f"compared: one machine (`sc.Graph.from_dgl`) and {', '.join(str(w) for w in meta['world_sizes'])} gloo workers)",
        "",
        "| layer | outcome | detail |",
        "| --- | --- | --- |",
    ]
    groups = {"conv": "conv", "variant": "variant"}
    for r in records:
        detail = r.detail if len(r.detail) <= DETAIL_CHARS else r.detail[: DETAIL_CHARS - 1] + "…"
        detail = detail.replace("|", "\\|").replace("\n", " ")
        name = r.name if r.group == "conv" else f"{r.name} ({groups[r.group]})"
        lines.append(f"| `{name}` | {'**' + r.outcome + '**' if r.outcome in (WRONG, CRASH) else r.outcome} "
                     f"| {detail} |")
    for name, why in meta.get("skipped", {}).items():
        lines.append(f"| `{name}` | skipped | {why} |")
    lines += ["", f"{len(records)} layers and variants: " + ", ".join(f"{n} {o}" for o, n in c.items()) + "."]
    return "\n".join(lines)


def _short(detail: str) -> str:
    """The gist of a refusal: without the error class, the layer path and the class name,
    up to the first sentence."""
    why = re.sub(r"^(\w+Error: )?(layer '[^']*': )*", "", detail.replace("\n", " "))
    why = why.strip()
    why = re.sub(r"^could not be lowered: its forward failed while traced with symbolic tensors and a graph in "
                 r"place of edge_index \((\w+: )?", "forward not traceable: ", why)
    why = why.split(". ")[0].split("; ")[0]
    return (why[:117] + "…" if len(why) > 118 else why).replace("|", "\\|")


def summary(records: list[Record], meta: dict) -> str:
    """The README's form of the table: per group, the counts, the exact layers in one line
    and one row per other layer with the first clause of its reason."""
    titles = {"conv": "`dgl.nn.pytorch.conv` classes", "variant": "option variants"}
    lines = [f"DGL zoo, {meta['date']}: `{meta['command']}` (sarcompile {meta.get('sarcompile', '?')}, torch "
             f"{meta['torch']}, dgl {meta['dgl']}; float64; one machine and "
             f"{', '.join(str(w) for w in meta['world_sizes'])} gloo workers)", ""]
    for group, title in titles.items():
        rows = [r for r in records if r.group == group]
        c = counts(rows)
        lines.append(f"**{title}** ({len(rows)}): " + ", ".join(f"{n} {o}" for o, n in c.items() if n) + ".")
        lines.append("exact: " + ", ".join(f"`{r.name}`" for r in rows if r.outcome == EXACT) + ".")
        lines += ["", "| layer | outcome | why |", "| --- | --- | --- |"]
        for r in rows:
            if r.outcome != EXACT:
                lines.append(f"| `{r.name}` | {r.outcome} | {_short(r.detail)} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def sarcompile_version() -> str:
    """The commit the imported sarcompile package comes from, '+dirty' when sarcompile/ has
    uncommitted changes there."""
    import subprocess

    import sarcompile as sc

    pkg = Path(sc.__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=pkg, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=pkg, capture_output=True,
                               text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run these cases only (names as in the table)")
    ap.add_argument("--table", action="store_true", help="print the Markdown table")
    ap.add_argument("--summary", action="store_true", help="print the README's shorter form of the table")
    ap.add_argument("--load", action="store_true", help="do not run: read the saved results")
    ap.add_argument("--out", type=Path, help=f"results file (default {RESULTS} for a full sweep)")
    ap.add_argument("--world-sizes", type=int, nargs="+", default=list(WORLD_SIZES))
    ap.add_argument("--list", action="store_true", help="list the case names")
    args = ap.parse_args(argv)

    import dgl

    if args.list:
        print("\n".join(cases()))
        return 0
    out = args.out or (None if args.only else RESULTS)
    if args.load:
        data = json.loads((args.out or RESULTS).read_text())
        records = [Record(**r) for r in data["records"]]
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
                os.path.relpath(__file__) if not os.path.isabs(sys.argv[0]) else __file__, *sys.argv[1:]]),
            "seconds": time.monotonic() - t,
            "sarcompile": sarcompile_version(),
            "torch": torch.__version__.split("+")[0],
            "dgl": dgl.__version__,
            "edges": make_graph()[0].numel(),
            "world_sizes": list(args.world_sizes),
            "tolerance": TOL,
            "skipped": skipped() if not args.only else {},
            "counts": counts(records),
        }
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"meta": meta, "records": [r.__dict__ for r in records]}, indent=1) + "\n")
            out.with_suffix(".md").write_text(table(records, meta) + "\n")
            print(f"wrote {out}", file=sys.stderr)
    if args.table:
        print(table(records, meta))
    elif args.summary:
        print(summary(records, meta))
    else:
        c = counts(records)
        print(", ".join(f"{n} {o}" for o, n in c.items()))
        for r in records:
            if r.outcome in (WRONG, CRASH):
                print(f"{r.outcome}: {r.name}: {r.detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
