"""PyG's heterogeneous models compiled: exact against PyG itself on 1-4 workers, on typed
graphs hypothesis draws (types with no rows on some workers, isolated nodes, relations
without edges, or without edges in a part); the homogeneous view's layers (RGCNConv,
HEATConv, HeteroLinear on ``data.to_homogeneous()``) too; what is refused, refused with
the fix."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torch_geometric")
import torch_geometric.nn as gnn  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pyg_hetero_models import (  # noqa: E402
    MODELS, TYPED_MODELS, SAGE, build, build_typed, edge_inputs, hetero_data, loss_weights, run_typed_worker,
    run_worker, step, typed_data, typed_step,
)

import sarcompile as sc  # noqa: E402

TOL = 1e-9
# Two graphs per model and run (compiling dominates): hypothesis's simplest draw first (no
# edges at all, 2 workers), then any; a failure is reported as drawn, not shrunk.
SETTINGS = settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck),
                    phases=[Phase.explicit, Phase.reuse, Phase.generate])


def _tol(t: torch.Tensor) -> float:
    return TOL * max([1.0, *t.abs().flatten().tolist()])


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(got, want, atol=_tol(want), rtol=0, msg=what)


# paper / author / field node counts (field: as few as two nodes, so that some of 3 or 4
# workers have none; not one: HGTConv's per-type skip weight, a Parameter of shape [1] named
# by the type, would then be taken for a node table of it) and edges per relation (0: a
# relation without edges)
NODES = st.fixed_dictionaries({"paper": st.integers(2, 10), "author": st.integers(2, 8), "field": st.integers(2, 4)})
CASE = dict(nodes=NODES, edges=st.integers(0, 24), seed=st.integers(0, 2**16), world=st.sampled_from([2, 1, 3, 4]),
            method=st.sampled_from(["random", "metis"]))


def _assert_workers_match(results: list[dict], want: dict, what: str) -> None:
    """The workers' rows of every output, input gradient and edge gradient, put back in
    place, and every rank's parameter gradients, against ``want`` (one machine)."""
    for key in ("out", "x_grad"):
        for t, full in want[key].items():
            got = torch.full_like(full, float("nan"))
            for r in results:
                got[r["ids"][t]] = r[key][t]
            _close(got, full, f"{what}: {key} of {t}")
    for (k, rel), full in want["edge_grad"].items():
        got = torch.full_like(full, float("nan"))
        for r in results:
            got[r["edge_ids"][rel]] = r["edge_grad"][(k, rel)]
        _close(got, full, f"{what}: gradient of {k}[{rel}]")
    for r in results:
        assert r["param_grads"].keys() == want["param_grads"].keys()
        for k, grad in want["param_grads"].items():
            _close(r["param_grads"][k], grad, f"{what}: gradient of {k}")


@pytest.mark.parametrize("name", MODELS)
@given(**CASE)
@SETTINGS
def test_pyg_hetero_model_equals_pyg_on_one_to_four_workers(pool, tmp_path_factory, name, nodes, edges, seed, world,
                                                             method):
    data = hetero_data(seed, nodes, edges)
    model = build(name, data)
    edge = edge_inputs(name, data, seed)
    weights = loss_weights(model(data.x_dict, data.edge_index_dict, **edge), seed)
    want = step(model, data.x_dict, data.edge_index_dict, weights, None, edge)  # PyG, eagerly
    g = sc.HeteroGraph.from_pyg(data)
    one = step(sc.distribute(model), data.x_dict, g, weights, None, edge)
    for key in ("out", "x_grad", "edge_grad", "param_grads"):
        assert one[key].keys() == want[key].keys(), key
        for k, full in want[key].items():
            _close(one[key][k], full, f"{name}, one machine: {key} of {k}")
    out_dir = tmp_path_factory.mktemp("pyg_hetero")
    sc.partition(g, world, out_dir, method=method, seed=seed)
    payload = {"dir": str(out_dir), "model": model, "x": data.x_dict, "weights": weights, "edge": edge}
    results = pool(world).run(run_worker, [payload] * world)
    _assert_workers_match(results, want, f"{name}, {world} workers")


@pytest.mark.parametrize("world", [1, 2, 3])
def test_typed_dropout_trains_on_workers_as_the_compiled_model_on_one_machine(pool, tmp_path_factory, world):
    """F.dropout on every type's input and nn.Dropout between the layers: masks keyed by each
    type's own ids, the same on any number of workers."""
    data = hetero_data(world, {"paper": 9, "author": 7, "field": 3}, 24)
    model = build("HeteroConv(dropout)", data).train()
    g = sc.HeteroGraph.from_pyg(data)
    weights = loss_weights(model(data.x_dict, data.edge_index_dict), world)
    want = step(sc.distribute(model, seed=5), data.x_dict, g, weights, None)
    model.eval()
    assert any(not torch.allclose(v, want["out"][t]) for t, v in step(sc.distribute(model, seed=5), data.x_dict, g,
                                                                        weights, None)["out"].items())
    model.train()
    out_dir = tmp_path_factory.mktemp("pyg_hetero_dropout")
    sc.partition(g, world, out_dir, method="random", seed=world)
    payload = {"dir": str(out_dir), "model": model, "x": data.x_dict, "weights": weights, "seed": 5}
    results = pool(world).run(run_worker, [payload] * world)
    _assert_workers_match(results, want, f"{world} workers")


@pytest.mark.parametrize("name", list(TYPED_MODELS))
@given(**CASE)
@SETTINGS
def test_typed_homogeneous_model_equals_pyg_on_one_to_four_workers(pool, tmp_path_factory, name, nodes, edges, seed,
                                                                   world, method):
    """RGCNConv / FastRGCNConv / HEATConv / HeteroLinear on ``data.to_homogeneous()``: one
    graph with a node type per node and an edge type per edge."""
    data = typed_data(seed, nodes, edges)
    model = build_typed(name)
    weights = torch.randn(data.num_nodes, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    weights = weights[:, : model(data.x, data.edge_index, data.node_type, data.edge_type, data.edge_attr).size(1)]
    args = (data.node_type, data.edge_type, data.edge_attr, weights)
    want = typed_step(model, data.x, data.edge_index, *args)
    g = sc.Graph.from_pyg(data)
    one = typed_step(sc.distribute(model), data.x, g, *args)
    for key in ("out", "x_grad", "edge_grad"):
        _close(one[key], want[key], f"{name}, one machine: {key}")
    for k, grad in want["param_grads"].items():
        _close(one["param_grads"][k], grad, f"{name}, one machine: gradient of {k}")
    out_dir = tmp_path_factory.mktemp("pyg_typed")
    sc.partition(g, world, out_dir, node_data={"x": data.x, "node_type": data.node_type, "w": weights},
                 method=method, seed=seed)
    payload = {"dir": str(out_dir), "model": model, "edge_type": data.edge_type, "edge_attr": data.edge_attr}
    results = pool(world).run(run_typed_worker, [payload] * world)
    for key, ids in (("out", "ids"), ("x_grad", "ids"), ("edge_grad", "edge_ids")):
        got = torch.full_like(want[key], float("nan"))
        for r in results:
            got[r[ids]] = r[key]
        _close(got, want[key], f"{name}, {world} workers: {key}")
    for r in results:
        for k, grad in want["param_grads"].items():
            _close(r["param_grads"][k], grad, f"{name}, {world} workers: gradient of {k}")


# -- refused, with the fix -----------------------------------------------------------------------------
def test_bipartite_gat_with_self_loops_is_refused_with_the_fix():
    """PyG joins source row i to destination row i: by position, across two types."""

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


def test_to_hetero_with_bases_is_refused_with_what_to_use():
    """Its code concatenates every type's rows and cuts them by offsets: refused, naming
    to_hetero and RGCNConv(num_bases) on the homogeneous view instead."""
    data = hetero_data(0)
    model = gnn.to_hetero_with_bases(SAGE(), data.metadata(), num_bases=2, in_channels={"x": 4}).double()
    with torch.no_grad():
        model(data.x_dict, data.edge_index_dict)
    with pytest.raises(sc.CompileError, match=r"to_hetero_with_bases.*row offsets.*to_hetero\(model, metadata\).*"
                                              r"num_bases"):
        sc.distribute(model)(data.x_dict, sc.HeteroGraph.from_pyg(data))


def test_lazy_parameters_are_refused_naming_the_layer_and_the_dry_run():
    data = hetero_data(0)
    model = gnn.HANConv(-1, 4, data.metadata())  # no dry run
    x = {t: v.float() for t, v in data.x_dict.items()}
    with pytest.raises(sc.CompileError, match=r"layer HANConv has lazily initialised parameters.*dry run"):
        sc.distribute(model)(x, sc.HeteroGraph.from_pyg(data))


# -- calls through *args / **kwargs / keyword-only arguments -------------------------------------------
class VarArgs(torch.nn.Module):
    """``forward(g, *x_dicts, scale, **edge_dicts)``: features as two dicts through ``*args``,
    a keyword-only dict of per-type scales, an edge weight per relation through ``**kwargs``."""

    def forward(self, g, *x_dicts, scale, **edge_dicts):
        out = {}
        for rel in g.edge_types:
            s, _, d = rel
            h = x_dicts[0][s] * x_dicts[1][s] * scale[s]
            agg = sc.spmm(g[rel], h, "sum", edge_weight=edge_dicts["weight_dict"][rel])
            out[d] = agg if d not in out else out[d] + agg
        return out


def test_a_forward_taking_varargs_keyword_only_and_kwargs_compiles_exactly():
    data = hetero_data(1)
    gen = torch.Generator().manual_seed(1)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    x1 = {t: v[:, :2] for t, v in data.x_dict.items()}  # one width: relations into a type add up
    x2 = {t: rand(*v.shape) for t, v in x1.items()}
    scale = {t: rand(2) for t in x1}
    weight = {rel: rand(ei.size(1)) for rel, ei in data.edge_index_dict.items()}
    got = sc.distribute(VarArgs())(sc.HeteroGraph.from_pyg(data), x1, x2, scale=scale, weight_dict=weight)
    want: dict = {}  # the oracle: each relation's weighted sum into its destinations, densely
    for (s, _, d), ei in data.edge_index_dict.items():
        h = x1[s] * x2[s] * scale[s]
        base = want.get(d, torch.zeros(data[d].num_nodes, 2, dtype=torch.float64))
        want[d] = base.index_add(0, ei[1], h[ei[0]] * weight[(s, _, d)][:, None])
    assert got.keys() == want.keys()
    for d in want:
        _close(got[d], want[d], f"output of {d}")
