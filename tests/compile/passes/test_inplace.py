"""The inplace pass alone (trace -> lower -> inplace): which sums and activations it
writes into a free temporary, what it must leave out of place, the run-time fallbacks of
its helpers, and that values and every gradient equal the eager model's (float64)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from oracle import check_same
from torch import fx, nn

import sarcompile as sc
from sarcompile.compile.passes.inplace import add_into, elu_into, inplace, relu_into
from sarcompile.compile.passes.lower import lower
from sarcompile.compile.trace import trace

DT = torch.float64


def graph(seed: int, n: int = 15, e: int = 50) -> sc.Graph:
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n - 2, (e,), generator=gen), torch.randint(0, n - 2, (e,), generator=gen)
    return sc.Graph.from_edges(torch.cat([src, torch.arange(3)]), torch.cat([dst, torch.arange(3)]), n)


class Layer(nn.Module):
    """A SAGE-like layer, then what may not be written in place."""

    def __init__(self):
        super().__init__()
        self.l, self.r, self.s = nn.Linear(5, 4), nn.Linear(5, 4), nn.Linear(5, 1)
        self.act = nn.ReLU()

    def forward(self, g, x):
        h = self.act(self.l(sc.ops.spmm(g, x, "mean")) + self.r(x))  # add and relu: in place
        h = F.elu(h + 1.0)  # relu's result is kept: the sum is new, then elu writes into it
        kept = torch.sigmoid(self.r(x))  # sigmoid keeps its output: the add below may not write into it
        twice = self.l(x)  # read twice: stays
        narrow = self.s(x) + self.r(x)  # [n, 1] + [n, 4]: the helper adds out of place
        return h + kept + twice * twice + narrow + torch.relu(sc.ops.spmm(g, x, "max")).sum(1, keepdim=True)


def targets(gm: fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_free_temporaries_are_written_and_nothing_else():
    torch.manual_seed(0)
    model = Layer().to(DT)
    gm = inplace(lower(trace(model)))
    t = targets(gm)
    assert t.count(relu_into) == 1 and t.count(elu_into) == 1  # the max's relu reads a fresh spmm(max): stays
    assert torch.relu in t and torch.sigmoid in t
    adds = [n.args[0].name for n in gm.graph.nodes if n.op == "call_function" and n.target is add_into]
    # into: lin_l's output; self.s(x) (falls back at run time); the running sum after h + kept
    # (elu's and sigmoid's results are kept: that first sum is new), three times
    assert adds == ["l", "s", "add_3", "add_4", "add_5"], gm.code
    for seed in range(3):
        g = graph(seed)
        check_same(model, gm, g, torch.randn(g.num_nodes, 5, dtype=DT))


def test_helpers_fall_back_out_of_place():
    a = torch.zeros(3, 1, dtype=DT)
    b = torch.ones(3, 4, dtype=DT)
    out = add_into(a, b)  # broadcasts a: a new tensor
    assert out.shape == (3, 4) and torch.equal(a, torch.zeros(3, 1, dtype=DT))
    f32 = torch.zeros(3, 4)
    assert add_into(f32, b).dtype == DT and torch.equal(f32, torch.zeros(3, 4))  # promotes: out of place
    base = torch.randn(3, 4)
    view = base[:, :2]
    relu_into(view)
    elu_into(view, 1.0)
    assert torch.equal(base, base.clone()) and view._base is base
    before = base.clone()
    relu_into(base[:, :2])
    assert torch.equal(base, before)  # a view is never written
    fresh = torch.tensor([-1.0, 2.0])
    assert relu_into(fresh) is fresh and torch.equal(fresh, torch.tensor([0.0, 2.0]))


def test_compiled_model_with_an_empty_graph():
    """An empty graph's aggregation may come back as a view: the helpers add out of place."""
    torch.manual_seed(1)
    model = Layer().to(DT)
    g = sc.Graph.from_edges(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long), 4)
    x = torch.randn(4, 5, dtype=DT)
    check_same(model, sc.distribute(model), g, x)
