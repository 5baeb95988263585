"""PyG layers over edge types (sarcompile/frontends/pyg/edge_types.py) and the
``edge_subset`` op they use: its graph on a worker's shard against the one on the whole
graph, the layers against eager PyG on one machine (with option variants), and the zoo's
cases on 1, 2 and 3 gloo workers."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

pytest.importorskip("torch_geometric")
import torch_geometric.nn as gnn  # noqa: E402

import sarcompile as sc  # noqa: E402
from sarcompile import ops  # noqa: E402
from sarcompile.errors import CompileError, GraphError  # noqa: E402
from sarcompile.graph.graph import SUBSET_CACHE  # noqa: E402
from sarcompile.graph.shard import ShardGraph, split_graph  # noqa: E402
from pyg_models import FeaturelessRGCN, run_relational_worker  # noqa: E402

DT = torch.float64
RELATIONS = 3


def _graph(n: int = 40, e: int = 160, seed: int = 0) -> tuple[sc.Graph, torch.Tensor]:
    """A graph with self-loops and duplicate edges, and an edge type per edge."""
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    loops = torch.arange(0, n, 5)
    src, dst = torch.cat([src, loops, src[:10]]), torch.cat([dst, loops, dst[:10]])
    return sc.Graph.from_edges(src, dst, n), torch.randint(0, RELATIONS, (src.numel(),), generator=gen)


def _edges(shard: ShardGraph) -> list[tuple[int, int, int]]:
    """(global source, global destination, edge id) of every edge of a shard, in shard order."""
    out = []
    for q, b in enumerate(shard.blocks):
        ids = shard.edge_ids[shard.edge_ptr[q] : shard.edge_ptr[q + 1]]
        out += zip(b.src_gids[b.col].tolist(), shard.global_ids[b.row].tolist(), ids.tolist())
    return out


# -- the subset graph ------------------------------------------------------------------------------
def test_subset_of_a_graph_keeps_the_masked_edges_in_order():
    g, edge_type = _graph()
    mask = edge_type == 1
    sub = g.edge_subset(mask)
    assert torch.equal(sub.src, g.src[mask]) and torch.equal(sub.dst, g.dst[mask])
    assert torch.equal(sub.edge_ids, g.edge_ids[mask]) and sub.num_nodes == g.num_nodes
    x = torch.randn(g.num_nodes, 3, dtype=DT)
    want = torch.zeros_like(x).index_add_(0, sub.dst, x[sub.src])
    assert torch.allclose(ops.spmm(g.edge_subset(mask), x, "sum"), want)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_subset_of_a_shard_is_the_shard_of_the_subset(world):
    """On every worker: the edges the shard's subset keeps are those of the whole graph's
    subset that end on the worker, in the same (shard) order; the blocks keep their
    source rows, so the send lists of the peers stay right."""
    g, edge_type = _graph(seed=world)
    assignment = torch.arange(g.num_nodes) % world
    whole = g.edge_subset(edge_type == 2)
    parts = split_graph(g, assignment, world)
    parts_of_subset = split_graph(whole, assignment, world)
    for r in range(world):
        shard = ShardGraph.from_part(parts[r], r, world, g.num_nodes, g.num_edges)
        sub = ops.edge_subset(shard, edge_type[shard.edge_ids] == 2)
        expected = ShardGraph.from_part(parts_of_subset[r], r, world, g.num_nodes, whole.num_edges)
        # the subset's split numbers its edges by position in the subset: map them back
        assert _edges(sub) == [(s, d, int(whole.edge_ids[e])) for s, d, e in _edges(expected)]
        assert sub.num_edges == int((edge_type[shard.edge_ids] == 2).sum())
        assert sub.halo_sizes() == shard.halo_sizes() and sub.send_index is shard.send_index
        assert torch.equal(sub.dst_index, torch.cat([b.row for b in sub.blocks]))


def test_subsets_are_cached_by_mask_content_and_bounded():
    g, edge_type = _graph()
    first = g.edge_subset(edge_type == 0)
    assert g.edge_subset((edge_type == 0).clone()) is first  # a mask made anew finds it
    assert g.edge_subset(edge_type == 1) is not first
    for i in range(SUBSET_CACHE + 1):  # other masks push the oldest out
        g.edge_subset(torch.arange(g.num_edges) % (i + 2) == 0)
    assert g.edge_subset(edge_type == 0) is not first
    assert sum(isinstance(k, tuple) for k in g._derived) == SUBSET_CACHE


def test_subset_refuses_an_index_or_a_mask_of_other_edges():
    g, edge_type = _graph()
    with pytest.raises(GraphError, match="one bool per edge"):
        ops.edge_subset(g, edge_type)  # edge_index[:, idx] with indices: not a mask
    with pytest.raises(GraphError, match="rows"):
        ops.edge_subset(g, torch.ones(3, dtype=torch.bool))


# -- the layers against eager PyG on one machine ----------------------------------------------------
class WithType(nn.Module):
    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x, edge_index, edge_type):
        return self.layer(x, edge_index, edge_type).relu()


LAYERS = {
    "RGCNConv": lambda: gnn.RGCNConv(5, 4, RELATIONS),
    "RGCNConv(aggr=add)": lambda: gnn.RGCNConv(5, 4, RELATIONS, aggr="add"),
    "RGCNConv(aggr=max)": lambda: gnn.RGCNConv(5, 4, RELATIONS, aggr="max"),
    "RGCNConv(num_bases)": lambda: gnn.RGCNConv(5, 4, RELATIONS, num_bases=2, root_weight=False),
    "FastRGCNConv": lambda: gnn.FastRGCNConv(5, 4, RELATIONS),
    "FastRGCNConv(aggr=add, num_bases)": lambda: gnn.FastRGCNConv(5, 4, RELATIONS, aggr="add", num_bases=2),
    "FiLMConv(num_relations)": lambda: gnn.FiLMConv(5, 4, num_relations=RELATIONS),
    "RGATConv": lambda: gnn.RGATConv(5, 4, RELATIONS),
    "RGATConv(heads, multiplicative)": lambda: gnn.RGATConv(
        5, 4, RELATIONS, heads=2, attention_mode="multiplicative-self-attention", dim=2),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_is_exact_on_one_machine(name):
    g, edge_type = _graph()
    torch.manual_seed(0)
    model = WithType(LAYERS[name]()).to(DT)
    x = torch.randn(g.num_nodes, 5, dtype=DT)
    w = torch.randn(g.num_nodes, model.layer.out_channels * getattr(model.layer, "heads", 1) * getattr(
        model.layer, "dim", 1), dtype=DT)

    def run(m, graph):
        xi = x.clone().requires_grad_(True)
        m.zero_grad()
        out = m(xi, graph, edge_type)
        (out * w[:, : out.shape[1]]).sum().backward()
        return out.detach(), xi.grad, {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}

    want = run(model, torch.stack([g.src, g.dst]))
    got = run(sc.distribute(model), g)
    torch.testing.assert_close(got[0], want[0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got[1], want[1], rtol=1e-9, atol=1e-9)
    assert got[2].keys() == want[2].keys()
    for k in want[2]:
        torch.testing.assert_close(got[2][k], want[2][k], rtol=1e-9, atol=1e-9, msg=k)


def test_rgcn_without_floating_features_is_refused():
    g, edge_type = _graph()
    model = sc.distribute(WithType(gnn.RGCNConv(g.num_nodes, 4, RELATIONS)))
    with pytest.raises(CompileError, match="floating-point node features"):
        model(torch.arange(g.num_nodes), g, edge_type)  # node indices as features


class WithoutFeatures(nn.Module):
    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, edge_index, edge_type):
        return self.layer(None, edge_index, edge_type).relu()


FEATURELESS = {
    "RGCNConv": lambda n: gnn.RGCNConv(n, 4, RELATIONS),
    "RGCNConv(num_bases)": lambda n: gnn.RGCNConv(n, 4, RELATIONS, num_bases=2),
    "RGCNConv(aggr=add, no root, no bias)": lambda n: gnn.RGCNConv(n, 4, RELATIONS, aggr="add", root_weight=False,
                                                                    bias=False),
    "RGCNConv(aggr=max)": lambda n: gnn.RGCNConv(n, 4, RELATIONS, aggr="max"),
    "FastRGCNConv": lambda n: gnn.FastRGCNConv(n, 4, RELATIONS),
    "FastRGCNConv(aggr=add, num_bases)": lambda n: gnn.FastRGCNConv(n, 4, RELATIONS, aggr="add", num_bases=2),
}


@pytest.mark.parametrize("name", list(FEATURELESS))
def test_layer_without_features_is_exact_on_one_machine(name):
    """PyG's node-index mode (x=None): each node's one-hot features, i.e. its own row of the
    weight per relation and of the root; outputs and every parameter gradient as eager PyG."""
    g, edge_type = _graph()
    torch.manual_seed(0)
    model = WithoutFeatures(FEATURELESS[name](g.num_nodes)).to(DT)
    w = torch.randn(g.num_nodes, 4, dtype=DT)

    def run(m, graph):
        m.zero_grad()
        out = m(graph, edge_type)
        (out * w).sum().backward()
        return out.detach(), {k: p.grad.clone() for k, p in m.named_parameters()}

    want = run(model, torch.stack([g.src, g.dst]))
    got = run(sc.distribute(model), g)
    torch.testing.assert_close(got[0], want[0], rtol=1e-9, atol=1e-9)
    assert got[1].keys() == want[1].keys()
    for k in want[1]:
        torch.testing.assert_close(got[1][k], want[1][k], rtol=1e-9, atol=1e-9, msg=k)


@pytest.mark.parametrize("world_size,num_bases", [(2, None), (3, 2)])
def test_layers_without_features_on_workers_match_eager_pyg(pool, world_size, num_bases):
    """examples/rgcn.py's way (RGCNConv and FastRGCNConv with x=None, then RGCNConv on
    features) on 2 and 3 workers: every output row and parameter gradient as eager PyG's."""
    g, edge_type = _graph(seed=world_size)
    torch.manual_seed(world_size)
    model = FeaturelessRGCN(g.num_nodes, RELATIONS, num_bases).to(DT)
    state = copy.deepcopy(model.state_dict())
    w = torch.randn(g.num_nodes, 3, dtype=DT)
    out = model(torch.stack([g.src, g.dst]), edge_type)
    (out * w).sum().backward()
    assignment = torch.randint(0, world_size, (g.num_nodes,), generator=torch.Generator().manual_seed(world_size))
    parts = split_graph(g, assignment, world_size, {"w": w})
    payloads = [{"part": p, "state": state, "num_nodes": g.num_nodes, "num_edges": g.num_edges,
                 "relations": RELATIONS, "num_bases": num_bases, "edge_type": edge_type} for p in parts]
    results = pool(world_size).run(run_relational_worker, payloads)
    got = torch.full_like(out, float("nan"))
    for p, r in zip(parts, results):
        got[p.global_ids] = r["out"]
    torch.testing.assert_close(got, out.detach(), rtol=1e-9, atol=1e-9)
    for r in results:
        for k, p in model.named_parameters():
            torch.testing.assert_close(r["grads"][k], p.grad, rtol=1e-9, atol=1e-9, msg=k)


def test_what_the_lowering_does_not_cover_is_refused():
    g, edge_type = _graph()
    x = torch.randn(g.num_nodes, 4)
    with pytest.raises(CompileError, match="RGATConv"):
        layer = gnn.RGATConv(4, 4, RELATIONS, attention_mechanism="within-relation")
        sc.distribute(WithType(layer))(x, g, edge_type)
    with pytest.raises(CompileError, match="num_blocks has no node-index mode"):  # (PyG raises too)
        sc.distribute(WithoutFeatures(gnn.RGCNConv(g.num_nodes, 4, RELATIONS, num_blocks=2)))(g, edge_type)


def test_block_diagonal_rgcn_is_exact_on_one_machine():
    """RGCNConv(num_blocks)'s einsum('abc,bcd->abd') keeps each edge on its own subscript: row-local."""
    g, edge_type = _graph()
    torch.manual_seed(0)
    model = WithType(gnn.RGCNConv(4, 4, RELATIONS, num_blocks=2)).to(DT)
    x = torch.randn(g.num_nodes, 4, dtype=DT)
    want, got = model(x, torch.stack([g.src, g.dst]), edge_type), sc.distribute(model)(x, g, edge_type)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


# (These layers run on 1, 2 and 3 workers in tests/benchmarks/test_pyg_zoo.py, with every case the saved
# sweep calls exact.)
