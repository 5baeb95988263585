"""The reuse pass alone (trace -> lower -> linear_first -> reuse): which aggregations it
marks, what it leaves alone, and that the marked program computes what the eager model
computes, call after call, as the input stays, changes in place or is replaced."""

from __future__ import annotations

import gc

import pytest
import torch
from oracle import Sage, check_same
from torch import fx, nn

import sarcompile as sc
from sarcompile.compile.passes.linear_first import linear_first
from sarcompile.compile.passes.lower import lower
from sarcompile.compile.passes.reuse import reuse
from sarcompile.runtime.ops.spmm import _SarSpmm
from sarcompile.runtime.reuse import KEPT
from sarcompile.compile.trace import trace
from test_linear_first import graph

DT = torch.float64


class Inputs(nn.Module):
    """Aggregations of the input (marked) beside ones of computed values, weighted,
    minimum and into a buffer (not)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 9), nn.Linear(6, 9)

    def forward(self, g, x):
        w = torch.ones(g.num_edges, dtype=x.dtype)
        kept = sc.ops.spmm(g, x, "sum") + sc.ops.spmm(g, x, "max")[:, :1]
        computed = sc.ops.spmm(g, torch.sin(x), "mean") + sc.ops.spmm(g, x, "sum", edge_weight=w)
        into = sc.ops.spmm(g, x, "sum", into=torch.cos(x))
        return self.a(kept + computed) + self.b(into + sc.ops.spmm(g, x, "min"))


class Typed(nn.Module):
    """An item of an input (a dict of features per node type, as typed models take)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 9)

    def forward(self, g, xs):
        return self.lin(sc.ops.spmm(g, xs["paper"], "mean"))


def marked(gm: fx.GraphModule) -> list[tuple[str, bool]]:
    """(what each aggregation reads, whether it is marked), in program order."""
    return [(n.args[1].name, bool(n.kwargs.get("reuse"))) for n in gm.graph.nodes
            if n.op == "call_function" and n.target is sc.ops.spmm]


def test_aggregations_of_the_input_are_marked_and_nothing_else():
    gm = reuse(linear_first(lower(trace(Inputs().to(DT)))))
    assert marked(gm) == [("x", True), ("x", True), ("sin", False), ("x", False), ("x", False), ("x", False)]
    typed = reuse(lower(trace(Typed().to(DT))))
    assert [m for _, m in marked(typed)] == [True]


@pytest.mark.parametrize("reduce", ["mean", "sum", "max"])
def test_a_marked_program_gives_the_eager_values_call_after_call(reduce, monkeypatch):
    """The first layer widens (6 -> 8), so its aggregation reads x and is marked. The
    input needs no grad in the calls that reuse, and is changed in place, replaced, and
    asked for its grad between them; the aggregation runs only where one of these
    happened (counted), and the values are the eager model's every time."""
    torch.manual_seed(3)
    model = Sage([6, 8, 3], reduce).to(DT)
    gm = reuse(linear_first(lower(trace(model))))
    assert marked(gm)[0] == ("x", True)
    runs = []
    apply = _SarSpmm.apply
    monkeypatch.setattr(_SarSpmm, "apply", lambda *a: runs.append(1) or apply(*a))
    g = graph(1)
    x = torch.randn(g.num_nodes, 6, dtype=DT)
    for change, aggregations in (("first", 2), ("same", 1), ("same", 1), ("in place", 2), ("same", 1), ("new", 2),
                                 ("grad", None), ("same", 1)):
        if change == "in place":
            x[::2] += 1
        elif change == "new":
            x = x * 3
        if change == "grad":  # a grad asked for: computed and differentiated as before
            check_same(model, gm, g, x)
            continue
        want = model(g, x)
        runs.clear()
        torch.testing.assert_close(gm(g, x), want)
        assert len(runs) == aggregations, change


def test_a_result_written_in_place_is_made_again():
    g = graph(2)
    x = torch.randn(g.num_nodes, 6, dtype=DT)
    first = sc.ops.spmm(g, x, "mean", reuse=True)
    assert sc.ops.spmm(g, x, "mean", reuse=True) is first
    want = first.clone()
    first.add_(1)  # someone wrote into it: it is no longer the aggregation
    again = sc.ops.spmm(g, x, "mean", reuse=True)
    assert again is not first
    torch.testing.assert_close(again, want, rtol=0, atol=0)


def test_a_dead_input_lets_its_result_go():
    g = graph(3)
    x = torch.randn(g.num_nodes, 6, dtype=DT)
    sc.ops.spmm(g, x, "sum", reuse=True)
    kept = g.__dict__["_shard"].__dict__["_reused"]
    assert len(kept) == 1
    del x
    gc.collect()
    assert not kept
    for _ in range(KEPT + 2):  # and no more than KEPT of them are ever kept
        sc.ops.spmm(g, torch.randn(g.num_nodes, 6, dtype=DT), "sum", reuse=True)
    xs = [torch.randn(g.num_nodes, 6, dtype=DT) for _ in range(KEPT + 2)]
    for x in xs:
        sc.ops.spmm(g, x, "sum", reuse=True)
    assert len(kept) == KEPT
