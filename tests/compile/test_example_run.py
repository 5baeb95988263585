"""Running a program once on example inputs (sarcompile.compile.example_run.run_example):
the shapes of every value, or of those computed before a failure with the failure's first
line; the model's buffers, the RNG and gradients left as they were; a CompileError passed on."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

import sarcompile as sc
from sarcompile.compile.example_run import run_example


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 5)
        self.norm = nn.BatchNorm1d(5)  # training mode: a run updates its running statistics

    def forward(self, x):
        return F.dropout(self.norm(self.lin(x)), 0.5).sum(1)  # dropout draws from the RNG


class Raises(nn.Module):
    def __init__(self, error: Exception):
        super().__init__()
        self.error = error

    def forward(self, x):
        raise self.error


class Tracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, Raises) or super().is_leaf_module(m, qualname)


def _program(model: nn.Module) -> fx.GraphModule:
    return fx.GraphModule(model, Tracer().trace(model))


def _by_name(rec) -> dict[str, object]:
    return {n.name: shape for n, shape in rec.shapes.items()}


def test_every_value_is_recorded_and_nothing_of_the_model_changes():
    model = Model()
    gm = _program(model)
    x = torch.randn(4, 3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    rec, why = run_example(gm, [x], model)
    assert why == ""
    assert _by_name(rec) == {"x": (4, 3), "lin": (4, 5), "norm": (4, 5), "dropout": (4, 5), "sum_1": (4,), "output": (4,)}
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "buffers as before the run"
    assert torch.equal(torch.random.get_rng_state(), rng), "the RNG as before the run"
    assert all(p.grad is None for p in model.parameters())


class Failing(nn.Module):
    def __init__(self, error: Exception):
        super().__init__()
        self.lin = nn.Linear(3, 5)
        self.raises = Raises(error)

    def forward(self, x):
        return self.raises(self.lin(x))


def test_a_failure_keeps_the_shapes_before_it_and_names_its_first_line():
    model = Failing(ValueError("rows do not match\nsecond line"))
    rec, why = run_example(_program(model), [torch.randn(4, 3)], model)
    assert why == "ValueError: rows do not match"
    assert _by_name(rec) == {"x": (4, 3), "lin": (4, 5)}


def test_a_compile_error_is_the_front_ends_refusal_and_is_raised():
    model = Failing(sc.CompileError("GATConv: heads must be given"))
    with pytest.raises(sc.CompileError, match="heads must be given"):
        run_example(_program(model), [torch.randn(4, 3)], model)
