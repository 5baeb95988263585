import pytest
import torch
from torch import nn

import sarcompile as sc
from sarcompile.compile.passes.context import CompileOptions
from sarcompile.ir.node_info import info
from sarcompile.ir.vocab import Strategy
from sarcompile.compile.passes.lower import lower
from sarcompile.compile.passes.sar import sar
from sarcompile.compile.passes.strategy import strategy
from sarcompile.compile.trace import trace


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.sage = sc.nn.SAGEConv(4, 4, "mean")
        self.w = nn.Linear(4, 1)

    def forward(self, g, x):
        h = self.sage(g, x)
        e = sc.edge_softmax(g, sc.sddmm(g, self.w(h), self.w(h), "add").squeeze(-1))
        h = sc.spmm(g, h, "sum", edge_weight=e)  # weighted: backward reads remote h
        return sc.sddmm(g, h, h, "dot")  # dot: backward reads remote h


def _compile(options: CompileOptions):
    gm = lower(trace(Mixed()))
    return strategy(sar(gm, options), options)


def _ops(gm):
    return [(n.target.__name__, n.kwargs["strategy"]) for n in gm.graph.nodes if info(n).ir_op is not None]


def test_sar_marks_communicating_ops_only():
    gm = sar(lower(trace(Mixed())), CompileOptions())
    marked = [n.target for n in gm.graph.nodes if info(n).ir_op is not None]
    assert marked == [sc.spmm, sc.sddmm, sc.spmm, sc.sddmm]
    # remat until the strategy pass decides: it never leaves a gradient without its inputs
    assert all(n.kwargs == {"strategy": Strategy.REMAT} for n in gm.graph.nodes if info(n).ir_op is not None)
    softmax = [n for n in gm.graph.nodes if n.target is sc.edge_softmax]
    assert softmax and "strategy" not in softmax[0].kwargs  # local: a node's in-edges live on its worker


def test_strategy_per_mode():
    assert _ops(_compile(CompileOptions("sar"))) == [
        ("spmm", "direct"), ("sddmm", "direct"), ("spmm", "remat"), ("sddmm", "remat")
    ]
    for mode in ("stash", "oneshot"):
        assert {s for _, s in _ops(_compile(CompileOptions(mode)))} == {mode}


def test_user_override_by_layer_and_node():
    gm = _compile(CompileOptions("sar", strategies={"sage": "stash", "spmm": "stash"}))
    ops = _ops(gm)
    assert ops[0] == ("spmm", "stash") and ops[2] == ("spmm", "stash")
    reasons = [info(n).strategy_reason for n in gm.graph.nodes if info(n).ir_op is not None]
    assert "set by the user" in reasons[0]


def test_unknown_strategy_key_is_refused_listing_the_valid_ones():
    with pytest.raises(sc.CompileError, match="'typo'") as info:
        _compile(CompileOptions("sar", strategies={"typo": "stash"}))
    assert "'sage'" in str(info.value) and "'spmm'" in str(info.value)  # the valid keys


def test_direct_is_refused_where_backward_reads_remote_inputs():
    # the weighted spmm (node "spmm") reads remote h in backward: direct would drop its gradient
    with pytest.raises(sc.CompileError, match="'direct'.*reads remote inputs"):
        _compile(CompileOptions("sar", strategies={"spmm": "direct"}))


def test_direct_on_a_shard_by_hand_is_refused_where_backward_reads_remote_inputs():
    from sarcompile.graph.shard import ShardGraph

    g = sc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    w = torch.ones(2, requires_grad=True)
    with pytest.raises(sc.CompileError, match="'direct'"):
        sc.spmm(ShardGraph.single(g), torch.randn(2, 3), "sum", w, strategy="direct")
    sc.spmm(ShardGraph.single(g), torch.randn(2, 3), "sum", w.detach(), strategy="direct")  # nothing read


def test_bad_options_are_rejected_early():
    with pytest.raises(sc.CompileError, match="mode must be one of"):
        sc.distribute(Mixed(), mode="fast")
    with pytest.raises(sc.CompileError, match="strategies"):
        sc.distribute(Mixed(), strategies={"sage": "sometimes"})
    with pytest.raises(sc.CompileError, match="staleness must be an integer"):
        sc.distribute(Mixed(), staleness=0)
    with pytest.raises(sc.CompileError, match="executor must be one of"):
        sc.distribute(Mixed(), executor="cuda")
    for bad in (-1, True, "1", 1.0):
        with pytest.raises(sc.CompileError, match=r"blocks_in_flight must be an integer >= 0 \(0: no overlap"):
            sc.distribute(Mixed(), blocks_in_flight=bad)


def test_every_exchanging_op_gets_the_blocks_in_flight():
    gm = _compile(CompileOptions(blocks_in_flight=3))
    assert [n.kwargs["in_flight"] for n in gm.graph.nodes if info(n).ir_op is not None] == [3, 3, 3, 3]


def test_instance_norm_is_rejected_at_compile_time():
    # (torch.nn.BatchNorm1d lowers to the global batch norm, as sc.nn.BatchNorm.)
    class BN(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = sc.nn.SAGEConv(4, 4)
            self.bn = nn.InstanceNorm1d(4)

        def forward(self, g, x):
            return self.bn(self.c(g, x))

    with pytest.raises(sc.CompileError, match="'bn' .*InstanceNorm1d.*sc.nn.BatchNorm"):
        sar(lower(trace(BN())), CompileOptions())


def test_value_dependent_control_flow_fails_with_a_clear_error():
    class Branchy(nn.Module):
        def forward(self, g, x):
            if x.sum() > 0:
                return sc.spmm(g, x)
            return x

    g = sc.Graph.from_edges(torch.tensor([0]), torch.tensor([1]), 2)
    with pytest.raises(sc.CompileError, match="control flow may not depend on tensor values"):
        sc.distribute(Branchy())(g, torch.randn(2, 3))


class _FloatOfMax(nn.Module):
    def forward(self, g, x):
        return x * float(x.max())


class _RangeOverRows(nn.Module):
    def forward(self, g, x):
        for _ in range(int(x.shape[0])):
            x = x + 1
        return x


@pytest.mark.parametrize("model, line", [(_FloatOfMax, "float(x.max())"), (_RangeOverRows, "range(int(x.shape[0]))")])
def test_a_traced_value_used_as_a_python_number_names_the_line(model, line):
    g = sc.Graph.from_edges(torch.tensor([0]), torch.tensor([1]), 2)
    with pytest.raises(sc.CompileError, match="used as a Python number") as info:
        sc.distribute(model())(g, torch.randn(2, 3))
    assert line in str(info.value) and "test_sar_strategy.py:" in str(info.value)


class _BranchOnValues(nn.Module):
    def forward(self, x):
        if x.mean() > 0:  # the line the error must quote
            return x
        return -x


def test_control_flow_error_names_the_layer_and_the_line():
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = sc.nn.SAGEConv(3, 3)
            self.head = _BranchOnValues()

        def forward(self, g, x):
            return self.head(self.conv(g, x))

    g = sc.Graph.from_edges(torch.tensor([0]), torch.tensor([1]), 2)
    with pytest.raises(sc.CompileError) as info:
        sc.distribute(Outer())(g, torch.randn(2, 3))
    message = str(info.value)
    assert "in layer 'head' (_BranchOnValues)" in message
    assert "test_sar_strategy.py:" in message and "`if x.mean() > 0:" in message


def test_model_call_without_graph_argument():
    with pytest.raises(sc.CompileError, match="no graph: sarcompile looked in forward.s arguments"):
        sc.distribute(Mixed())(torch.randn(3, 4))
