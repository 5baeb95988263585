"""The linear_groups pass (trace -> lower -> linear_first -> inplace -> linear_groups):
which linears and activations it groups, what it leaves, that the grouped program
computes what the eager model computes (values and every gradient, float64), and that a
donated gradient buffer is the one the input's gradient is written into."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import Sage, check_same
from torch import fx, nn

import sarcompile as sc
from sarcompile.compile.passes import linear_groups as lg
from sarcompile.compile.passes.inplace import inplace
from sarcompile.compile.passes.linear_first import linear_first
from sarcompile.compile.passes.lower import lower
from sarcompile.compile.trace import trace

DT = torch.float64


def compiled(model: nn.Module) -> fx.GraphModule:
    return lg.linear_groups(inplace(linear_first(lower(trace(model)))))


def groups(gm: fx.GraphModule) -> list[tuple]:
    """(act, in place, donated) of every group."""
    return [(n.args[1], n.args[3], n.args[4]) for n in gm.graph.nodes
            if n.op == "call_function" and n.target is lg.linear_group]


def linears_left(gm: fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if (n.op == "call_function" and n.target is F.linear)
               or (n.op == "call_module" and isinstance(gm.get_submodule(n.target), nn.Linear)))


def graph(seed: int, n: int = 17, e: int = 60) -> sc.Graph:
    """Random edges among the first n - 3 nodes (the last three are isolated), self-loops
    and repeated edges."""
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n - 3, (e,), generator=gen), torch.randint(0, n - 3, (e,), generator=gen)
    src, dst = torch.cat([src, src[:5], torch.arange(4)]), torch.cat([dst, dst[:5], torch.arange(4)])
    return sc.Graph.from_edges(src, dst, n)


class Shared(nn.Module):
    """An activation read by a linear and by something else, and an input read by two
    linears: the first is left as it is, the second grouped without an activation."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(6, 4), nn.Linear(6, 4), nn.Linear(4, 4)

    def forward(self, g, x):
        y = self.a(x) + self.b(x)
        h = torch.relu(y)
        return self.c(h) + h


def test_sage_layers_group_their_linears_and_the_activation_before_them():
    torch.manual_seed(0)
    model = Sage([6, 8, 8, 3]).to(DT)  # widens (aggregates first), keeps, narrows
    gm = compiled(model)
    # Layers 2 and 3 read relu(previous layer): one group each, the relu in place, and
    # the linear before the aggregation donates its gradient; layer 1's two linears
    # read different values (the aggregate and x) and stay.
    assert groups(gm) == [("relu", True, (False, True))] * 2, gm.code
    assert linears_left(gm) == 2
    for seed in range(3):
        g = graph(seed)
        check_same(model, gm, g, torch.randn(g.num_nodes, 6, dtype=DT))


def test_what_else_reads_the_activation_keeps_it_out():
    torch.manual_seed(0)
    model = Shared().to(DT)
    gm = compiled(model)
    assert groups(gm) == [("none", False, (False, False))], gm.code
    assert linears_left(gm) == 1  # c: its input is also added to its output
    g = graph(0)
    check_same(model, gm, g, torch.randn(g.num_nodes, 6, dtype=DT))


class Heads(nn.Module):
    """GAT's second layer: an elu read by one linear and by a shape query."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 4)

    def forward(self, g, x):
        h = F.elu(self.a(sc.ops.spmm(g, x, "sum")))
        return self.b(h).view(h.size(0), 2, 2).sum(1)


def test_a_shape_query_does_not_keep_the_activation_out():
    torch.manual_seed(0)
    model = Heads().to(DT)
    gm = compiled(model)
    assert groups(gm) == [("elu", True, (False,))], gm.code
    g = graph(1)
    check_same(model, gm, g, torch.randn(g.num_nodes, 6, dtype=DT))


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_elu_and_every_donating_aggregation(reduce):
    torch.manual_seed(0)
    model = Sage([5, 7, 7], reduce, act=F.elu).to(DT)
    gm = compiled(model)
    # max: no linear_first; the elu's result is also aggregated, so it and the one
    # linear reading it stay
    assert groups(gm) == ([("elu", True, (False, True))] if reduce != "max" else []), gm.code
    for seed in range(2):
        g = graph(seed)
        check_same(model, gm, g, torch.randn(g.num_nodes, 5, dtype=DT))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 12), e=st.integers(0, 40), seed=st.integers(0, 10**6),
       reduce=st.sampled_from(["sum", "mean"]), act=st.sampled_from(["relu", "elu"]), stack=st.booleans())
def test_random_graphs_match_the_eager_model(n, e, seed, reduce, act, stack):
    # (a plain context, not pytest's monkeypatch: hypothesis runs many examples in one call)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(lg, "STACK_COLUMNS", 64 if stack else 0)  # the layers' linears stacked or each on its own
        _match_the_eager_model(n, e, seed, reduce, act)


def _match_the_eager_model(n, e, seed, reduce, act):
    gen = torch.Generator().manual_seed(seed)
    g = sc.Graph.from_edges(torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen), n)
    torch.manual_seed(seed)
    model = Sage([4, 6, 6, 2], reduce, act=torch.relu if act == "relu" else F.elu).to(DT)
    check_same(model, compiled(model), g, torch.randn(n, 4, dtype=DT, generator=gen))


def _reference(p, act, ws, bs, gys):
    """Autograd's gradients of p, each weight and each bias (None-free)."""
    p = p.detach().clone().requires_grad_()
    ws = [w.detach().clone().requires_grad_() for w in ws]
    bs = [None if b is None else b.detach().clone().requires_grad_() for b in bs]
    h = torch.relu(p) if act == "relu" else F.elu(p) if act == "elu" else p
    torch.autograd.backward([F.linear(h, w, b) for w, b in zip(ws, bs)], gys)
    return p.grad, [t.grad for t in (ws[0], bs[0], ws[1])]


def _spy_stacked(monkeypatch) -> list:
    """The calls of the stacked backward (its weights' gradients in one product)."""
    calls, real = [], lg._stacked_param_grads
    monkeypatch.setattr(lg, "_stacked_param_grads", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("stack", [True, False])
@pytest.mark.parametrize("act", ["none", "relu", "elu"])
def test_a_donated_gradient_receives_the_input_gradient_row_block_by_row_block(act, stack, monkeypatch):
    monkeypatch.setattr(lg, "ROW_BLOCK_BYTES", 3 * 5 * 8)  # three rows of width 5 per block: 4 blocks for 11 rows
    monkeypatch.setattr(lg, "STACK_COLUMNS", 64 if stack else 0)  # 5 + 2 output columns: stacked or not
    stacked = _spy_stacked(monkeypatch)
    torch.manual_seed(1)
    p = torch.randn(11, 5, dtype=DT)
    ws = [torch.randn(5, 5, dtype=DT), torch.randn(2, 5, dtype=DT)]
    bs = [torch.randn(5, dtype=DT), None]
    gys = [torch.randn(11, 5, dtype=DT), torch.randn(11, 2, dtype=DT)]
    want_p, want_params = _reference(p, act, ws, bs, gys)

    pp = p.clone().requires_grad_()
    params = [w.clone().requires_grad_() for w in ws]
    b0 = bs[0].clone().requires_grad_()
    out = lg.linear_group(pp * 1.0, act, 1.0, False, (True, False), params[0], b0, params[1], None)
    ys = out[1:] if act != "none" else out
    donated = gys[0].clone()
    torch.autograd.backward(ys, [donated, gys[1]])
    torch.testing.assert_close(pp.grad, want_p)
    for got, want in zip([params[0].grad, b0.grad, params[1].grad], want_params):
        torch.testing.assert_close(got, want)
    # pp * 1.0's backward passes the gradient on as it is: the donated buffer itself
    torch.testing.assert_close(donated, want_p)
    assert stacked == ([1] if stack else [])


@pytest.mark.parametrize("frozen", [False, True])
def test_a_stacked_group_with_an_output_unused_or_a_weight_frozen_runs_each_linear_on_its_own(frozen, monkeypatch):
    """Forward stacks the two narrow linears; backward stacks only where every output has a
    gradient and every weight wants one, and gives autograd's gradients either way."""
    torch.manual_seed(3)
    p = torch.randn(9, 5, dtype=DT)
    ws, bs = [torch.randn(3, 5, dtype=DT), torch.randn(2, 5, dtype=DT)], [torch.randn(3, dtype=DT), None]
    gy = torch.randn(9, 3, dtype=DT)
    stacked = _spy_stacked(monkeypatch)
    pp = p.clone().requires_grad_()
    w0, w1 = ws[0].clone().requires_grad_(), ws[1].clone().requires_grad_(not frozen)
    b0 = bs[0].clone().requires_grad_()
    _, y0, y1 = lg.linear_group(pp * 1.0, "relu", 1.0, False, (False, False), w0, b0, w1, None)
    torch.testing.assert_close(y1, F.linear(torch.relu(p), ws[1]))
    if frozen:  # both outputs used, the second weight frozen
        torch.autograd.backward([y0, y1], [gy, torch.ones_like(y1)])
        want_p, want = _reference(p, "relu", ws, bs, [gy, torch.ones_like(y1)])
    else:  # the second output unused
        y0.backward(gy)
        want_p, want = _reference(p, "relu", ws, bs, [gy, torch.zeros_like(y1)])
    assert w1.grad is None
    torch.testing.assert_close(pp.grad, want_p)
    torch.testing.assert_close(w0.grad, want[0])
    torch.testing.assert_close(b0.grad, want[1])
    assert stacked == []


def test_off_the_fused_path_the_plain_ops_run():
    p = torch.randn(4, 3, 2)  # not 2-D
    w = torch.randn(5, 2, requires_grad=True)
    (y,) = lg.linear_group(p, "none", 0.0, False, (False,), w, None)
    torch.testing.assert_close(y, F.linear(p, w))
    assert y.grad_fn is not None and "LinearGroup" not in type(y.grad_fn).__name__
    with torch.no_grad():
        h, y = lg.linear_group(torch.randn(4, 2), "relu", 0.0, False, (False,), w, None)
    assert y.grad_fn is None and (h >= 0).all()


@pytest.mark.parametrize("act", ["relu", "elu"])
def test_without_a_donated_buffer_the_input_gradient_is_written_over_the_activation(act, monkeypatch):
    """An activation in place (nothing else reads it) holds the input's gradient after
    backward, written a block of rows at a time; a second backward is refused clearly."""
    monkeypatch.setattr(lg, "ROW_BLOCK_BYTES", 3 * 5 * 8)  # 4 blocks for 11 rows
    torch.manual_seed(2)
    p = torch.randn(11, 5, dtype=DT)
    ws, bs = [torch.randn(2, 5, dtype=DT)], [torch.randn(2, dtype=DT)]
    gy = torch.randn(11, 2, dtype=DT)
    want_p, _ = _reference(p, act, ws * 2, bs + [None], [gy, torch.zeros_like(gy)])

    pp = p.clone().requires_grad_()
    w = ws[0].clone().requires_grad_()
    h, y = lg.linear_group(pp * 1.0, act, 1.0, True, (False,), w, bs[0])
    y.backward(gy, retain_graph=True)
    torch.testing.assert_close(pp.grad, want_p)
    assert torch.equal(h.detach(), pp.grad)  # (pp * 1.0 passes its gradient on as it is)
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.backward(gy)


@pytest.mark.parametrize("act", ["relu", "elu"])
def test_an_activation_not_in_place_keeps_its_input_not_its_result(act):
    """The input is what the layer before often keeps anyway; h goes once the linears read it."""
    p = torch.randn(6, 4, dtype=DT, requires_grad=True)
    before = p * 1.0
    h, y = lg.linear_group(before, act, 1.0, False, (False,), torch.randn(3, 4, dtype=DT, requires_grad=True), None)
    kept = y.grad_fn.saved_tensors[0]
    assert kept.data_ptr() == before.data_ptr() and kept.data_ptr() != h.data_ptr()
