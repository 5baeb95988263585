"""PyG layers inside a user's module: RevGNN's GroupAddRev (exact against PyG on one
machine and on 2 and 3 workers) and HAN's HANConv with attention dropout (exact against
PyG in eval; in training the workers draw the compiled one-machine run's masks)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torch_geometric")
from cases import case_on_edges, gather_rows, make_model, payloads, single_machine  # noqa: E402
from pyg_hetero_models import loss_weights, step  # noqa: E402
from pyg_wrapped_models import HAN, RevBlock, metapath_data, run_hetero_worker, run_worker  # noqa: E402
from torch import nn  # noqa: E402
from torch_geometric.nn import GroupAddRev  # noqa: E402

import sarcompile as sc  # noqa: E402

TOL = 1e-9


def _close(got, want, what):
    torch.testing.assert_close(got, want, rtol=0, atol=TOL * max(1.0, float(want.abs().max())), msg=what)


@pytest.mark.parametrize("world_size", [2, 3])
def test_group_add_rev_matches_pyg_on_workers(pool, world_size):
    n = 17
    gen = torch.Generator().manual_seed(world_size)
    src, dst = torch.randint(0, n, (60,), generator=gen), torch.randint(0, n, (60,), generator=gen)
    case = case_on_edges(src, dst, n, "rev_gnn", 2, gen, assignment=torch.randint(0, world_size, (n,), generator=gen))
    model = make_model("rev_gnn", 2)
    x = case.x.clone().requires_grad_(True)
    eager = model(torch.stack([src, dst]), x)  # PyG eagerly: its layers take edge_index where we pass the graph
    (eager * case.loss_weight).sum().backward()
    want = single_machine(case)
    _close(want.out, eager.detach(), "one machine: output")
    _close(want.x_grad, x.grad, "one machine: x grad")
    results = pool(world_size).run(run_worker, payloads(case, world_size))
    _close(gather_rows(case, world_size, results, "out"), want.out, "output")
    _close(gather_rows(case, world_size, results, "x_grad"), want.x_grad, "x grad")
    for r in results:
        for k, grad in want.param_grads.items():
            _close(r.param_grads[k], grad, k)


def test_a_group_add_rev_subclass_changing_the_computation_is_refused_saying_what_to_use():
    class Mine(GroupAddRev):
        def _forward(self, x, edge_index, *args):
            return super()._forward(x, edge_index, *args)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.rev = Mine(RevBlock(3), num_groups=2)

        def forward(self, x, edge_index):
            return self.rev(x, edge_index)

    g = sc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    with pytest.raises(sc.CompileError, match="overrides _forward.*torch.chunk and torch.cat"):
        sc.distribute(Model().double())(torch.randn(2, 6, dtype=torch.float64), g)


def _han(seed: int):
    data = metapath_data(seed)
    torch.manual_seed(seed)
    model = HAN(data.metadata()).double()
    with torch.no_grad():  # PyG's dry run: HANConv(-1, ...) sizes its parameters
        model(data.x_dict, data.edge_index_dict)
    return data, model


@pytest.mark.parametrize("world", [1, 3])
def test_han_wrapped_in_a_module_trains_on_workers_and_matches_pyg_in_eval(pool, tmp_path_factory, world):
    data, model = _han(world)
    g = sc.HeteroGraph.from_pyg(data)
    weights = loss_weights(model(data.x_dict, data.edge_index_dict), world)
    # HANConv's attention dropout stream is seeded from torch when the layer is first compiled:
    # here and on every worker, right after this seed
    torch.manual_seed(7)
    trained = step(sc.distribute(model.train()), data.x_dict, g, weights, None)
    out_dir = tmp_path_factory.mktemp("han")
    sc.partition(g, world, out_dir, method="random", seed=world)
    payload = {"dir": str(out_dir), "model": model, "x": data.x_dict, "weights": weights, "torch_seed": 7}
    results = pool(world).run(run_hetero_worker, [payload] * world)
    for key in ("out", "x_grad"):
        full = trained[key]["movie"]
        got = torch.full_like(full, float("nan"))
        for r in results:
            got[r["ids"]["movie"]] = r[key]["movie"]
        _close(got, full, f"train, {world} workers: {key}")
    for r in results:
        for k, grad in trained["param_grads"].items():
            _close(r["param_grads"][k], grad, f"train, {world} workers: gradient of {k}")
    model.eval()
    want = step(model, data.x_dict, data.edge_index_dict, weights, None)  # PyG, eagerly
    got = step(sc.distribute(model), data.x_dict, g, weights, None)
    assert not torch.allclose(trained["out"]["movie"], got["out"]["movie"])  # dropout was on
    for key in ("out", "x_grad", "param_grads"):
        for k, v in want[key].items():
            _close(got[key][k], v, f"eval, one machine: {key} of {k}")
