"""The communication pass: which ops get which LinkPolicy (halo exchanges only, in program
order, within ``compress_layers``), exact options leave the program as it is, and an
attention op given a reduced link is reported with a warning naming the way out."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import sarcompile as sc
from sarcompile.compile.passes.communication import communication
from sarcompile.compile.passes.context import CompileOptions
from sarcompile.compile.passes.fuse import fuse
from sarcompile.compile.passes.lower import lower
from sarcompile.compile.passes.sar import sar
from sarcompile.compile.passes.strategy import strategy
from sarcompile.compile.trace import trace
from sarcompile.ir.attention import attention
from sarcompile.ir.node_info import info
from sarcompile.ir.vocab import LinkPolicy


class Net(nn.Module):
    # conv1 and conv10: a prefix covers a layer and its sublayers, not a name it begins
    def __init__(self):
        super().__init__()
        self.conv1 = sc.nn.SAGEConv(4, 4, "mean")
        self.conv10 = sc.nn.SAGEConv(4, 4, "sum")
        self.bn = sc.nn.BatchNorm(4)  # an all-reduce: never given a link
        self.att = sc.nn.GATConv(4, 4)  # the fuse pass makes it one attention op (approximate_warning)

    def forward(self, g, x):
        h = self.bn(self.conv10(g, self.conv1(g, x)))
        return sc.spmm(g, self.att(g, h), "sum")  # a top-level op: no layer


# program order of the ops, and which exchange halo rows (by hand from Net.forward)
OPS = ["conv1_spmm", "conv10_spmm", "bn_batch_norm", "attention", "spmm"]
HALO = ["conv1_spmm", "conv10_spmm", "attention", "spmm"]


def _program(options: CompileOptions):
    gm = fuse(lower(trace(Net())), options)
    return strategy(sar(gm, options), options)


def _ops(gm):
    return [n for n in gm.graph.nodes if info(n).ir_op is not None]


def _passed(options: CompileOptions):
    """The program after the pass, with the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gm = communication(_program(options), options)
    return gm, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_the_model_has_the_ops_the_expectations_name():
    assert [n.name for n in _ops(_program(CompileOptions()))] == OPS


def test_exact_options_change_nothing():
    options = CompileOptions()  # staleness=1, bounded_staleness=None, compress=None
    before = _program(options)
    code, kwargs = before.code, [dict(n.kwargs) for n in before.graph.nodes]
    gm, said = _passed(options)
    assert gm.code == code and [dict(n.kwargs) for n in gm.graph.nodes] == kwargs
    assert all(info(n).comm is None and info(n).comm_warning is None for n in gm.graph.nodes)
    assert "comm" not in gm.code and said == []
    # error_feedback and compress_layers alone reduce nothing either
    gm, said = _passed(CompileOptions(error_feedback=False, compress_layers=("conv1",)))
    assert gm.code == code and said == []


@pytest.mark.parametrize("kwargs, fields", [
    ({"staleness": 3}, {"staleness": 3, "bounded": 0, "bits": 0, "error_feedback": True}),
    ({"bounded_staleness": 2}, {"staleness": 1, "bounded": 2, "bits": 0, "error_feedback": True}),
    ({"compress": "1bit"}, {"staleness": 1, "bounded": 0, "bits": 1, "error_feedback": True}),
    ({"compress": "2bit"}, {"staleness": 1, "bounded": 0, "bits": 2, "error_feedback": True}),
    ({"compress": "int8", "error_feedback": False}, {"staleness": 1, "bounded": 0, "bits": 8, "error_feedback": False}),
    ({"compress": "int4", "staleness": 2}, {"staleness": 2, "bounded": 0, "bits": 4, "error_feedback": True}),
    ({"compress": "int4", "bounded_staleness": 5}, {"staleness": 1, "bounded": 5, "bits": 4, "error_feedback": True}),
])
def test_every_halo_op_gets_its_site_numbered_in_program_order(kwargs, fields):
    gm, _ = _passed(CompileOptions(**kwargs))
    expected = {name: LinkPolicy(site, name, **fields) for site, name in enumerate(HALO)}
    got = {n.name: (n.kwargs.get("comm"), info(n).comm) for n in _ops(gm)}
    assert got == {**{k: (v, v) for k, v in expected.items()}, "bn_batch_norm": (None, None)}
    assert all(type(p) is LinkPolicy for p, _ in got.values() if p is not None)
    # the rest of each op's keywords are kept
    before = {n.name: n.kwargs for n in _ops(_program(CompileOptions(**kwargs)))}
    assert {n.name: {k: v for k, v in n.kwargs.items() if k != "comm"} for n in _ops(gm)} == before
    assert gm.code.count("comm = sarcompile_ir_vocab_LinkPolicy(") == len(HALO)


@pytest.mark.parametrize("layers, linked", [
    (("conv1",), ["conv1_spmm"]),  # not conv10
    (("conv10", "att"), ["conv10_spmm", "attention"]),
    (("att.inner", "conv"), []),  # a prefix of a name is no layer path; nor a sublayer the op is not in
    ((), []),
])
def test_compress_layers_selects_by_layer_path(layers, linked):
    gm, said = _passed(CompileOptions(compress="int8", compress_layers=layers))
    got = {n.name: info(n).comm for n in _ops(gm) if info(n).comm is not None}
    assert got == {name: LinkPolicy(site, name, bits=8) for site, name in enumerate(linked)}
    assert {n.name: n.kwargs.get("comm") for n in _ops(gm) if "comm" in n.kwargs} == got
    assert len(said) == ("attention" in linked)


def test_an_attention_op_given_a_reduced_link_is_reported():
    gm, said = _passed(CompileOptions(staleness=2))
    att = next(n for n in gm.graph.nodes if n.name == "attention")
    assert said == [info(att).comm_warning]
    assert said[0].startswith("attention (layer att): stale or compressed communication on an attention op")
    assert "compress_layers=[...]" in said[0]
    assert [n.name for n in gm.graph.nodes if info(n).comm_warning is not None] == ["attention"]
    # left out of compress_layers: exact, and nothing said
    gm, said = _passed(CompileOptions(staleness=2, compress_layers=("conv1", "conv10")))
    assert said == [] and all(info(n).comm_warning is None for n in gm.graph.nodes)


def test_a_top_level_op_is_named_without_a_layer():
    class Top(nn.Module):
        def forward(self, g, x):
            return attention(g, x, x[:, 0], x[:, 0])

    options = CompileOptions(compress="1bit")
    with pytest.warns(UserWarning, match=r"^attention \(layer -\): "):
        gm = communication(strategy(sar(lower(trace(Top())), options), options), options)
    (op,) = _ops(gm)
    assert info(op).comm == LinkPolicy(0, "attention", bits=1)


def test_the_program_still_computes_the_same_on_one_machine():
    torch.manual_seed(0)
    g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 3, 4, 0]), torch.tensor([1, 2, 3, 4, 0, 0]), 5)
    x = torch.randn(5, 4, dtype=torch.float64)
    options = CompileOptions(compress="1bit", staleness=2)
    exact = _program(options).double()
    gm, _ = _passed(options)
    gm.load_state_dict(exact.state_dict())
    torch.testing.assert_close(gm.double()(g, x), exact(g, x), rtol=0, atol=0)


def test_refusals_come_from_the_options():
    for kwargs, match in [
        ({"staleness": 0}, "staleness must be an integer >= 1"),
        ({"staleness": True}, "staleness must be an integer >= 1"),
        ({"bounded_staleness": 0}, "bounded_staleness must be None or an integer >= 1"),
        ({"staleness": 2, "bounded_staleness": 2}, "pick one"),
        ({"compress": "3bit"}, "compress must be None or one of"),
        ({"compress_layers": "conv1"}, "compress_layers must be a list of layer paths"),
        ({"compress_layers": ("conv1", 2)}, "compress_layers must be a list of layer paths"),
    ]:
        with pytest.raises(sc.CompileError, match=match):
            CompileOptions(**kwargs)
