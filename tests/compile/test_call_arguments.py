"""Plain Python arguments of a call (bool, int, float, str, None, tuples of them) are
constants of the program: forward is traced with their values, one program per value;
shapes known when tracing (``dim()``, ``len(...)``) are constants; a failed trace says
what failed, and only control flow on a traced value gets the control-flow advice."""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import sarcompile as sc
from sarcompile.graph.shard import ShardGraph, split_graph
from sarcompile.errors import CompileError
from sarcompile.graph.hetero import relation_key

DT = torch.float64
TOL = 1e-9


class Flagged(nn.Module):
    """A flag argument picks a branch (``if training:``), as DGL's examples pass it."""

    def __init__(self):
        super().__init__()
        self.c1 = sc.nn.SAGEConv(6, 8, "mean")
        self.extra = nn.Linear(8, 8)
        self.c2 = sc.nn.SAGEConv(8, 3, "sum")

    def forward(self, g, x, training: bool):
        h = torch.relu(self.c1(g, x))
        if training:
            h = h + torch.tanh(self.extra(h))
        return self.c2(g, h)

    @staticmethod
    def call(g, x, value):
        return (g, x, value), {}


class Skipped(nn.Module):
    """PyG's argument order, keywords with defaults: a bool, an int loop count, a float."""

    def __init__(self):
        super().__init__()
        self.conv = sc.nn.SAGEConv(6, 6, "mean")

    def forward(self, x, edge_index, use_skip=True, layers: int = 2, scale: float = 1.0):
        h = x
        for _ in range(layers):
            out = self.conv(edge_index, h)
            h = out + h if use_skip else out
        return h * scale

    @staticmethod
    def call(g, x, value):
        return (x, g), value


class Targeted(nn.Module):
    """A head chosen by a string (``self.heads[target]``), and a mask that may be None
    where the parameter has no default."""

    def __init__(self):
        super().__init__()
        self.conv = sc.nn.SAGEConv(6, 5, "sum")
        self.heads = nn.ModuleDict({"paper": nn.Linear(5, 3), "author": nn.Linear(5, 2)})

    def forward(self, g, x, target: str, mask):
        h = self.conv(g, x)
        if mask is not None:
            h = h * mask
        return self.heads[target](h)

    @staticmethod
    def call(g, x, value):
        target, masked = value
        return (g, x, target), {"mask": x[:, :1].sigmoid() if masked else None}


class Shaped(nn.Module):
    """Shapes asked in forward: dims, lengths, a feature axis and a list of tensors."""

    def __init__(self):
        super().__init__()
        self.conv = sc.nn.SAGEConv(6, 6, "mean")

    def forward(self, g, x, extra: list):
        if x.dim() != 2 or x.ndim != 2 or len(x.shape) != 2 or x.size(1) != 6 or len(self.conv.lin_l.weight) != 6:
            raise ValueError("x must be [nodes, 6]")
        h = self.conv(g, x)
        for i in range(len(extra)):
            h = h + extra[i] * (i + 1)
        return h

    @staticmethod
    def call(g, x, value):
        return (g, x, [torch.sin(x) * k for k in range(value)]), {}


MODELS = {"flagged": Flagged, "skipped": Skipped, "targeted": Targeted, "shaped": Shaped}
VALUES = {
    "flagged": [True, False, True],
    "skipped": [{}, {"use_skip": False}, {"layers": 3, "scale": 0.5}, {"use_skip": True, "layers": 2, "scale": 1.0}],
    "targeted": [("paper", False), ("author", True), ("paper", True)],
    "shaped": [2, 3],
}
# Distinct programs the values above compile (the last "skipped" value is the defaults again).
PROGRAMS = {"flagged": 2, "skipped": 3, "targeted": 3, "shaped": 2}


def _graph(n: int = 15, e: int = 50, seed: int = 0) -> tuple[sc.Graph, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    g = sc.Graph.from_edges(torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen), n)
    return g, torch.randn(n, 6, generator=gen, dtype=DT), torch.randn(n, 1, generator=gen, dtype=DT)


def _model(name: str) -> nn.Module:
    torch.manual_seed(3)
    return MODELS[name]().double()


def _steps(model: nn.Module, run: nn.Module, g, x: torch.Tensor, w: torch.Tensor, values: list) -> list[dict]:
    """Per value: ``run`` called as the model's ``call`` says, a loss weighted per row,
    backward; the output, the input's gradient and the parameter gradients."""
    results = []
    for value in values:
        model.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_(True)
        args, kwargs = type(model).call(g, xg, value)
        out = run(*args, **kwargs)
        (out * w).sum().backward()
        grads = {k: sc.global_sum(p.grad) if isinstance(g, ShardGraph) else p.grad.clone()
                 for k, p in model.named_parameters() if p.grad is not None}
        results.append({"out": out.detach(), "x_grad": xg.grad, "grads": grads})
    return results


@pytest.mark.parametrize("name", list(MODELS))
def test_each_value_compiles_its_own_program_exact_against_eager(name):
    g, x, w = _graph()
    model = _model(name)
    want = _steps(model, model, g, x, w, VALUES[name])
    compiled = sc.distribute(model)
    got = _steps(model, compiled, g, x, w, VALUES[name])
    for value, a, b in zip(VALUES[name], got, want):
        torch.testing.assert_close(a["out"], b["out"], rtol=0, atol=TOL, msg=str(value))
        torch.testing.assert_close(a["x_grad"], b["x_grad"], rtol=0, atol=TOL, msg=str(value))
        assert a["grads"].keys() == b["grads"].keys()
        for k in a["grads"]:
            torch.testing.assert_close(a["grads"][k], b["grads"][k], rtol=0, atol=TOL, msg=f"{value} {k}")
    assert len(compiled._programs) == PROGRAMS[name]


def _run_worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict:
    part = payload["part"]
    shard = ShardGraph.from_part(part, rank, world_size, payload["num_nodes"], payload["num_edges"])
    model = _model(payload["model"])
    compiled = sc.distribute(model)
    steps = _steps(model, compiled, shard, part.node_data["x"], part.node_data["w"], VALUES[payload["model"]])
    return {"steps": steps, "ids": part.global_ids, "programs": len(compiled._programs)}


@pytest.mark.parametrize("world_size, names", [(2, list(MODELS)), (3, ["skipped", "targeted"])])
def test_each_value_is_exact_on_workers(pool, world_size, names):
    g, x, w = _graph(17, 60, seed=world_size)
    assignment = torch.arange(g.num_nodes) * world_size // g.num_nodes
    parts = split_graph(g, assignment, world_size, {"x": x, "w": w})
    for name in names:
        model = _model(name)
        want = _steps(model, model, g, x, w, VALUES[name])
        payloads = [{"part": p, "model": name, "num_nodes": g.num_nodes, "num_edges": g.num_edges} for p in parts]
        results = pool(world_size).run(_run_worker, payloads)
        for i, value in enumerate(VALUES[name]):
            for key in ("out", "x_grad"):
                full = torch.zeros_like(want[i][key])
                for r in results:
                    full[r["ids"]] = r["steps"][i][key]
                torch.testing.assert_close(full, want[i][key], rtol=0, atol=TOL, msg=f"{name} {value} {key}")
            for r in results:
                for k, grad in want[i]["grads"].items():
                    torch.testing.assert_close(r["steps"][i]["grads"][k], grad, rtol=0, atol=TOL, msg=f"{name} {k}")
        assert {r["programs"] for r in results} == {PROGRAMS[name]}


class TypedTarget(nn.Module):
    """``model(G, x_dict, "paper")`` over a typed graph: per relation a sum into its
    destination type, then the target type's head."""

    def __init__(self, g: sc.HeteroGraph):
        super().__init__()
        self.edge_types = g.edge_types
        self.lin = nn.ModuleDict({relation_key(r): nn.Linear(4, 4) for r in g.edge_types})
        self.heads = nn.ModuleDict({t: nn.Linear(4, 2) for t in g.node_types})

    def forward(self, G, x: dict, target: str, double: bool = False):
        h = dict(x)
        for rel in self.edge_types:
            s, _, d = rel
            h[d] = h[d] + sc.spmm(G[rel], self.lin[relation_key(rel)](x[s]), "sum")
        out = self.heads[target](h[target])
        return out * 2 if double else out


def _typed_graph() -> sc.HeteroGraph:
    gen = torch.Generator().manual_seed(5)
    counts = {"paper": 9, "author": 7}
    edges = {("author", "writes", "paper"): (torch.randint(0, 7, (20,), generator=gen),
                                             torch.randint(0, 9, (20,), generator=gen)),
             ("paper", "cites", "paper"): (torch.randint(0, 9, (15,), generator=gen),
                                           torch.randint(0, 9, (15,), generator=gen))}
    return sc.HeteroGraph.from_edges(edges, counts)


TYPED_VALUES = [("paper", {}), ("author", {"double": True}), ("paper", {"double": False})]


def _typed_steps(model: nn.Module, run: nn.Module, g, x: dict, ids: dict | None) -> list[dict]:
    results = []
    for target, kwargs in TYPED_VALUES:
        pick = (lambda t, v: v) if ids is None else (lambda t, v: v[ids[t]])
        xg = {t: pick(t, v).clone().requires_grad_(True) for t, v in x.items()}
        out = run(g, xg, target, **kwargs)
        model.zero_grad(set_to_none=True)
        (out * torch.linspace(-1, 1, 2, dtype=DT)).sum().backward()
        grads = {k: (torch.zeros_like(p) if p.grad is None else p.grad) for k, p in model.named_parameters()}
        # (a type whose rows reach no output has no gradient: zero, as on a worker without rows)
        x_grad = {t: torch.zeros_like(v) if v.grad is None else v.grad for t, v in xg.items()}
        results.append({"out": out.detach(), "x_grad": x_grad,
                        "grads": {k: sc.global_sum(v) if ids is not None else v for k, v in grads.items()}})
    return results


def _typed_worker(rank: int, world_size: int, payload: dict) -> dict:
    part = sc.load_partition(payload["dir"], rank=rank, world_size=world_size)
    torch.manual_seed(4)
    model = TypedTarget(payload["graph"]).double()
    compiled = sc.distribute(model)
    return {"steps": _typed_steps(model, compiled, part.graph, payload["x"], part.global_ids),
            "ids": part.global_ids, "programs": len(compiled._programs)}


def test_a_string_argument_over_a_typed_graph_is_exact_on_one_machine_and_two_workers(pool, tmp_path):
    g = _typed_graph()
    gen = torch.Generator().manual_seed(6)
    x = {t: torch.randn(g.num_nodes(t), 4, generator=gen, dtype=DT) for t in g.node_types}
    torch.manual_seed(4)
    model = TypedTarget(g).double()
    want = _typed_steps(model, model, g, x, None)
    compiled = sc.distribute(model)
    for a, b in zip(_typed_steps(model, compiled, g, x, None), want):
        torch.testing.assert_close(a["out"], b["out"], rtol=0, atol=TOL)
        for t in x:
            torch.testing.assert_close(a["x_grad"][t], b["x_grad"][t], rtol=0, atol=TOL)
    assert len(compiled._programs) == 2
    sc.partition(g, 2, tmp_path, method="random", seed=1)
    results = pool(2).run(_typed_worker, [{"dir": str(tmp_path), "graph": g, "x": x}] * 2)
    for i, (target, _) in enumerate(TYPED_VALUES):
        full = torch.zeros_like(want[i]["out"])
        for r in results:
            full[r["ids"][target]] = r["steps"][i]["out"]
        torch.testing.assert_close(full, want[i]["out"], rtol=0, atol=TOL, msg=target)
        for t in x:
            full = torch.zeros_like(want[i]["x_grad"][t])
            for r in results:
                full[r["ids"][t]] = r["steps"][i]["x_grad"][t]
            torch.testing.assert_close(full, want[i]["x_grad"][t], rtol=0, atol=TOL, msg=f"{target} {t}")
        for r in results:
            for k, grad in want[i]["grads"].items():
                torch.testing.assert_close(r["steps"][i]["grads"][k], grad, rtol=0, atol=TOL, msg=k)
    assert {r["programs"] for r in results} == {2}


def test_true_and_one_are_two_programs_and_a_float_is_traced_as_a_float():
    g, x, _ = _graph()
    compiled = sc.distribute(_model("skipped"))
    torch.testing.assert_close(compiled(x, g, layers=True), compiled(x, g, layers=1), rtol=0, atol=0)
    assert len(compiled._programs) == 2
    with pytest.raises(CompileError, match="TypeError: 'float' object cannot be interpreted as an integer"):
        compiled(x, g, layers=1.0)  # range(1.0), as eagerly


# -- what a failed trace says ------------------------------------------------------------------
class Fn(nn.Module):
    """``forward(g, x) = body(self, g, x)``, with ``modules`` as submodules."""

    def __init__(self, body, **modules: nn.Module):
        super().__init__()
        self.body = body
        for k, m in modules.items():
            self.add_module(k, m)

    def forward(self, g, x):
        return self.body(self, g, x)


def _twice(x):
    return x * 2


with warnings.catch_warnings():  # (torch.jit.script is deprecated: what a model may still hold)
    warnings.simplefilter("ignore", DeprecationWarning)
    _scripted = torch.jit.script(_twice)
    _SCRIPTED_LINEAR = torch.jit.script(nn.Linear(6, 6))


def _raise(error: Exception):
    raise error


CONTROL_FLOW = "Python control flow may not depend on tensor values"


@pytest.mark.parametrize("body, modules, says", [
    (lambda s, g, x: {"a": x}["b"], {}, r"KeyError 'b': forward asked for a key .* Check the key"),
    (lambda s, g, x: s.heads[x.sum()](x), {"heads": nn.ModuleDict({"a": nn.Linear(6, 6)})},
     r"a dict or ModuleDict was indexed by a traced value .* index it by a Python value"),
    (lambda s, g, x: x * s.scale, {}, r"AttributeError: 'Fn' object has no attribute 'scale'.* pass it as an argument"),
    (lambda s, g, x: s.lin(x), {"lin": _SCRIPTED_LINEAR},
     r"layer 'lin' is a TorchScript module .* give the model the nn.Module it was scripted from"),
    (lambda s, g, x: _scripted(x), {}, r"a TorchScript function .* Call the Python function it was scripted from"),
    (lambda s, g, x: x * len(x), {}, r"len\(\) of a traced tensor, whose first axis is its row count.* x.size\(0\)"),
    (lambda s, g, x: _raise(ValueError("x must be 3-d")), {},
     r"ValueError: x must be 3-d, raised by forward while sarcompile traced it .* pass it as an argument"),
])
def test_an_error_that_is_not_control_flow_says_what_happened_without_the_control_flow_advice(body, modules, says):
    g, x, _ = _graph()
    with pytest.raises(CompileError, match=r"cannot trace Fn.*test_call_arguments.py:\d+") as info:
        sc.distribute(Fn(body, **modules).double())(g, x)
    assert CONTROL_FLOW not in str(info.value)
    assert re.search(says, str(info.value)), str(info.value)


@pytest.mark.parametrize("body", [
    lambda s, g, x: x if x.sum() > 0 else -x,
    lambda s, g, x: sum(row for row in x),
])
def test_control_flow_on_a_traced_value_gets_the_control_flow_advice(body):
    g, x, _ = _graph()
    with pytest.raises(CompileError, match=f"cannot trace Fn, at test_call_arguments.py:.*{CONTROL_FLOW}"):
        sc.distribute(Fn(body).double())(g, x)


def test_a_constant_that_keeps_changing_is_warned_of_once():
    g, x, _ = _graph()
    compiled = sc.distribute(_model("skipped"))
    with pytest.warns(UserWarning, match=r"compiled 9 programs, one per value of its plain Python arguments "
                                         r"scale: .* as a tensor \(torch.tensor\(v\)\)") as seen:
        for i in range(10):
            compiled(x, g, scale=i / 10)
    assert len([w for w in seen if "plain Python arguments" in str(w.message)]) == 1


def test_a_plan_after_a_call_with_a_constant_runs_the_program_traced_with_it():
    g, x, _ = _graph()
    compiled = sc.distribute(_model("flagged"))
    compiled(g, x, False)
    plan = compiled.plan(g, 2, x=x, method="random")
    assert [op.layer for op in plan.ops] == ["c1", "c2"]
