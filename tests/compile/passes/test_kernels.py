"""The kernels pass: every op with generated kernels says which executor runs it."""

import pytest
import torch
from torch import nn

import sarcompile as sc
from sarcompile.compile.passes.context import CompileOptions
from sarcompile.compile.passes.fuse import fuse
from sarcompile.compile.passes.kernels import kernels
from sarcompile.compile.passes.lower import lower
from sarcompile.compile.passes.sar import sar
from sarcompile.compile.passes.strategy import strategy
from sarcompile.compile.trace import trace


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.sage = sc.nn.SAGEConv(4, 6, "max")
        self.gat = sc.nn.GATConv(6, 3, heads=2)
        self.w = nn.Linear(6, 1)

    def forward(self, g, x):
        h = self.gat(g, self.sage(g, x))
        return h + sc.sddmm(g, self.w(h), self.w(h), "add").sum()  # sddmm: torch code only


def _executors(gm):
    return {n.target.__name__: n.kwargs.get("executor") for n in gm.graph.nodes if n.op == "call_function"
            and n.target in (sc.spmm, sc.ops.attention, sc.sddmm)}


@pytest.mark.parametrize("executor", ["auto", "torch"])
def test_single_machine_program_names_its_executor(executor):
    gm = kernels(fuse(lower(trace(Net()))), CompileOptions(executor=executor))
    assert _executors(gm) == {"spmm": executor, "attention": executor, "sddmm": None}
    assert f"executor = Executor.{executor.upper()}" in gm.code


def test_partitioned_program_keeps_strategies_and_gets_executors():
    options = CompileOptions(executor="torch")
    gm = kernels(strategy(sar(fuse(lower(trace(Net()))), options), options), options)
    for n in gm.graph.nodes:
        if n.target in (sc.spmm, sc.ops.attention):
            assert n.kwargs["executor"] == "torch" and n.kwargs["strategy"] in ("direct", "remat")


def test_values_do_not_change():
    torch.manual_seed(0)
    net = Net()
    g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 3, 3]), torch.tensor([1, 2, 0, 0, 1]), 5)
    x = torch.randn(5, 4)
    want = fuse(lower(trace(net)))(g, x)
    got = kernels(fuse(lower(trace(net))), CompileOptions(executor="torch"))(g, x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
