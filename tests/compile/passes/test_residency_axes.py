"""The residency pass follows the rows wherever they move: stack, unsqueeze, permute,
transpose, einsum, factories sized by the row count in any place, and reductions over the
other dims bring them back. Row-local models are exact against eager on one machine and
on 2 and 3 workers; what truly mixes rows stays refused, saying where the rows are."""

from __future__ import annotations

import pytest
import torch
from axis_models import MODELS, run_worker
from cases import case_on_edges, gather_rows, make_model, payloads, single_machine
from torch import nn

import sarcompile as sc
from sarcompile.compile.call_shape import CallShape
from sarcompile.compile.pipeline import compile_program
from sarcompile.errors import CompileError
from sarcompile.compile.passes.context import CompileOptions
from sarcompile.ir.node_info import info

DT = torch.float64
TOL = 1e-9


def _graph(n=12, e=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return sc.Graph.from_edges(torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen), n)


G, X = _graph(), torch.randn(12, 4, dtype=DT)


class Fn(nn.Module):
    """``forward(g, x) = body(self, g, x)``."""

    def __init__(self, body, *modules: nn.Module):
        super().__init__()
        self.body = body
        self.mods = nn.ModuleList(modules)

    def forward(self, g, x):
        return self.body(self, g, x)


def compiled(model: nn.Module, *args, partitioned: bool = False):
    return compile_program(model, CompileOptions(), partitioned, CallShape.of_call(model.forward, args, {}, 0))


def refused(model: nn.Module, match: str) -> str:
    with pytest.raises(CompileError, match=match) as e:
        compiled(model, G, X)
    return str(e.value)


# -- accepted, and exact ---------------------------------------------------------------------------
@pytest.mark.parametrize("body", [
    lambda m, g, x: torch.stack([x, 2 * x]).mean(0),
    lambda m, g, x: torch.stack([x, x.sin()], 0).mean(0) + torch.stack([x, x], 1).sum(1),
    lambda m, g, x: torch.cat([x.unsqueeze(0), x.unsqueeze(0) * 3]).amax(0),
    lambda m, g, x: x.view(-1, 2, 2).permute(1, 0, 2).permute(1, 0, 2).reshape(x.size(0), 4),
    lambda m, g, x: x.view(-1, 2, 2).transpose(0, 1).transpose(0, 1).flatten(1),
    lambda m, g, x: x.unsqueeze(0).movedim(1, 0).squeeze(1),
    lambda m, g, x: torch.einsum("bij,ijk->bik", x.view(-1, 2, 2), torch.ones(2, 2, 3, dtype=DT)).flatten(1),
    lambda m, g, x: torch.einsum("bi,bj->bij", x, x).sum(-1),
    lambda m, g, x: (torch.zeros(1, x.size(0), 4, dtype=DT) + x)[0],
    lambda m, g, x: torch.full((2, x.size(0)), 0.5, dtype=DT).T * x[:, :2],
    lambda m, g, x: torch.softmax(torch.stack([x, -x]), dim=0)[1] * torch.stack([x, x])[:, :, :1].sum(0),
    lambda m, g, x: (torch.ones(3, 4, dtype=DT) @ x.T).T,  # [3, 4] @ [4, n]: the rows stay the columns
    lambda m, g, x: x.view(-1, 2, 2)[:, torch.tensor([1, 0])].flatten(1) + torch.stack([x, x])[:, :, [3, 2, 1, 0]][1],
    lambda m, g, x: x.view(-1, 2, 2).unsqueeze(0)[[0], :, [1]].sum(0).repeat(1, 2),  # indices apart: theirs go first
    lambda m, g, x: (torch.ones(4, 1, dtype=DT) * x[:, 0] + x.T).T,  # [4, 1] * [n] broadcasts to [4, n]
])
def test_rows_that_move_and_come_back_are_row_local(body):
    model = Fn(lambda m, g, x: sc.spmm(g, body(m, g, x), "sum"))
    torch.testing.assert_close(compiled(model, G, X).module(G, X), model(G, X), rtol=0, atol=TOL)


def test_the_listing_records_where_the_rows_are():
    program = compiled(Fn(lambda m, g, x: sc.spmm(g, torch.stack([x, x]).mean(0), "sum")), G, X)
    axes = {n.name: info(n).row_axis for n in program.module.graph.nodes}
    assert axes["stack"] == 1 and axes["mean"] == 0


@pytest.mark.parametrize("name", list(MODELS))
def test_models_moving_rows_match_eager_on_one_machine(name):
    model = make_model(name, 0)
    x = torch.randn(17, 6, dtype=DT)
    g = _graph(17, 60, 1)
    torch.testing.assert_close(sc.distribute(model)(g, x), model(g, x), rtol=0, atol=TOL)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("name", list(MODELS))
def test_models_moving_rows_are_exact_on_workers(pool, name, world_size):
    n = 17
    gen = torch.Generator().manual_seed(world_size)
    src, dst = torch.randint(0, n, (60,), generator=gen), torch.randint(0, n, (60,), generator=gen)
    case = case_on_edges(src, dst, n, name, 3, gen, assignment=torch.randint(0, world_size, (n,), generator=gen))
    model = make_model(name, 3)
    x = case.x.clone().requires_grad_(True)
    eager = model(case.graph, x)
    (eager * case.loss_weight).sum().backward()
    want = single_machine(case)
    torch.testing.assert_close(want.out, eager.detach(), rtol=0, atol=TOL)
    torch.testing.assert_close(want.x_grad, x.grad, rtol=0, atol=TOL)
    results = pool(world_size).run(run_worker, payloads(case, world_size))
    torch.testing.assert_close(gather_rows(case, world_size, results, "out"), want.out, rtol=0, atol=TOL)
    torch.testing.assert_close(gather_rows(case, world_size, results, "x_grad"), want.x_grad, rtol=0, atol=TOL)
    for r in results:
        for k, grad in want.param_grads.items():
            torch.testing.assert_close(r.param_grads[k], grad, rtol=0, atol=TOL, msg=k)


# -- refused -------------------------------------------------------------------------------------
@pytest.mark.parametrize("body, match", [
    (lambda m, g, x: sc.spmm(g, torch.stack([x, x]).mean(1), "sum"), "mean over dim 1 reduces over the node axis"),
    (lambda m, g, x: sc.spmm(g, torch.softmax(torch.stack([x, x]), 1)[0], "sum"), "softmax over dim 1"),
    (lambda m, g, x: torch.einsum("bi,bj->ij", x, x).sum() + x, "einsum contracts or mixes the node axis"),
    (lambda m, g, x: torch.einsum("bi,cj->bc", x, x), "pairs rows of per-node values"),
    (lambda m, g, x: x.T @ x, "contracts or mixes the node axis"),
    (lambda m, g, x: torch.cat([torch.stack([x, x])] * 2, 1)[0], "cat along dim 1 concatenates the rows"),
    (lambda m, g, x: torch.stack([x, x]).reshape(-1, 4), "rows do not stay rows"),
    (lambda m, g, x: torch.stack([x, x]).flatten(0, 1), "merges the row axis"),
    (lambda m, g, x: torch.stack([x, x])[:, 1:].sum(0), "picks rows of a per-node value by position"),
    (lambda m, g, x: torch.zeros(x.size(0), x.size(0)), "more than one row count"),
    (lambda m, g, x: torch.stack([x, x]) + x.unsqueeze(-1), "lines its rows up with another axis"),
    (lambda m, g, x: torch.stack([x, x]).transpose(1, 2) + torch.ones(4, 1, dtype=DT), "axis 0 lines up with the rows"),
])
def test_what_mixes_rows_after_they_moved_is_refused(body, match):
    refused(Fn(body), match)


@pytest.mark.parametrize("body, what", [
    (lambda m, g, x: torch.stack([x, x]), "the output"),
    (lambda m, g, x: sc.spmm(g, torch.stack([x, x]), "sum"), "spmm's argument x"),
    (lambda m, g, x: torch.zeros(1, x.size(0), 4, dtype=DT) + x, "the output"),
])
def test_rows_off_dim_0_where_rows_first_are_needed_are_refused_saying_where_they_are(body, what):
    msg = refused(Fn(body), f"{what} needs the node axis of a per-node value at dim 0, but here it is at dim 1")
    assert "moved there at test_residency_axes.py" in msg and ".movedim(1, 0)" in msg and ".mean(0)" in msg, msg


def test_a_linear_layer_over_the_rows_is_refused():
    refused(Fn(lambda m, g, x: m.mods[0](x.T).T, nn.Linear(12, 4).double()), "Linear contracts the last dim")


def test_an_lstm_state_not_made_per_row_is_refused():
    class Fixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(4, 3, batch_first=True).double()
            self.h0 = nn.Parameter(torch.zeros(1, 12, 3, dtype=DT))

        def forward(self, g, x):
            return self.lstm(x.unsqueeze(1), (self.h0, self.h0))[1][0][0]

    with pytest.raises(CompileError, match="hidden state is not \\[layers, rows, hidden\\]"):
        compiled(Fixed(), G, X)


# -- messages --------------------------------------------------------------------------------------
@pytest.mark.parametrize("body, words", [
    (lambda m, g, x: torch.rand_like(x) * x, ["`rand_like` draws random numbers", "F.dropout or nn.Dropout",
                                              "pass them in as an input"]),
    (lambda m, g, x: torch.arange(x.size(0)).unsqueeze(-1) * x, ["`arange` numbers the rows", "g.global_ids"]),
])
def test_random_and_positional_ops_are_refused_naming_public_fixes(body, words):
    msg = refused(Fn(body), words[0])
    assert all(w in msg for w in words), msg
    assert not any(internal in msg for internal in ("RandomStream", "_Val", "Residency.")), msg


def opaque(x):
    return x


torch.fx.wrap("opaque")


def test_a_function_the_program_calls_unseen_is_refused_with_a_fix_the_user_can_apply():
    msg = refused(Fn(lambda m, g, x: opaque(x)), "cannot prove that opaque is row-local")
    assert "do not wrap it (torch.fx.wrap)" in msg and "sarcompile.ir" not in msg, msg
