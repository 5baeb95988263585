"""The pipeline as data (sarcompile.compile.passes.PIPELINE): its docstring names exactly the
passes it lists, a compile runs exactly those whose ``when`` holds, in order, and the passes
it calls peepholes (``exact=False``) are that: without them a model computes the same
values and gradients as the eager model."""

from __future__ import annotations

import re
import sys

import pytest
import torch
from oracle import check_same
from torch import nn

import sarcompile as sc
from sarcompile.compile import passes, pipeline
from sarcompile.compile.call_shape import CallShape
from sarcompile.compile.passes import PIPELINE, When
from sarcompile.compile.passes.context import CompileOptions

DT = torch.float64


def _graph(n: int = 40, e: int = 160, seed: int = 0) -> sc.Graph:
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    return sc.Graph.from_edges(torch.cat([src, torch.arange(n)]), torch.cat([dst, torch.arange(n)]), n)


class Sage(nn.Module):
    """SAGE as PyG writes it: every peephole but head_dot applies (narrowing linear first,
    in-place activations, the stacked linears of one value, sums into a buffer, reuse of the
    first aggregation)."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([sc.nn.SAGEConv(16, 8), sc.nn.SAGEConv(8, 8), sc.nn.SAGEConv(8, 3)])

    def forward(self, g, x):
        for i, conv in enumerate(self.convs):
            x = conv(g, x)
            x = torch.relu(x) if i < len(self.convs) - 1 else x
        return x


class Gat(nn.Module):
    """Two GAT layers: head_dot's per-head scores."""

    def __init__(self):
        super().__init__()
        self.a, self.b = sc.nn.GATConv(16, 4, heads=2), sc.nn.GATConv(8, 3, heads=1)

    def forward(self, g, x):
        return self.b(g, torch.relu(self.a(g, x)))


def test_the_docstring_names_exactly_the_passes_in_order():
    listed = passes.__doc__.split("as :data:`PIPELINE` lists them:", 1)[1]
    named = re.findall(r"[a-z_]+", listed)
    assert named == [p.name for p in PIPELINE]


def test_every_pass_is_a_function_with_a_contract():
    for p in PIPELINE:
        doc = sys.modules[p.run.__module__].__doc__
        assert doc and doc.startswith(f"Pass ``{p.name}``") and "Contract." in doc, p.name
    assert len({p.name for p in PIPELINE}) == len(PIPELINE)
    peepholes = [p.name for p in PIPELINE if not p.exact]
    assert peepholes == ["linear_first", "reuse", "inplace", "linear_groups", "accumulate", "head_dot"]


@pytest.mark.parametrize("partitioned", [False, True])
def test_a_compile_runs_the_passes_whose_when_holds_in_order(partitioned):
    program = pipeline.compile_program(Sage().to(DT), CompileOptions(), partitioned, _call(Sage(), _graph()))
    ran = [name for name, _ in program.stages]
    want = ["trace"] + [p.name for p in PIPELINE
                        if p.when is When.ALWAYS or (p.when is When.WORKERS and partitioned)]
    assert ran == want


def _call(model: nn.Module, g: sc.Graph) -> CallShape:
    x = torch.randn(g.num_nodes, 16, dtype=DT)
    return CallShape.of_call(model.forward, (g, x), {}, 0)


@pytest.mark.parametrize("make", [Sage, Gat])
def test_without_the_peepholes_a_model_computes_what_eager_does(make, monkeypatch):
    g = _graph()
    torch.manual_seed(0)
    model = make().to(DT)
    x = torch.randn(g.num_nodes, 16, dtype=DT)
    check_same(model, sc.distribute(model), g, x)
    monkeypatch.setattr(pipeline, "PIPELINE", tuple(p for p in PIPELINE if p.exact))
    bare = sc.distribute(model)
    check_same(model, bare, g, x)
    stages = [name for name, _ in bare.program(False, _call(model, g)).stages]
    assert not {p.name for p in PIPELINE if not p.exact} & set(stages)
