"""The accumulate pass (... -> linear_groups -> accumulate): which aggregations it makes
add into the value beside them, that the program computes what the eager model computes
(values and every gradient, float64), and that the buffer it adds into is the output."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import Sage, check_same
from test_linear_groups import compiled as grouped
from test_linear_groups import graph
from torch import fx, nn

import sarcompile as sc
from sarcompile import ops
from sarcompile.compile.passes.accumulate import accumulate

DT = torch.float64


def compiled(model: nn.Module) -> fx.GraphModule:
    return accumulate(grouped(model))


def intos(gm: fx.GraphModule) -> list[str]:
    """The reduce of every spmm that adds into a buffer."""
    return [n.args[2] for n in gm.graph.nodes
            if n.op == "call_function" and n.target is ops.spmm and n.kwargs.get("into") is not None]


@pytest.mark.parametrize("reduce, bias", [("sum", True), ("mean", True), ("mean", False), ("max", True)])
def test_sage_layers_that_transform_first_add_their_aggregate_into_the_root(reduce, bias):
    torch.manual_seed(0)
    model = Sage([6, 8, 8, 3], reduce, bias=bias).to(DT)
    gm = compiled(model)
    # Layer 1 aggregates first (its linear widens): the linear reads the aggregate. Max
    # does not sum; the others add into lin_r's output, with the bias between or not.
    assert intos(gm) == ([] if reduce == "max" else [reduce, reduce]), gm.code
    for seed in range(3):
        g = graph(seed)
        check_same(model, gm, g, torch.randn(g.num_nodes, 6, dtype=DT))


class Kept(nn.Module):
    """A sum whose root is read twice, and a weighted mean: neither is rewritten."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, g, x, w):
        r = self.b(x)
        y = sc.ops.spmm(g, self.a(x), "sum") + r
        return y * r + sc.ops.spmm(g, x, "mean", edge_weight=w) + self.a(x)


def test_a_root_read_elsewhere_or_a_weighted_mean_is_left_alone():
    torch.manual_seed(0)
    gm = compiled(Kept().to(DT))
    assert intos(gm) == [], gm.code


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 12), e=st.integers(0, 40), seed=st.integers(0, 10**6), reduce=st.sampled_from(["sum", "mean"]))
def test_random_graphs_match_the_eager_model(n, e, seed, reduce):
    gen = torch.Generator().manual_seed(seed)
    g = sc.Graph.from_edges(torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen), n)
    torch.manual_seed(seed)
    model = Sage([4, 6, 6, 2], reduce).to(DT)
    check_same(model, compiled(model), g, torch.randn(n, 4, dtype=DT, generator=gen))


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_spmm_into_writes_the_buffer_and_its_gradient_passes_through(reduce):
    g = graph(2)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(g.num_nodes, 3, dtype=DT, generator=gen, requires_grad=True)
    r = torch.randn(g.num_nodes, 3, dtype=DT, generator=gen, requires_grad=True)
    want = sc.ops.spmm(g, x, reduce) + r
    gy = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (x, r), gy)
    root = r * 1.0  # a fresh buffer with a history
    got = sc.ops.spmm(g, x, reduce, into=root)
    assert got is root
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got, (x, r), gy), want_grads):
        torch.testing.assert_close(a, b)
    # A leaf that requires grad, or a buffer of another shape, is added out of place
    out = sc.ops.spmm(g, x, reduce, into=r)
    assert out is not r
    torch.testing.assert_close(out, want)
    wide = torch.zeros(g.num_nodes, 1, dtype=DT)
    torch.testing.assert_close(sc.ops.spmm(g, x, reduce, into=wide), sc.ops.spmm(g, x, reduce) + wide)


def test_into_refuses_what_it_cannot_add():
    g = graph(0)
    x = torch.randn(g.num_nodes, 2)
    with pytest.raises(sc.GraphError, match="into"):
        sc.ops.spmm(g, x, "max", into=torch.zeros_like(x))
    with pytest.raises(sc.GraphError, match="edge_weight"):
        sc.ops.spmm(g, x, "mean", edge_weight=torch.ones(g.num_edges), into=torch.zeros_like(x))
