"""DGL user code that calls ``g.update_all`` / ``g.apply_edges`` compiles: the graph is
traced as a proxy with DGL's frames, builtin and user message functions become IR ops,
and the compiled model computes what DGL computes, on one machine and on N workers.

Runs only where DGL is installed (``scripts/test.sh`` runs it in the DGL environment).
"""

from __future__ import annotations

import pytest

dgl = pytest.importorskip("dgl")

import dgl.function as fn
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import graphs
from torch import nn

import sarcompile as sc
from sarcompile.graph.shard import ShardGraph, split_graph

DT = torch.float64
TOL = 1e-9


def gated_message(edges):
    """A user message function: source and destination rows, and an edge weight."""
    return {"m": torch.tanh(2 * edges.src["h"] + edges.dst["h"]) * edges.data["w"]}


class UpdateAll(nn.Module):
    """Every supported form: builtin messages (u_mul_e, copy_u, copy_e), a user message
    function, the three builtin reductions and apply_edges, inside local_scope."""

    def __init__(self, f_in: int = 5, hidden: int = 4):
        super().__init__()
        self.lin = nn.Linear(f_in, hidden)
        self.out = nn.Linear(hidden, 3)

    def forward(self, g, x, w):
        with g.local_scope():
            g.ndata["h"] = self.lin(x)
            g.edata["w"] = w
            g.update_all(fn.u_mul_e("h", "w", "m"), fn.sum("m", "a"))
            g.update_all(fn.copy_u("h", "m"), fn.mean("m", "b"))
            g.update_all(fn.copy_u("h", "m"), fn.max("m", "c"))
            g.update_all(gated_message, fn.sum("m", "d"))
            g.apply_edges(fn.u_dot_v("h", "h", "s"))
            g.update_all(fn.copy_e("s", "m"), fn.mean("m", "e"))
            h = g.ndata["a"] + g.ndata["b"] + torch.sin(g.ndata["c"]) + g.ndata["d"] + g.ndata["e"]
        return self.out(torch.relu(h))


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return UpdateAll().to(DT)


def _step(model: nn.Module, graph, x: torch.Tensor, w: torch.Tensor, weight: torch.Tensor):
    x = x.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    out = model(graph, x, w)
    (out * weight).sum().backward()
    return out.detach(), x.grad, w.grad, {k: p.grad.clone() for k, p in model.named_parameters()}


def _close(got, want, what):
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    torch.testing.assert_close(got, want, atol=TOL * scale, rtol=0, msg=what)


def _inputs(n: int, e: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 5, generator=gen, dtype=DT), torch.rand(e, 1, generator=gen, dtype=DT),
            torch.randn(n, 3, generator=gen, dtype=DT))


@given(graphs(max_nodes=20, max_edges=60))
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_update_all_matches_dgl(data):
    src, dst, n, seed = data
    seed %= 2**16
    x, w, weight = _inputs(n, src.numel(), seed)
    eager = _model(seed)
    want = _step(eager, dgl.graph((src, dst), num_nodes=n), x, w, weight)
    model = _model(seed)
    got = _step(sc.distribute(model), sc.Graph.from_edges(src, dst, n), x, w, weight)
    for what, a, b in zip(("out", "x grad", "w grad"), got, want):
        _close(a, b, what)
    for k in want[3]:
        _close(got[3][k], want[3][k], f"grad of {k}")
    assert [k for k, _ in model.named_modules()] == ["", "lin", "out"]  # tracing left the model as it was


def _worker(rank: int, world_size: int, payload: dict):
    import dgl  # noqa: F401  (the graph proxy is used when the program imports DGL)

    part = payload["part"]
    shard = ShardGraph.from_part(part, rank, world_size, payload["num_nodes"], payload["num_edges"])
    model = _model(payload["seed"])
    w = payload["w"][shard.edge_ids]  # the original edges' weights, in shard order
    out, x_grad, w_grad, _ = _step(sc.distribute(model), shard, part.node_data["x"], w, part.node_data["weight"])
    sc.sync_gradients(model)
    return out, x_grad, w_grad, shard.edge_ids, {k: p.grad.clone() for k, p in model.named_parameters()}


@given(data=st.data())
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
def test_update_all_on_workers_matches_dgl(pool, data):
    src, dst, n, seed = data.draw(graphs(max_nodes=24, max_edges=80))
    seed %= 2**16
    world_size = data.draw(st.sampled_from([1, 2, 3]))
    assignment = torch.tensor(data.draw(st.lists(st.integers(0, world_size - 1), min_size=n, max_size=n)))
    x, w, weight = _inputs(n, src.numel(), seed)
    want = _step(_model(seed), dgl.graph((src, dst), num_nodes=n), x, w, weight)
    g = sc.Graph.from_edges(src, dst, n)
    parts = split_graph(g, assignment, world_size, {"x": x, "weight": weight})
    payloads = [{"part": p, "seed": seed, "w": w, "num_nodes": n, "num_edges": g.num_edges} for p in parts]
    results = pool(world_size).run(_worker, payloads)
    for i, what in enumerate(("out", "x grad")):
        full = torch.zeros_like(want[i])
        for p, r in zip(parts, results):
            full[p.global_ids] = r[i]
        _close(full, want[i], what)
    w_grad = torch.full_like(w, float("nan"))
    for r in results:  # every edge lives on exactly one worker
        w_grad[r[3]] = r[2]
    _close(w_grad, want[2], "w grad")
    for r in results:
        for k in want[3]:
            _close(r[4][k], want[3][k], f"grad of {k}")


class _Mailbox(nn.Module):
    def forward(self, g, x):
        with g.local_scope():
            g.ndata["h"] = x
            g.update_all(fn.copy_u("h", "m"), lambda nodes: {"h": nodes.mailbox["m"].sum(1)})
            return g.ndata["h"]


class _TwoFields(nn.Module):
    """A message reading two node fields: computed on the edges, then reduced locally."""

    def __init__(self, reduce=fn.sum):
        super().__init__()
        self.reduce = reduce

    def forward(self, g, x):
        with g.local_scope():
            g.ndata["a"], g.ndata["b"] = x, 2 * x
            g.update_all(lambda edges: {"m": edges.src["a"] * edges.dst["b"]}, self.reduce("m", "h"))
            return g.ndata["h"]


def test_a_message_reading_two_node_fields_matches_dgl():
    g = dgl.graph((torch.tensor([0, 1, 2, 2, 3]), torch.tensor([1, 0, 1, 1, 3])), num_nodes=5)
    x = torch.randn(5, 3, dtype=torch.float64)
    for reduce in (fn.sum, fn.mean):
        torch.testing.assert_close(sc.distribute(_TwoFields(reduce))(sc.Graph.from_dgl(g), x),
                                   _TwoFields(reduce)(g, x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("model,words", [
    (_Mailbox, ["reduce function", "not supported yet", "dgl.function.sum", "mailbox"]),
    (lambda: _TwoFields(fn.max), ["several node or edge fields", "sum or mean"]),
])
def test_unsupported_update_all_is_refused_clearly(model, words):
    g = sc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    with pytest.raises(sc.CompileError) as info:
        sc.distribute(model())(g, torch.randn(2, 3))
    for word in words:
        assert word in str(info.value), str(info.value)


class _NodeOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 4)

    def forward(self, g, x):
        with g.local_scope():
            g.ndata["h"] = self.lin(x)
            g.update_all(fn.copy_u("h", "m"), fn.max("m", "a"))
            g.update_all(lambda edges: {"m": edges.src["h"] - edges.dst["h"]}, fn.mean("m", "b"))
            g.apply_edges(fn.u_dot_v("h", "h", "s"))
            g.update_all(fn.copy_e("s", "m"), fn.sum("m", "c"))
            return g.ndata["a"] + g.ndata["b"] + g.ndata["c"]


def test_plan_of_update_all_code():
    """plan() traces DGL-style code too, before the model was ever called."""
    g = sc.Graph.from_edges(torch.arange(30), (torch.arange(30) * 7 + 1) % 30, 30)
    plan = sc.distribute(_NodeOnly()).plan(g, 2, x=torch.zeros(1, 5), method="contiguous")
    assert [op.op for op in plan.ops] == ["spmm(max)", "message_passing(mean)", "sddmm(dot)", "message_passing(sum)"]
