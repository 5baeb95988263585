"""The linear_first pass alone (trace -> lower -> linear_first): which aggregations it
rewrites, what it leaves alone, and that the rewritten program computes what the eager
model computes (values and every gradient, float64) on graphs with isolated nodes,
self-loops and duplicate edges."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from oracle import Sage, check_same
from torch import fx, nn

import sarcompile as sc
from sarcompile.compile.passes.linear_first import linear_first
from sarcompile.compile.passes.lower import lower
from sarcompile.compile.trace import trace

DT = torch.float64


def graph(seed: int, n: int = 17, e: int = 60) -> sc.Graph:
    """Random edges among the first n - 3 nodes (the last three are isolated), a few
    self-loops and repeated edges."""
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n - 3, (e,), generator=gen), torch.randint(0, n - 3, (e,), generator=gen)
    src, dst = torch.cat([src, src[:5], torch.arange(4)]), torch.cat([dst, dst[:5], torch.arange(4)])
    return sc.Graph.from_edges(src, dst, n)


class Functional(nn.Module):
    """F.linear on a parameter: the same rewrite as an nn.Linear."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 6, dtype=DT))
        self.b = nn.Parameter(torch.randn(3, dtype=DT))

    def forward(self, g, x):
        return F.linear(sc.ops.spmm(g, x, "sum"), self.w, self.b)


class Left(nn.Module):
    """What must stay: a weighted sum, a max, an aggregate read twice."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(6, 2), nn.Linear(6, 2), nn.Linear(6, 2)

    def forward(self, g, x):
        w = torch.ones(g.num_edges, dtype=x.dtype)
        twice = sc.ops.spmm(g, x, "mean")
        return self.a(sc.ops.spmm(g, x, "sum", edge_weight=w)) + self.b(sc.ops.spmm(g, x, "max")) + self.c(twice) + twice[:, :2]


def spmm_widths(gm: fx.GraphModule) -> list[str]:
    """What each aggregation reads: the traced input's name."""
    return [n.args[1].name for n in gm.graph.nodes if n.op == "call_function" and n.target is sc.ops.spmm]


@pytest.mark.parametrize("reduce", ["mean", "sum"])
@pytest.mark.parametrize("bias", [True, False])
def test_narrowing_linears_move_before_the_aggregation(reduce, bias):
    torch.manual_seed(0)
    model = Sage([6, 8, 8, 3], reduce, bias).to(DT)  # widens, keeps, narrows
    gm = linear_first(lower(trace(model)))
    reads = spmm_widths(gm)
    assert reads[0] == "x"  # 6 -> 8 widens: aggregate the 6 columns, as before
    assert all(name.startswith("linear") for name in reads[1:]), reads  # 8 -> 8 and 8 -> 3: linear first
    assert not any(n.op == "call_module" and n.target.startswith("lin_l.1") for n in gm.graph.nodes)
    for seed in range(3):
        g = graph(seed)
        check_same(model, gm, g, torch.randn(g.num_nodes, 6, dtype=DT))


def test_functional_linear_and_what_stays():
    torch.manual_seed(1)
    g = graph(4)
    model = Functional()
    gm = linear_first(lower(trace(model)))
    assert [name.startswith("linear") for name in spmm_widths(gm)] == [True]
    check_same(model, gm, g, torch.randn(g.num_nodes, 6, dtype=DT))
    left = Left().to(DT)
    gm = linear_first(lower(trace(left)))
    assert spmm_widths(gm) == ["x", "x", "x"]
    check_same(left, gm, g, torch.randn(g.num_nodes, 6, dtype=DT))


def test_the_compiler_runs_the_pass():
    """sc.distribute's pipeline includes it, and gives the eager values (N workers:
    tests/runtime/test_distributed.py compiles SAGE layers too)."""
    torch.manual_seed(2)
    model = Sage([6, 4, 2]).to(DT)
    compiled = sc.distribute(model)
    g = graph(5)
    x = torch.randn(g.num_nodes, 6, dtype=DT)
    torch.testing.assert_close(compiled(g, x), model(g, x))
    assert "linear_first" in [s for s, _ in compiled.plan(g, 1, x=x).stages]
