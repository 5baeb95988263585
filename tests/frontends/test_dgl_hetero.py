"""DGL heterogeneous models compiled: exact against DGL itself on one machine and 1-4 workers.

Runs only where DGL is installed (``scripts/test.sh`` runs it in the DGL environment). The
models (``dgl_hetero_models``): HeteroGraphConv over GraphConv and over SAGEConv + GATConv,
RelGraphConv and HGTConv on the graph's homogeneous form, DGL's ogbn-mag RGCN (with a
HeteroEmbedding for the featureless types) and hand-written heterograph code
(``multi_update_all``, ``edge_softmax`` over the relations, per-type frames).
"""

from __future__ import annotations

import pytest

dgl = pytest.importorskip("dgl")

import dgl.function as fn  # noqa: E402
import dgl.nn as dglnn  # noqa: E402
import torch  # noqa: E402
from dgl_hetero_models import (HOMOGENEOUS, MODELS, as_oracle, build, features, homogeneous,  # noqa: E402
                               loss_weights, run_worker, step, table_type)
from hetero_cases import relation_edges  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402

import sarcompile as sc  # noqa: E402

TOL = 1e-9  # float64: only the order of summation differs
TYPES = ("paper", "author", "field")


@st.composite
def heterographs(draw, max_nodes: int = 10, max_edges: int = 24):
    """(dgl.heterograph, seed): 1-3 node types, each in some relation; ``paper`` always, the
    others may have no nodes; 1-4 relations named r0..r3 (within a type or across two, some
    with no edges); isolated nodes, multi-edges and self-loops as the draws fall."""
    types = TYPES[: draw(st.integers(1, len(TYPES)))]
    counts = {t: draw(st.integers(1 if t == "paper" else 0, max_nodes)) for t in types}
    edges = {}
    for i in range(draw(st.integers(1, 4))):
        if i == 0 and len(types) > 1:  # across two types, with rows on both sides
            s, d = types[1], types[0]
            counts[s] = max(counts[s], 1)
        else:
            s, d = draw(st.sampled_from(types)), draw(st.sampled_from(types))
        edges[(s, f"r{i}", d)] = relation_edges(draw, counts, s, d, max_edges)
    first = next(iter(edges))
    if not {s for s, _, _ in edges} & {d for _, _, d in edges}:  # DGL makes a graph whose sources and
        s, _, d = first  # destinations are types apart a block-like one (no dst author): add a reverse
        edges[(d, f"r{len(edges)}", s)] = (edges[first][1], edges[first][0])
    linked = {t for s, _, d in edges for t in (s, d)}  # a type in no relation has no row count on the graph
    hg = dgl.heterograph(edges, num_nodes_dict={t: n for t, n in counts.items() if t in linked})
    return hg, draw(st.integers(0, 2**16))


def _close(got, want, what: str) -> None:
    if isinstance(want, dict):
        assert set(got) == set(want), (what, sorted(got), sorted(want))
        for k in want:
            _close(got[k], want[k], f"{what}[{k}]")
        return
    scale = max([1.0, *want.abs().flatten().tolist()])
    torch.testing.assert_close(got, want, atol=TOL * scale, rtol=0, msg=what)


def _gathered(results: list[dict], key: str, like):
    """The workers' rows of ``key`` (a tensor, or one per node type) in the whole graph's order."""
    if isinstance(like, dict):
        return {t: _put(v, [(r["ids"][t], r[key][t]) for r in results]) for t, v in like.items()}
    return _put(like, [(r["ids"], r[key]) for r in results])


def _put(like: torch.Tensor, pieces: list) -> torch.Tensor:
    out = torch.full_like(like, float("nan"))
    for ids, rows in pieces:
        out[ids] = rows
    return out


@pytest.mark.parametrize("name", MODELS)
@given(case=heterographs(), world=st.integers(1, 4), method=st.sampled_from(["metis", "random"]))
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
def test_dgl_hetero_models_equal_dgl_on_one_to_four_workers(pool, tmp_path_factory, name, case, world, method):
    hg, seed = case
    model = build(name, hg, seed)
    inputs = features(name, hg, seed)
    with as_oracle(model):  # DGL, eagerly
        if name in HOMOGENEOUS:
            g, ntype, etype = homogeneous(hg)
            weights = loss_weights(model(g, inputs["x"], ntype, etype), seed)
            graph = sc.Graph.from_dgl(g)
        else:
            g = hg
            weights = loss_weights(model(g, inputs["x"]), seed)
            graph = sc.HeteroGraph.from_dgl(hg)
        want = step(model, g, inputs, weights)
    one = step(sc.distribute(model), graph, inputs, weights)
    for key in ("out", "x_grad", "param_grads", "table_grads"):
        _close(one[key], want[key], f"{name}, one machine: {key}")

    out_dir = tmp_path_factory.mktemp("dgl_hetero")
    sc.partition(graph, world, out_dir, method=method, seed=seed)
    payload = {"dir": str(out_dir), "model": model, "inputs": inputs, "weights": weights}
    results = pool(world).run(run_worker, [payload] * world)
    for key in ("out", "x_grad"):
        _close(_gathered(results, key, want[key]), want[key], f"{name}, {world} workers: {key}")
    for k, grad in want["table_grads"].items():  # each worker holds its own rows of a node table
        got = _put(grad, [(r["ids"][table_type(k)], r["table_grads"][k]) for r in results])
        _close(got, grad, f"{name}, {world} workers: {k}")
    for r in results:
        _close(r["param_grads"], want["param_grads"], f"{name}, {world} workers: parameter gradients")


# -- what cannot be exact is refused, naming the layer, the line and the fix ---------------------
def _graph():
    return dgl.heterograph({("author", "writes", "paper"): ([0, 1, 1], [0, 0, 2]),
                            ("paper", "cites", "paper"): ([1, 2], [0, 0]),
                            ("paper", "rev", "author"): ([0, 2], [1, 1])})


class _GATEdgeWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = dglnn.HeteroGraphConv({r: dglnn.GATConv(3, 2, num_heads=1) for r in ("writes", "cites", "rev")})

    def forward(self, g, x, w):
        return self.conv(g, x, mod_kwargs={rel[1]: {"edge_weight": w[rel]} for rel in g.canonical_etypes})


class _UDFOverAll(nn.Module):
    def forward(self, g, x):
        with g.local_scope():
            g.ndata["h"] = x
            g.update_all(lambda edges: {"m": edges.src["h"]}, fn.sum("m", "o"))
            return g.ndata["o"]


class _SourceSoftmax(nn.Module):
    def forward(self, g, x):
        with g.local_scope():
            g.ndata["h"] = x
            for rel in g.canonical_etypes:
                g.apply_edges(fn.u_dot_v("h", "h", "s"), etype=rel)
            return dgl.nn.functional.edge_softmax(g, g.edata["s"], norm_by="src")


class _MaxOverTwoTypes(nn.Module):
    def forward(self, g, x):
        with g.local_scope():
            g.ndata["h"] = x
            g["writes"].update_all(fn.u_mul_v("h", "h", "m"), fn.max("m", "o"))
            return g.nodes["paper"].data["o"]


@pytest.mark.parametrize("model, extra, words", [
    (_GATEdgeWeight, True, ["dgl.nn.GATConv", "edge_weight"]),
    (_UDFOverAll, False, ["update_all over several relations", "multi_update_all"]),
    (_SourceSoftmax, False, ["norm_by='src'", "norm_by='dst'"]),
    (_MaxOverTwoTypes, False, ["two node types", "use sum or mean", "test_dgl_hetero.py"]),
])
def test_what_is_not_exact_is_refused_with_the_fix(model, extra, words):
    hg = _graph()
    x = {t: torch.randn(hg.num_nodes(t), 3) for t in hg.ntypes}
    args = (x, {r: torch.rand(hg.num_edges(r)) for r in hg.canonical_etypes}) if extra else (x,)
    with pytest.raises(sc.CompileError) as info:
        sc.distribute(model())(sc.HeteroGraph.from_dgl(hg), *args)
    for word in words:
        assert word in str(info.value), str(info.value)
