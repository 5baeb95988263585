"""A model taking a PyG ``Data`` (``forward(self, data)``): its tensors and its graph are the
program's inputs, exact against eager PyG on one machine and on workers."""

from __future__ import annotations

import copy

import pytest
import torch
from torch_geometric.data import Data

import sarcompile as sc
from pyg_data_models import make_data_model, run_data_worker
from sarcompile.graph.shard import split_graph

DT = torch.float64
N = 15


def _data(seed: int = 0) -> Data:
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, N, (2, 50), generator=gen)
    return Data(x=torch.randn(N, 6, generator=gen, dtype=DT), edge_index=edge_index,
                edge_weight=torch.rand(50, generator=gen, dtype=DT), scale=torch.rand(N, 1, generator=gen, dtype=DT))


def _eager(model, data: Data, w: torch.Tensor):
    x = data.x.clone().requires_grad_(True)
    out = model(Data(**{**data.to_dict(), "x": x}))
    (out * w).sum().backward()
    return out.detach(), x.grad, {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("given", ["edge_index tensor", "sc.Graph"])
def test_a_data_argument_is_exact_against_eager_pyg_on_one_machine(given):
    data = _data()
    w = torch.randn(N, 1, dtype=DT)
    want = _eager(make_data_model(0), data, w)
    if given == "sc.Graph":  # the graph as a compiled model is given it on every worker
        data = Data(**{**data.to_dict(), "edge_index": sc.Graph.from_pyg(data)})
    got = _eager(sc.distribute(make_data_model(0)), data, w)
    for a, b in zip(got[:2], want[:2]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    for k in want[2]:
        torch.testing.assert_close(got[2][k], want[2][k], rtol=0, atol=1e-12, msg=k)


def test_a_data_argument_is_exact_on_two_workers(pool):
    data = _data(1)
    w = torch.randn(N, 1, dtype=DT)
    model = make_data_model(1)
    state = copy.deepcopy(model.state_dict())
    out, x_grad, grads = _eager(model, data, w)
    g = sc.Graph.from_pyg(data)
    parts = split_graph(g, torch.arange(N) * 2 // N, 2, {"x": data.x, "w": w, "scale": data.scale})
    payloads = [{"part": p, "seed": 1, "state": state, "num_nodes": N, "num_edges": g.num_edges,
                 "edge_weight": data.edge_weight} for p in parts]
    results = pool(2).run(run_data_worker, payloads)
    got_out, got_grad = torch.zeros_like(out), torch.zeros_like(x_grad)
    for p, r in zip(parts, results):
        got_out[p.global_ids], got_grad[p.global_ids] = r["out"], r["x_grad"]
    torch.testing.assert_close(got_out, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_grad, x_grad, rtol=0, atol=1e-12)
    for r in results:
        for k, want in grads.items():
            torch.testing.assert_close(r["grads"][k], want, rtol=0, atol=1e-12, msg=k)


def test_a_data_without_a_graph_says_where_to_give_it():
    data = _data()
    with pytest.raises(sc.CompileError, match="no graph"):
        sc.distribute(make_data_model(0))(Data(x=data.x, scale=data.scale))
