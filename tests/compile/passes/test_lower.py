import pytest
import torch
import torch.fx as fx
from torch import nn

import sarcompile as sc
from sarcompile.compile.call_shape import CallShape
from sarcompile.compile.pipeline import compile_program
from sarcompile.ir.lowering import register_lowering
from sarcompile.ir.node_info import info
from sarcompile.compile.passes.context import CompileOptions
from sarcompile.compile.passes.lower import lower
from sarcompile.compile.trace import trace


def _graph(n=12, e=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return sc.Graph.from_edges(torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen), n)


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = sc.nn.SAGEConv(4, 4, "max")
        self.b = sc.nn.GCNConv(4, 3)

    def forward(self, g, x):
        return self.b(g, torch.relu(self.a(g, x)))


def _targets(gm: fx.GraphModule, op: str):
    return [n.target for n in gm.graph.nodes if n.op == op]


def test_layers_are_leaves_after_trace_and_gone_after_lower():
    gm = trace(Two())
    assert _targets(gm, "call_module") == ["a", "b"]
    gm = lower(gm)
    assert "a" not in _targets(gm, "call_module") and "b" not in _targets(gm, "call_module")
    assert _targets(gm, "call_function").count(sc.spmm) == 2
    layers = {info(n).layer for n in gm.graph.nodes if n.target is sc.spmm}
    assert layers == {"a", "b"}


def test_lowered_program_equals_eager_and_uses_original_parameters():
    torch.manual_seed(0)
    model = Two().double()
    gm = lower(trace(model))
    g, x = _graph(), torch.randn(12, 4, dtype=torch.float64)
    torch.testing.assert_close(gm(g, x), model(g, x), rtol=0, atol=0)
    gm(g, x).sum().backward()
    assert model.a.lin_l.weight.grad is not None and model.b.lin.weight.grad is not None


def test_rule_returning_a_stand_in_module():
    class Legacy(nn.Module):  # a layer without IR ops, e.g. from another library
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, 4))

        def forward(self, g, x):
            raise AssertionError("the lowered stand-in must run instead")

    class StandIn(nn.Module):
        def __init__(self, legacy):
            super().__init__()
            self.weight = legacy.weight  # the very same Parameter: gradients land on the layer

        def forward(self, g, x):
            return sc.spmm(g, x @ self.weight, "sum")

    register_lowering(Legacy, StandIn)

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = Legacy()

        def forward(self, g, x):
            return self.l(g, x) + 1

    model = Wrap()
    gm = lower(trace(model))
    g, x = _graph(), torch.randn(12, 4)
    want = sc.spmm(g, x @ model.l.weight, "sum") + 1
    torch.testing.assert_close(gm(g, x), want)


def test_a_stand_in_may_branch_on_the_feature_width_of_its_arguments():
    class Padded(nn.Module):  # a layer that pads narrower features, as PyG's GatedGraphConv does
        def __init__(self, width: int):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(width, width, dtype=torch.float64))

        def forward(self, g, x):
            raise AssertionError("the lowered stand-in must run instead")

    class PaddedStandIn(nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, g, x):
            width = self.layer.weight.size(0)
            if x.size(-1) < width:  # known when compiling: the traced argument's example says 3
                x = torch.cat([x, x.new_zeros(x.size(0), width - x.size(-1))], dim=-1)
            return sc.spmm(g, x @ self.layer.weight, "sum")

    register_lowering(Padded, PaddedStandIn)

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = Padded(5)

        def forward(self, g, x):
            return self.l(g, x[:, :3])

    model = Wrap()
    g, x = _graph(), torch.randn(12, 4, dtype=torch.float64)
    call = CallShape.of_call(model.forward, (g, x), {}, 0)
    gm = compile_program(model, CompileOptions(), False, call).module
    want = sc.spmm(g, torch.cat([x[:, :3], torch.zeros(12, 2, dtype=torch.float64)], -1) @ model.l.weight, "sum")
    torch.testing.assert_close(gm(g, x), want, rtol=0, atol=0)
    with pytest.raises(sc.CompileError, match="layer 'l'.*control flow"):  # without examples, as before
        lower(trace(model))
