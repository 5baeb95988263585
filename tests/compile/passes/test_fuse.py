"""The fuse pass alone: attention chains -> one ``sc.ops.attention`` node, on small traced
models (trace -> lower -> fuse); what it must leave alone; and that the fused program
computes what the unfused one and the eager model compute."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import sarcompile as sc
from sarcompile.ir.node_info import info
from sarcompile.ir.ops import edge_dropout, edge_softmax, sddmm, spmm
from sarcompile.compile.passes.fuse import fuse
from sarcompile.compile.passes.lower import lower
from sarcompile.compile.trace import trace

DT = torch.float64
N, F_IN, HEADS, C = 14, 4, 2, 3
CHAIN_OPS = {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.edge_dropout, sc.ops.spmm}


def graph_with_loops():
    """Random edges without self-loops, then one self-loop per node, in node order: its
    ``with_self_loops()`` has the very same edges in the same order."""
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, N - 2, (50,), generator=gen), torch.randint(0, N - 2, (50,), generator=gen)
    keep = src != dst
    loops = torch.arange(N)
    g = sc.Graph.from_edges(torch.cat([src[keep], loops]), torch.cat([dst[keep], loops]), N)
    gs = g.with_self_loops()
    assert torch.equal(gs.src, g.src) and torch.equal(gs.dst, g.dst)
    return g


def lowered(model: nn.Module) -> fx.GraphModule:
    return lower(trace(model))


def fused(model: nn.Module) -> fx.GraphModule:
    return fuse(lower(trace(model)))


def calls(gm: fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def attention_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is sc.ops.attention]


def run(fn, module, g, x):
    """Outputs and the gradients of x and of every parameter for a fixed loss."""
    x = x.clone().requires_grad_()
    out = fn(g, x)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o * torch.cos(torch.arange(o.numel(), dtype=DT)).reshape(o.shape)).sum() for o in outs)
    params = [p for _, p in module.named_parameters()]
    grads = torch.autograd.grad(loss, [x, *params], allow_unused=True, materialize_grads=True)
    return [o.detach() for o in outs], grads


def assert_same(a, b):
    assert len(a[0]) == len(b[0])
    for o1, o2 in zip(a[0], b[0]):
        torch.testing.assert_close(o1, o2)
    for i, (g1, g2) in enumerate(zip(a[1], b[1])):
        torch.testing.assert_close(g1, g2, msg=lambda m, i=i: f"gradient {i}: {m}")


def check_programs_agree(model: nn.Module, g=None):
    """fused program == lowered (unfused) program == eager model, forward and backward.
    Each runs on its own copy, so dropout steps advance alike."""
    g = graph_with_loops() if g is None else g
    x = torch.randn(N, F_IN, generator=torch.Generator().manual_seed(1), dtype=DT)
    eager, unf, fus = copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model)
    gm_unf, gm_fus = lowered(unf), fused(fus)
    for _ in range(2):  # twice: a second dropout step too
        expected = run(eager, eager, g, x)
        assert_same(run(gm_unf, unf, g, x), expected)
        assert_same(run(gm_fus, fus, g, x), expected)
    return gm_fus


# -- GATConv ------------------------------------------------------------------------------------


class GATNet(nn.Module):
    def __init__(self, dropout=0.0, layers=1):
        super().__init__()
        torch.manual_seed(0)
        self.convs = nn.ModuleList(
            [sc.nn.GATConv(F_IN if i == 0 else HEADS * C, C, heads=HEADS, dropout=dropout, seed=7 + i) for i in range(layers)]
        )

    def forward(self, g, x):
        for conv in self.convs:
            x = torch.relu(conv(g, x))
        return x


def test_gatconv_lowers_to_the_chain_and_fuses_into_one_attention():
    model = GATNet().double().eval()
    gm = lowered(copy.deepcopy(model))
    targets = calls(gm)
    assert targets.count(sc.ops.sddmm) == targets.count(sc.ops.edge_softmax) == targets.count(sc.ops.spmm) == 1
    assert F.leaky_relu in targets and sc.ops.attention not in targets

    gm = fused(model)
    assert not CHAIN_OPS & set(calls(gm)) and F.leaky_relu not in calls(gm)
    (att,) = attention_nodes(gm)
    g_node, _h, _a_src, _a_dst, slope, p, salt, a_edge = att.args
    assert slope == 0.2 and p == 0.0 and salt is None and a_edge is None
    assert g_node.op == "call_method" and g_node.target == "with_self_loops"
    assert len(info(att).fused) == 4  # sddmm, leaky_relu, edge_softmax, spmm
    check_programs_agree(model)


def test_two_gat_layers_give_two_attention_nodes():
    model = GATNet(layers=2).double().eval()
    gm = check_programs_agree(model)
    assert len(attention_nodes(gm)) == 2 and not CHAIN_OPS & set(calls(gm))


def test_gatconv_dropout_in_training_is_absorbed():
    model = GATNet(dropout=0.5).double().train()
    gm = lowered(copy.deepcopy(model))
    assert sc.ops.edge_dropout in calls(gm)
    gm = fused(copy.deepcopy(model))
    assert not CHAIN_OPS & set(calls(gm))
    (att,) = attention_nodes(gm)
    assert att.args[5] == 0.5
    salt = att.args[6]
    assert isinstance(salt, fx.Node) and salt.op == "call_module" and salt.target == "convs.0.attn_drop"
    assert len(info(att).fused) == 5
    check_programs_agree(model)
    # in eval mode there is no dropout to absorb
    (att,) = attention_nodes(fused(copy.deepcopy(model).eval()))
    assert att.args[5] == 0.0 and att.args[6] is None


# -- raw IR ops in user code --------------------------------------------------------------------


class RawAttention(nn.Module):
    """An attention layer written with the raw ops; the flags break the chain in one place."""

    def __init__(self, act="functional", sddmm_op="add", reduce="sum", dropout=0.0, graphs=None, extra=None, edge=None):
        super().__init__()
        torch.manual_seed(1)
        self.act, self.sddmm_op, self.reduce, self.dropout, self.extra = act, sddmm_op, reduce, dropout, extra
        self.edge = edge  # an edge term added to the scores: "after", "before" (e + s), "param", "used"
        self.graphs = graphs or {}
        self.lin = nn.Linear(F_IN, HEADS * C)
        self.w_src = nn.Parameter(torch.randn(HEADS, C))
        self.w_dst = nn.Parameter(torch.randn(HEADS, C))
        self.leaky = nn.LeakyReLU(0.3)
        self.stream = sc.nn.RandomStream(seed=3)
        self.w_edge = nn.Parameter(torch.randn(HEADS))

    def _graph(self, g, which):
        return g.with_self_loops() if self.graphs.get(which) else g

    def forward(self, g, x):
        h = self.lin(x).view(x.shape[0], HEADS, C)
        a_src, a_dst = (h * self.w_src).sum(-1), (h * self.w_dst).sum(-1)
        raw = sddmm(self._graph(g, "sddmm"), a_src, a_dst, self.sddmm_op)
        # a per-edge term from the inputs (an sddmm of its own: sin(x_u * x_v) per head)
        if self.edge:
            e = torch.sin(sddmm(self._graph(g, "sddmm"), x[:, :HEADS], x[:, :HEADS], "mul")) * self.w_edge
        if self.edge in ("after", "used"):
            raw = raw + e
        elif self.edge == "before":
            raw = e + raw
        elif self.edge == "param":  # the same for every edge: no per-edge tensor
            raw = raw + self.w_edge
        if self.act == "functional":
            score = F.leaky_relu(raw, 0.1)
        elif self.act == "functional_kw":
            score = F.leaky_relu(raw, negative_slope=0.15)
        elif self.act == "module":
            score = self.leaky(raw)
        else:
            score = raw
        weight = edge_softmax(self._graph(g, "softmax"), score)
        if self.dropout:
            weight = edge_dropout(self._graph(g, "dropout"), weight, self.dropout, self.stream())
        out = spmm(self._graph(g, "spmm"), h, self.reduce, edge_weight=weight).flatten(1)
        if self.extra == "return_weight":
            return out, weight
        if self.extra == "weight_loss":
            return out + weight.square().sum()
        if self.extra == "score_used":
            return out + score.sum(0).sum()
        if self.extra == "raw_score_used":
            return out + torch.tanh(raw).mean()
        if self.edge == "used":
            return out + e.sum(0).sum()
        return out


@pytest.mark.parametrize(
    "act, slope", [("functional", 0.1), ("functional_kw", 0.15), ("module", 0.3), (None, 1.0)]
)
@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_raw_ops_fuse(act, slope, dropout):
    model = RawAttention(act=act, dropout=dropout).double().train()
    gm = fused(copy.deepcopy(model))
    assert not CHAIN_OPS & set(calls(gm))
    assert F.leaky_relu not in calls(gm)
    assert "leaky" not in [n.target for n in gm.graph.nodes if n.op == "call_module"]
    (att,) = attention_nodes(gm)
    assert att.args[4] == slope and att.args[5] == dropout
    if dropout:
        assert att.args[6].op == "call_module" and att.args[6].target == "stream"
    else:
        assert att.args[6] is None
    gm2 = check_programs_agree(model)
    assert len(attention_nodes(gm2)) == 1


@pytest.mark.parametrize("edge", ["after", "before", "used"])
@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_edge_term_is_absorbed(edge, dropout):
    """``leaky_relu(sddmm(add) + e)`` with a per-edge ``e`` computed from the inputs, in
    either order, becomes ``attention(..., a_edge=e)``; e may have other users (it is an
    input of the fused op, not one of its intermediates)."""
    model = RawAttention(edge=edge, dropout=dropout).double().train()
    gm = fused(copy.deepcopy(model))
    (att,) = attention_nodes(gm)
    a_edge = att.args[7]
    assert isinstance(a_edge, fx.Node) and a_edge.target is operator.mul  # sin(...) * w_edge
    assert len(info(att).fused) == (6 if dropout else 5)  # sddmm, add, leaky_relu, softmax, [dropout], spmm
    assert calls(gm).count(sc.ops.sddmm) == 1  # the edge term's own, op "mul"
    check_programs_agree(model)


@pytest.mark.parametrize(
    "kwargs, left",
    [
        ({"extra": "return_weight"}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.spmm}),
        ({"extra": "weight_loss"}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.spmm}),
        ({"extra": "weight_loss", "dropout": 0.3}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.edge_dropout}),
        ({"extra": "score_used"}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.spmm}),
        ({"extra": "raw_score_used"}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.spmm}),
        ({"extra": "raw_score_used", "act": None}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.spmm}),
        ({"sddmm_op": "mul"}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.spmm}),
        ({"reduce": "mean"}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.spmm}),
        ({"graphs": {"spmm": True}}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.spmm}),
        ({"graphs": {"softmax": True}}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.spmm}),
        ({"graphs": {"sddmm": True}}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.spmm}),
        ({"graphs": {"softmax": True, "spmm": True}}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.spmm}),
        ({"graphs": {"dropout": True}, "dropout": 0.3}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.edge_dropout}),
        # a term from parameters alone broadcasts over the edges: no edge tensor to fuse
        ({"edge": "param"}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.spmm}),
        # the sum with the edge term is used elsewhere
        ({"edge": "after", "extra": "raw_score_used"}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.spmm}),
        ({"edge": "after", "sddmm_op": "mul"}, {sc.ops.sddmm, sc.ops.edge_softmax, sc.ops.spmm}),
    ],
)
def test_not_fused_and_still_correct(kwargs, left):
    model = RawAttention(**kwargs).double().train()
    gm = fused(copy.deepcopy(model))
    assert not attention_nodes(gm), gm.code
    assert left <= set(calls(gm))
    # the pass left the program exactly as lowering made it
    assert calls(gm) == calls(lowered(copy.deepcopy(model)))
    check_programs_agree(model)


def test_non_constant_slope_is_not_fused():
    class Learned(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(F_IN, C)

        def forward(self, g, x):
            h = self.lin(x)
            a = h.sum(-1)
            score = F.leaky_relu(sddmm(g, a, a, "add"), a.mean())  # a tensor slope
            return spmm(g, h, "sum", edge_weight=edge_softmax(g, score))

    gm = fused(Learned().double())
    assert not attention_nodes(gm) and sc.ops.sddmm in calls(gm)


def test_fuse_only_touches_attention_chains():
    """Unweighted, max and mean aggregations and a plain weighted one stay as they are."""

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.sage = sc.nn.SAGEConv(F_IN, 3, "max")
            self.gcn = sc.nn.GCNConv(3, 3)

        def forward(self, g, x):
            h = self.gcn(g, self.sage(g, x))
            w = torch.sigmoid(sddmm(g, h, h, "dot"))
            return h + spmm(g, h, "sum", edge_weight=w)

    model = Mixed().double()
    before = calls(lowered(copy.deepcopy(model)))
    gm = check_programs_agree(model)
    assert calls(gm) == before and not attention_nodes(gm)
