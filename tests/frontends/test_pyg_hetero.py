"""PyG's heterogeneous models compiled: exact against PyG itself on 1-4 workers."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torch_geometric")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pyg_hetero_models import MODELS, build, hetero_data, loss_weights, run_worker, step  # noqa: E402

import sarcompile as sc  # noqa: E402

TOL = 1e-9


def _tol(t: torch.Tensor) -> float:
    return TOL * max([1.0, *t.abs().flatten().tolist()])


@given(name=st.sampled_from(MODELS), seed=st.integers(0, 2**16), world=st.integers(1, 4),
       method=st.sampled_from(["metis", "random"]))
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
def test_pyg_hetero_models_equal_pyg_on_one_to_four_workers(pool, tmp_path_factory, name, seed, world, method):
    data = hetero_data(seed)
    model = build(name, data)
    out = model(data.x_dict, data.edge_index_dict)
    weights = loss_weights(out, seed)
    want = step(model, data.x_dict, data.edge_index_dict, weights, None)  # PyG, eagerly
    g = sc.HeteroGraph.from_pyg(data)
    one = step(sc.distribute(model), data.x_dict, g, weights, None)
    for t in want["out"]:
        torch.testing.assert_close(one["out"][t], want["out"][t], atol=_tol(want["out"][t]), rtol=0)
    out_dir = tmp_path_factory.mktemp("pyg_hetero")
    sc.partition(g, world, out_dir, method=method, seed=seed)
    payload = {"dir": str(out_dir), "model": model, "x": data.x_dict, "weights": weights}
    results = pool(world).run(run_worker, [payload] * world)
    for key in ("out", "x_grad"):
        for t, full in want[key].items():
            got = torch.zeros_like(full)
            for r in results:
                got[r["ids"][t]] = r[key][t]
            torch.testing.assert_close(got, full, atol=_tol(full), rtol=0, msg=f"{name}: {key} of {t}")
    for r in results:
        for k, grad in want["param_grads"].items():
            torch.testing.assert_close(r["param_grads"][k], grad, atol=_tol(grad), rtol=0, msg=f"{name}: {k}")


def test_bipartite_gat_with_self_loops_is_refused_with_the_fix():
    """PyG joins source row i to destination row i: by position, across two types."""
    import torch_geometric.nn as gnn

    class Bipartite(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = gnn.GATConv((3, 4), 2)  # add_self_loops=True (HeteroConv itself refuses it)

        def forward(self, x_dict, edge_index_dict):
            rel = ("author", "writes", "paper")
            return self.conv((x_dict["author"], x_dict["paper"]), edge_index_dict[rel])

    data = hetero_data(0)
    model = Bipartite().double()
    with pytest.raises(sc.CompileError, match=r"add_self_loops=True\) got \(x_src, x_dst\).*add_self_loops=False"):
        sc.distribute(model)(data.x_dict, sc.HeteroGraph.from_pyg(data))
