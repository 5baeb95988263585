"""Features on ``device="meta"`` through trace, the passes, lowering and the plan (issue 55):
a compile and a plan read only the features' shape and dtype, so a meta tensor (no data)
stands for them, and nothing made on a device of its own mixes with it (torch refuses a
CPU tensor beside a meta one).

The oracle is the same model compiled and planned with CPU features: the stages and the
plan must be the same.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import sarcompile as sc
from sarcompile.compile.call_shape import CallShape

N, D = 30, 8


class SAGE(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = sc.nn.SAGEConv(D, 16), sc.nn.SAGEConv(16, 3)

    def forward(self, g, x):
        return self.b(g, torch.relu(self.a(g, x)))


class GAT(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = sc.nn.GATConv(D, 4, heads=2), sc.nn.GATConv(8, 3)

    def forward(self, g, x):
        return self.b(g, torch.relu(self.a(g, x)))


def _graph() -> sc.Graph:
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, N, (100,), generator=gen), torch.randint(0, N, (100,), generator=gen)
    return sc.Graph.from_edges(torch.cat([src, torch.tensor([5, 5])]), torch.cat([dst, torch.tensor([5, 7])]), N)


def _ops(plan) -> list[tuple]:
    """The plan's ops and estimates, without wall times."""
    return [dataclasses.astuple(op) for op in plan.ops] + [dataclasses.astuple(e) for e in plan.estimates]


@pytest.mark.parametrize("model_class", [SAGE, GAT])
@pytest.mark.parametrize("partitioned", [False, True])
def test_meta_features_compile_as_cpu_ones(model_class, partitioned):
    torch.manual_seed(0)
    model = sc.distribute(model_class())
    meta = torch.empty(N, D, device="meta")
    program = model.program(partitioned, CallShape.default(model.original.forward, x=meta))
    names = [name for name, _ in program.stages]
    assert names[0] == "trace" and "lower" in names and names[-1] == "head_dot"
    cpu = sc.distribute(model.original).program(partitioned, CallShape.default(model.original.forward,
                                                                               x=torch.zeros(N, D)))
    assert program.stages == cpu.stages


@pytest.mark.parametrize("model_class", [SAGE, GAT])
def test_meta_features_plan_as_cpu_ones(model_class):
    torch.manual_seed(0)
    model = model_class()
    meta = sc.distribute(model).plan(_graph(), 2, x=torch.empty(N, D, device="meta"), method="contiguous")
    cpu = sc.distribute(model).plan(_graph(), 2, x=torch.zeros(N, D), method="contiguous")
    assert _ops(meta) == _ops(cpu) and meta.ops
