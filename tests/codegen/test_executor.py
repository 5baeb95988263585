"""Whole models through the generated kernels (``executor="triton"``, in Triton's
interpreter on CPU tensors) equal the torch kernels, on one machine and on workers."""

from __future__ import annotations

import pytest
import torch
from cases import Case, case_on_edges, gather_rows, payloads, run_worker, single_machine

from devices import DEVICE

from sarcompile.codegen import kernels_for, torch_kernels
from sarcompile.codegen.kernel_cache import current_target
from sarcompile.errors import KernelError

pytest.importorskip("triton")
pytestmark = pytest.mark.interpreter
# Most cases hold CPU tensors: the generated kernels run on them in the interpreter only.
on_cpu = pytest.mark.skipif(current_target() != "interpreter", reason="CPU tensors need TRITON_INTERPRET=1")

TOL = 1e-9  # float64: the kernels differ from torch's in summation order only


def _case(model: str, executor: str, seed: int = 3) -> Case:
    """A graph with an isolated node, a self-loop, a multi-edge and a high in-degree node."""
    gen = torch.Generator().manual_seed(seed)
    n = 30
    src = torch.randint(0, n - 1, (120,), generator=gen)
    dst = torch.randint(0, n - 1, (120,), generator=gen)
    src = torch.cat([src, torch.tensor([4, 7, 7]), torch.arange(0, 25)])
    dst = torch.cat([dst, torch.tensor([4, 9, 9]), torch.full((25,), 2)])
    return case_on_edges(src, dst, n, model, seed, gen, executor=executor)


def _assert_same(got, want) -> None:
    torch.testing.assert_close(got.out, want.out, atol=TOL, rtol=TOL)
    torch.testing.assert_close(got.x_grad, want.x_grad, atol=TOL, rtol=TOL)
    assert got.param_grads.keys() == want.param_grads.keys()
    for k, g in want.param_grads.items():
        torch.testing.assert_close(got.param_grads[k], g, atol=TOL, rtol=TOL, msg=k)


# gat3: GAT (3 heads, residual) + SAGE(mean) + GAT with attention dropout + GAT;
# mix: SAGE mean/sum/max, GCN (weighted), GIN; edge: learned edge weights (edge_dot)
MODELS = ["gat3", "mix", "edge"]


@on_cpu
@pytest.mark.parametrize("model", MODELS)
def test_triton_executor_equals_torch_on_one_machine(model):
    want = single_machine(_case(model, "torch"))
    got = single_machine(_case(model, "triton"))
    _assert_same(got, want)


@on_cpu
@pytest.mark.parametrize("model", MODELS)
def test_triton_executor_on_two_workers_equals_torch_on_one_machine(pool, model):
    want = single_machine(_case(model, "torch"))
    case = _case(model, "triton")
    results = pool(2).run(run_worker, payloads(case, 2))
    got_out = gather_rows(case, 2, results, "out")
    got_grad = gather_rows(case, 2, results, "x_grad")
    torch.testing.assert_close(got_out, want.out, atol=TOL, rtol=TOL)
    torch.testing.assert_close(got_grad, want.x_grad, atol=TOL, rtol=TOL)
    for r in results:
        for k, g in want.param_grads.items():
            torch.testing.assert_close(r.param_grads[k], g, atol=TOL, rtol=TOL, msg=k)


@on_cpu
def test_the_triton_executor_really_runs_generated_kernels(monkeypatch):
    """Guard against a silent fallback: with the generated SpMM broken, the triton
    executor's result changes and the torch executor's does not."""
    from sarcompile.codegen import triton_kernels

    want = single_machine(_case("mix", "torch"))
    def broken(block, x, w, into=None, ordered=False):  # (ordered for triton: in CSR order, as torch's takes them)
        out = torch_kernels.spmm(block, x, w) * 2
        return out if into is None else into.add_(out)

    monkeypatch.setattr(triton_kernels, "spmm", broken)
    with pytest.raises(AssertionError):
        _assert_same(single_machine(_case("mix", "triton")), want)
    _assert_same(single_machine(_case("mix", "torch")), want)


@on_cpu
def test_auto_picks_torch_on_cpu_and_triton_refuses_cpu_without_the_interpreter(monkeypatch):
    from sarcompile.codegen import triton_kernels

    assert kernels_for("auto", torch.device("cpu")) is torch_kernels
    assert kernels_for("torch", torch.device("cpu")) is torch_kernels
    assert kernels_for("triton", torch.device("cpu")) is triton_kernels  # TRITON_INTERPRET=1 here
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelError, match="TRITON_INTERPRET=1"):
        kernels_for("triton", torch.device("cpu"))


@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs a GPU (the Triton kernels compiled for CUDA)")
@pytest.mark.parametrize("executor", ["triton", "torch"])
@pytest.mark.parametrize("model", MODELS)
def test_features_on_the_gpu_graph_on_the_cpu(model, executor):
    """As users run it: the graph built on the CPU, model and features moved to the GPU.
    Every index the kernels get must follow the features there (the graph's blocks, the
    mean's 1/deg edge weights), and the result equal the CPU's."""
    want = single_machine(_case(model, "torch"))
    got = single_machine(_case(model, executor), device=DEVICE)
    tol = dict(atol=1e-6, rtol=1e-6)  # float64 on both; the GPU sums in another order
    torch.testing.assert_close(got.out, want.out, **tol)
    torch.testing.assert_close(got.x_grad, want.x_grad, **tol)
    for k, g in want.param_grads.items():
        torch.testing.assert_close(got.param_grads[k], g, **tol, msg=k)
