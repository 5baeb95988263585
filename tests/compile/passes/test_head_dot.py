"""The head_dot pass: GAT's per-head scores ``(h * att).sum(-1)`` as one op whose forward
and parameter gradient work a block of rows at a time -- against the eager model (values
and every gradient, float64) and autograd's own ``mul``/``sum``."""

from __future__ import annotations

import pytest
import torch
from oracle import check_same
from test_linear_groups import graph
from torch import nn

import sarcompile as sc
from sarcompile.codegen import torch_kernels as T
from sarcompile.compile.passes import head_dot as hd
from sarcompile.compile.passes.lower import lower
from sarcompile.compile.trace import trace

DT = torch.float64


class Scores(nn.Module):
    """Both spellings of the scores, one product also read elsewhere (left alone)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 6)
        self.att_src, self.att_dst = nn.Parameter(torch.randn(1, 2, 3)), nn.Parameter(torch.randn(2, 3))

    def forward(self, g, x):
        h = self.lin(x).view(-1, 2, 3)
        a = (h * self.att_src).sum(-1) + torch.sum(self.att_dst * h, dim=-1)
        p = h * self.att_dst
        return a + p.sum(-1) + p[:, :, 0]


def test_scores_become_one_op_and_match_the_eager_model():
    torch.manual_seed(0)
    model = Scores().to(DT)
    gm = hd.head_dot(lower(trace(model)))
    assert sum(n.target is hd.head_dot_op for n in gm.graph.nodes) == 2, gm.code
    for seed in range(2):
        g = graph(seed)
        check_same(model, gm, g, torch.randn(g.num_nodes, 5, dtype=DT))


@pytest.mark.parametrize("rows", [1, 7, 40])
def test_row_blocks_give_autograds_gradients(rows, monkeypatch):
    monkeypatch.setattr(T, "EDGE_CHUNK_ELEMENTS", 12)  # two rows of 2 x 3 per block
    gen = torch.Generator().manual_seed(rows)
    h = torch.randn(rows, 2, 3, dtype=DT, generator=gen, requires_grad=True)
    att = torch.randn(1, 2, 3, dtype=DT, generator=gen, requires_grad=True)
    d = torch.randn(rows, 2, dtype=DT, generator=gen)
    want = (h * att).sum(-1)
    got = hd.head_dot_op(h, att)
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got, (h, att), d), torch.autograd.grad(want, (h, att), d)):
        torch.testing.assert_close(a, b)


def test_other_shapes_run_the_plain_ops():
    h, att = torch.randn(4, 6), torch.randn(6, requires_grad=True)
    out = hd.head_dot_op(h, att)
    torch.testing.assert_close(out, (h * att).sum(-1))
    assert "HeadDot" not in type(out.grad_fn).__name__


def test_a_compiled_gat_matches_the_eager_one():
    torch.manual_seed(0)
    model = nn.ModuleList([sc.nn.GATConv(5, 3, heads=2), sc.nn.GATConv(6, 2, heads=1)]).to(DT)

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = model

        def forward(self, g, x):
            return self.layers[1](g, torch.nn.functional.elu(self.layers[0](g, x)))

    eager = Two()
    compiled = sc.distribute(eager)
    g = graph(3)
    check_same(eager, compiled, g, torch.randn(g.num_nodes, 5, dtype=DT))
    plan = compiled.plan(g, 2, x=torch.zeros(g.num_nodes, 5, dtype=DT), method="contiguous")
    assert "head_dot_op" in plan.stage("head_dot")
