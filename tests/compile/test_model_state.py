"""A forward that changes the model's own state is refused when it is traced, naming the
attribute and the line, and leaves the model as it was; one that sets an attribute alike on
every call, keeps values on private attributes, or updates batch norm's statistics compiles
and computes what the eager model computes, call after call."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import sarcompile as sc
from sarcompile.errors import CompileError

DT = torch.float64


def _graph(n: int = 12, e: int = 40) -> sc.Graph:
    gen = torch.Generator().manual_seed(0)
    return sc.Graph.from_edges(torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen), n)


G, X = _graph(), torch.randn(12, 4, dtype=DT)


class Stateful(nn.Module):
    """A graph layer whose forward first runs ``update(self)``."""

    def __init__(self, update):
        super().__init__()
        self.conv = sc.nn.SAGEConv(4, 3)
        self.register_buffer("calls", torch.zeros(()))
        self.k = 1
        self.scale = torch.ones(())  # a plain tensor attribute: not a buffer, as fx hands it over
        self.mode = "start"
        self.update = update

    def forward(self, g, x):
        self.update(self)
        return self.conv(g, x) * self.calls.add(1) * self.k


def _set_item(m):
    m.calls[...] = 5.0


def _set_mode(m):
    m.mode = "running"


def _keep_private(m):
    m._last = m.conv.lin_l.weight.sum()


UPDATES = {
    "add_": (lambda m: m.calls.add_(1), "updates 'calls' in place (`add_`)"),
    "+=": (lambda m: m.calls.__iadd__(1), "updates 'calls' in place"),
    "fill_ under no_grad": (lambda m: torch.no_grad()(m.calls.fill_)(2.0), "updates 'calls' in place (`fill_`)"),
    "setitem": (_set_item, "updates 'calls' in place (`__setitem__`)"),
    "a view's mul_": (lambda m: m.calls.view(1).mul_(2), "updates 'calls' in place (`mul_`)"),
    "a parameter's data": (lambda m: m.conv.lin_l.weight.data.mul_(0.5), "updates 'conv.lin_l.weight' in place"),
    "a new buffer": (lambda m: setattr(m, "calls", m.calls + 1), "assigns 'calls'"),
    "a counter": (lambda m: setattr(m, "k", m.k + 1), "assigns 'k' (1 -> 2 -> 3)"),
    "a tensor attribute's add_": (lambda m: m.scale.add_(1), "updates 'scale' in place (`add_`)"),
    "a new tensor attribute": (lambda m: setattr(m, "scale", m.scale + 1), "assigns 'scale'"),
}


@pytest.mark.parametrize("name", list(UPDATES))
def test_a_state_update_in_forward_is_refused_and_the_model_left_as_it_was(name):
    update, said = UPDATES[name]
    model = Stateful(update).to(DT)
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(CompileError) as e:
        sc.distribute(model)(G, X)
    msg = str(e.value)
    assert said in msg and "it changes the model's state" in msg and "outside forward" in msg, msg
    assert "test_model_state.py" in msg or name.startswith(("a new", "a counter")), msg
    assert model.k == 1 and float(model.scale) == 1.0 and model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("update", [_set_mode, _keep_private], ids=["set alike every call", "private attribute"])
def test_what_forward_sets_alike_every_call_compiles_and_stays_exact(update):
    eager = Stateful(update).to(DT)
    model = copy.deepcopy(eager)
    compiled = sc.distribute(model)
    for _ in range(3):
        assert torch.allclose(compiled(G, X), eager(G, X), rtol=0, atol=1e-12)
    assert model.mode == eager.mode


def test_batch_norm_statistics_are_updated_by_the_program_on_every_call():
    class WithNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm = sc.nn.SAGEConv(4, 3), nn.BatchNorm1d(3)

        def forward(self, g, x):
            return self.norm(self.conv(g, x))

    eager = WithNorm().to(DT)
    model = copy.deepcopy(eager)
    compiled = sc.distribute(model)
    for _ in range(3):
        assert torch.allclose(compiled(G, X), eager(G, X), rtol=0, atol=1e-12)
    for k, v in eager.state_dict().items():
        assert torch.allclose(model.state_dict()[k].to(v.dtype), v, rtol=0, atol=1e-12), k
