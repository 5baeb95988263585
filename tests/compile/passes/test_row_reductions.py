"""The row_reductions pass: a mean over every node is a collective, exact on any N."""

import pytest
import torch
from torch import nn

import sarcompile as sc
from sarcompile.errors import CompileError
from sarcompile.ir import ops

from cases import assert_workers_match, case_on_edges, make_model, payloads, run_worker, single_machine

TOL = dict(rtol=1e-7, atol=1e-10)


def test_a_mean_over_the_nodes_becomes_node_mean_and_matches_eager():
    gen = torch.Generator().manual_seed(0)
    g = sc.Graph.from_edges(torch.randint(0, 20, (60,), generator=gen), torch.randint(0, 20, (60,), generator=gen), 20)
    model = make_model("nodemean", 0)
    x = torch.randn(20, 6, dtype=torch.float64, generator=gen)
    xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    compiled = sc.distribute(model)
    want, got = model(g, xe), compiled(g, xc)
    torch.testing.assert_close(got, want, **TOL)
    want.sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    got.sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad, **TOL)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[k], **TOL, msg=k)
    program = compiled.program(partitioned=False).module
    assert sum(n.target is ops.node_mean for n in program.graph.nodes) == 2


@pytest.mark.parametrize("body, words", [
    (lambda x: x + x.sum(0), "sum over dim 0 reduces over the node axis"),  # only a mean is a collective here
    (lambda x: x + x.mean(), "over all elements"),
    (lambda x: x + x.max(0).values, "max over dim 0"),
])
def test_other_reductions_over_the_nodes_are_still_refused(body, words):
    class M(nn.Module):
        def forward(self, g, x):
            return body(sc.spmm(g, x, "sum"))

    g = sc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    with pytest.raises(CompileError, match=words):
        sc.distribute(M())(g, torch.randn(3, 2))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_a_mean_over_the_nodes_is_exact_on_workers(pool, world_size):
    n = 19
    gen = torch.Generator().manual_seed(world_size)
    src, dst = torch.randint(0, n, (70,), generator=gen), torch.randint(0, n, (70,), generator=gen)
    case = case_on_edges(src, dst, n, "nodemean", 2, gen, assignment=torch.randint(0, world_size, (n,), generator=gen))
    want = single_machine(case)
    results = pool(world_size).run(run_worker, payloads(case, world_size))
    assert_workers_match(case, world_size, results, want, **TOL)


def test_pygs_readout_over_the_whole_graph_is_the_collective():
    """PyG's global_mean_pool(x, None) (one graph: x.mean(dim=-2, keepdim=True))."""
    pool = pytest.importorskip("torch_geometric.nn").global_mean_pool

    class Readout(nn.Module):
        def forward(self, g, x):
            h = sc.spmm(g, x, "sum")
            return h - pool(h, None)

    g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 4)
    x = torch.randn(4, 3, dtype=torch.float64)
    torch.testing.assert_close(sc.distribute(Readout())(g, x), Readout()(g, x), **TOL)
