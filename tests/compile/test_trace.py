"""Tracing: shapes known when compiling are constants, row counts and values are not."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from cases import assert_workers_match, case_on_edges, make_model, payloads, run_worker, single_machine
from torch import nn

import sarcompile as sc
from sarcompile.compile.call_shape import CallShape
from sarcompile.compile.pipeline import compile_program
from sarcompile.errors import CompileError
from sarcompile.compile.passes.context import CompileOptions
from sarcompile.ir.probe import PROBES, Input
from sarcompile.compile.trace import ShapeTracer, trace
from sarcompile.ir.vocab import Residency

DT = torch.float64
TOL = 1e-9


def _graph(n=12, e=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return sc.Graph.from_edges(torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen), n)


G, X = _graph(), torch.randn(12, 6, dtype=DT)


def compiled(model: nn.Module, *args) -> fx.GraphModule:
    call = CallShape.of_call(model.forward, args, {}, 0)
    return compile_program(model, CompileOptions(), False, call).module


class Fn(nn.Module):
    """``forward(g, x) = body(g, x)``."""

    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, g, x):
        return self.body(g, x)


def _traced(model: nn.Module) -> fx.GraphModule:
    """``model`` traced as called with a graph and [rows, 6] features."""
    return trace(model, 0, inputs={"g": Input(Residency.GRAPH), "x": Input(Residency.NODE, (12, 6), DT)})


def _calls(gm: fx.GraphModule, name: str) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_method" and n.target == name]


# -- constants -------------------------------------------------------------------------------------
def test_dims_and_feature_sizes_are_constants_and_the_row_count_is_not():
    def body(g, x):
        assert x.dim() == 2 and x.ndim == 2 and len(x.size()) == 2 and x.dtype == DT
        rows, width = x.shape
        assert x.new_ones(3, 2).size(0) == 3 and torch.ones(4).to(x).shape[0] == 4  # x gives a dtype only
        if x.size(-1) == 6 and width == 6:
            x = x + x.new_zeros(rows, x.size(1))
        return x

    gm = _traced(Fn(body))
    assert not _calls(gm, "dim")
    sizes = _calls(gm, "size")
    assert sizes and all(n.args[1:] == (0,) for n in sizes)  # the row count alone is asked when the program runs
    (zeros,) = _calls(gm, "new_zeros")
    assert zeros.args[2] == 6
    torch.testing.assert_close(gm(G, X), X)


@pytest.mark.parametrize("body", [
    lambda g, x: x if x.size(0) > 3 else -x,  # the rows
    lambda g, x: x if x.t().size(1) > 3 else -x,  # the rows, on another axis: it differs between the probes
    lambda g, x: x if x.reshape(1, -1).size(1) > 3 else -x,  # rows x features
    lambda g, x: x if x.numel() > 3 else -x,
    lambda g, x: x if x.sum() > 0 else -x,  # a value
])
def test_a_branch_on_the_row_count_or_a_value_is_refused(body):
    with pytest.raises(CompileError, match="cannot trace Fn, at test_trace.py:.*control flow.*row counts"):
        compiled(Fn(body), G, X)


def _zero_first_column(g, x):
    h = x * 2
    h[:, 0] = 0
    return h


def test_an_assignment_into_a_feature_column_is_traced_as_eager_computes_it():
    torch.testing.assert_close(sc.distribute(Fn(_zero_first_column))(G, X), _zero_first_column(G, X), rtol=0, atol=0)


def test_without_examples_shapes_stay_symbolic():
    with pytest.raises(CompileError, match="control flow"):
        trace(Fn(lambda g, x: x if x.size(-1) > 3 else -x))


def test_a_failed_example_keeps_what_depends_on_it_symbolic():
    def body(x):
        h = x.view(-1, 2, 3)  # the examples have 5 features: this fails on them
        return h if h.size(-1) == 3 else -h

    model = Fn(lambda g, x: body(x))
    with pytest.raises(fx.proxy.TraceError):
        ShapeTracer([[None, torch.randn(p.nodes, 5)] for p in PROBES]).trace(model)
    assert ShapeTracer([[None, torch.randn(p.nodes, 6)] for p in PROBES]).trace(model)


_RUNS: list[int] = []


@torch.fx.wrap
def _counted(x):
    """A function traced as one node; each run on real values is counted."""
    _RUNS.append(1)
    return x * 2


def test_a_value_is_computed_only_when_asked_for():
    examples = [[None, torch.randn(p.nodes, 6)] for p in PROBES]
    _RUNS.clear()
    ShapeTracer(examples).trace(Fn(lambda g, x: _counted(x) + 1))
    assert _RUNS == []  # nothing asked for its value
    gm = fx.GraphModule(nn.Module(), ShapeTracer(examples).trace(Fn(lambda g, x: _counted(x).view(-1, 2, 3))))
    assert len(_RUNS) == len(PROBES)  # the -1 needed it, once per probe
    assert [n.args[1:] for n in _calls(gm, "view")][0][1:] == (2, 3)
    _RUNS.clear()
    ShapeTracer(examples, every_value=True).trace(Fn(lambda g, x: _counted(x) + 1))
    assert len(_RUNS) == len(PROBES)


def test_tracing_leaves_buffers_and_the_rng_alone():
    norm = nn.BatchNorm1d(6).double().train()  # traced through: its statistics would move
    before = norm.running_mean.clone(), norm.num_batches_tracked.clone(), torch.get_rng_state()
    model = Fn(lambda g, x: norm(torch.rand_like(x) + x) if x.size(-1) == 6 else x)
    model.norm = norm
    gm = _traced(model)
    assert any(n.op == "call_function" for n in gm.graph.nodes)
    torch.testing.assert_close(norm.running_mean, before[0], rtol=0, atol=0)
    assert norm.num_batches_tracked == before[1] and torch.equal(torch.get_rng_state(), before[2])


# -- exact on workers --------------------------------------------------------------------------------
def test_a_branch_on_the_feature_width_matches_eager():
    torch.manual_seed(0)
    model = make_model("width", 0)
    x = X.clone().requires_grad_(True)
    want = model(G, x)
    got = sc.distribute(model)(G, x)
    torch.testing.assert_close(got, want, rtol=0, atol=TOL)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_a_branch_on_the_feature_width_is_exact_on_workers_with_different_row_counts(pool, world_size):
    # split unevenly: a row count baked as a constant would be wrong on some worker
    results = _exact_as_eager("width", world_size, pool)
    assert len({r.out.shape[0] for r in results}) == min(world_size, 2)  # the workers' row counts differ


class FromZeros(nn.Module):
    """Node-row tensors from factories given the row count (PyG's RGCNConv starts so)."""

    def forward(self, g, x):
        out = torch.zeros(x.size(0), 3, dtype=x.dtype) + torch.ones((x.size(0), 1), dtype=x.dtype)
        return out + sc.ops.spmm(g, x, "sum")


def test_a_factory_given_a_traced_row_count_is_one_node_of_node_rows():
    g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 1]), 5)
    x = torch.randn(5, 3, dtype=DT)
    model = sc.distribute(FromZeros())
    torch.testing.assert_close(model(g, x), FromZeros()(g, x))
    listing = dict(model.program(partitioned=False).stages)["residency"]
    line = listing.split("torch.zeros(")[1].splitlines()[0]
    assert line.startswith("size") and "# node" in line, line
    assert torch.zeros is torch._C._VariableFunctions.zeros  # torch's own again after the trace


def _exact_as_eager(model_name: str, world_size: int, pool) -> list:
    """``model_name`` (tests/cases.py) compiled, on one machine and on ``world_size`` workers
    with different row counts, against eager: outputs, input and parameter gradients; the
    workers' results."""
    n = 17
    gen = torch.Generator().manual_seed(world_size)
    src, dst = torch.randint(0, n, (60,), generator=gen), torch.randint(0, n, (60,), generator=gen)
    case = case_on_edges(src, dst, n, model_name, 3, gen, assignment=torch.arange(n) * world_size // n)
    model = make_model(model_name, 3)
    x = case.x.clone().requires_grad_(True)
    eager = model(case.graph, x)
    (eager * case.loss_weight).sum().backward()
    want = single_machine(case)
    torch.testing.assert_close(want.out, eager.detach(), rtol=0, atol=TOL)
    torch.testing.assert_close(want.x_grad, x.grad, rtol=0, atol=TOL)
    for k, p in model.named_parameters():
        torch.testing.assert_close(want.param_grads[k], p.grad, rtol=0, atol=TOL, msg=k)
    results = pool(world_size).run(run_worker, payloads(case, world_size))
    assert_workers_match(case, world_size, results, want, rtol=0, atol=TOL)
    return results


def test_a_loop_over_a_parameters_rows_or_a_feature_dim_is_exact_on_workers(pool):
    _exact_as_eager("paramloop", 2, pool)


class _RowLoop(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, g, x):
        rows = {"iter": lambda: x, "split": lambda: torch.split(x, 1), "unbind": lambda: x.unbind(0),
                "len": lambda: [x] * len(x)}[self.how]()
        return torch.stack([r * 2 for r in rows])


@pytest.mark.parametrize("how", ["iter", "split", "unbind"])
def test_a_loop_over_a_per_node_values_rows_is_refused_saying_how_to_write_it(how):
    g = _graph()
    with pytest.raises(CompileError, match=r"per-node tensor was iterated along its rows .*for all rows at once"):
        sc.distribute(_RowLoop(how))(g, torch.randn(12, 3, dtype=DT))


def test_len_of_a_per_node_value_is_refused():
    g = _graph()
    with pytest.raises(CompileError, match=r"len\(\) of a traced tensor, whose first axis is its row count"):
        sc.distribute(_RowLoop("len"))(g, torch.randn(12, 3, dtype=DT))


def test_an_assignment_into_part_of_a_per_node_tensor_is_exact_on_workers(pool):
    _exact_as_eager("maskset", 2, pool)


def _into_input(g, x):
    x[x < 0] = 0
    return x


def _into_a_view_of_an_input(g, x):
    v = x[:, :2]
    v[v < 0] = 0
    return v


def _view_read_after(g, x):
    h = x * 2
    v = h[:, :2]
    h[h < 0] = 0
    return h + v


def _into_rows_by_position(g, x):
    h = x * 2
    h[:3] = 1
    return h


def _selected_rows(g, x):
    h = x * 2
    m = h[:, 0] > 0
    h[m] = h[m] * 2
    return h


def _by_index(g, x):
    h = x * 2
    h[torch.arange(2)] = 1
    return h


@pytest.mark.parametrize("body, words", [
    (_into_input, r"part of a forward argument .*`x = x.clone\(\)`"),
    (_into_a_view_of_an_input, r"part of a view of a forward argument"),
    (_view_read_after, r"shares its storage with another read after it"),
    (_into_rows_by_position, r"rows picked by position"),
    (_by_index, r"rows picked by position"),
    (_selected_rows, r"one row per row selected .*torch.where\(mask.unsqueeze\(-1\), f\(h\), h\)"),
])
def test_an_assignment_that_is_not_row_local_is_refused_naming_its_line_and_the_fix(body, words):
    with pytest.raises(CompileError, match=words) as e:
        sc.distribute(Fn(body))(G, X.clone())
    assert "test_trace.py" in str(e.value) and "] = " in str(e.value), str(e.value)
