"""PyG's layers on a sparse adjacency with values or self-loops (a normalised ``adj_t``, as
the OGB examples build it: ``gcn_norm(adj_t)`` or ``D^-1/2 (A+I) D^-1/2`` by hand).

The oracle is the unchanged eager model called with the same ``torch.sparse`` adjacency.
The compiled model gets the adjacency itself on one machine, and on 2 and 3 workers the
shards of ``sc.Graph.from_adjacency(adj_t)``, which carry its values in shard order. Whole
outputs, input gradients and parameter gradients, float64, in train and eval mode."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch_geometric import nn as gnn
from torch_geometric.nn.conv.gcn_conv import gcn_norm

import sarcompile as sc
from sarcompile.graph.shard import ShardGraph, split_graph
from sarcompile.errors import CompileError
from strategies import graphs

DT = torch.float64
RTOL, ATOL = 1e-7, 1e-10
N = 19

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")

# Each layer kind: (in, out) -> layer. Two of them in a row, so the second aggregates what
# the first computed from other workers' rows.
LAYERS = {
    "GCNConv(normalize=False)": lambda i, o: gnn.GCNConv(i, o, normalize=False),
    "GCNConv": lambda i, o: gnn.GCNConv(i, o),
    "GCNConv(cached, improved)": lambda i, o: gnn.GCNConv(i, o, cached=True, improved=True),
    "SAGEConv": lambda i, o: gnn.SAGEConv(i, o),
    "SAGEConv(max)": lambda i, o: gnn.SAGEConv(i, o, aggr="max"),
    "SAGEConv(sum)": lambda i, o: gnn.SAGEConv(i, o, aggr="sum"),
    "GINConv": lambda i, o: gnn.GINConv(nn.Sequential(nn.Linear(i, o), nn.ReLU(), nn.Linear(o, o)), train_eps=True),
    "GraphConv": lambda i, o: gnn.GraphConv(i, o),
    "GraphConv(mean)": lambda i, o: gnn.GraphConv(i, o, aggr="mean"),
    "GraphConv(min)": lambda i, o: gnn.GraphConv(i, o, aggr="min"),
    "GATConv": lambda i, o: gnn.GATConv(i, o, heads=2, concat=False),
}


class Net(nn.Module):
    """Two layers of one kind on ``adj_t``, as the OGB examples call them."""

    def __init__(self, kind: str):
        super().__init__()
        self.c1, self.c2 = LAYERS[kind](6, 8), LAYERS[kind](8, 3)

    def forward(self, x, adj_t):
        return self.c2(torch.relu(self.c1(x, adj_t)), adj_t)


def _sparse(src: torch.Tensor, dst: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    """``adj_t[dst, src] = values`` (repeated entries summed), CSR as ToSparseTensor makes it."""
    return torch.sparse_coo_tensor(torch.stack([dst, src]), values, (n, n)).coalesce().to_sparse_csr()


def _by_hand(adj: torch.Tensor) -> torch.Tensor:
    """``D^-1/2 (A + I) D^-1/2``, as the OGB examples write it (deg: row sums of A + I)."""
    n = adj.shape[0]
    a = (adj.to_sparse_coo() + torch.sparse_coo_tensor(torch.arange(n).repeat(2, 1), torch.ones(n, dtype=adj.dtype),
                                                       (n, n))).coalesce()
    (row, col), v = a.indices(), a.values()
    inv = torch.zeros(n, dtype=adj.dtype).index_add(0, row, v).pow(-0.5)
    return _sparse(col, row, inv[row] * v * inv[col], n)


def adjacency(kind: str, src: torch.Tensor, dst: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """The adjacency of the edges ``src -> dst`` as a model is given it: ``ones`` (self-loops
    kept), ``weighted`` (random values), ``gcn_norm`` (PyG's normalisation of the ones,
    self-loops added) or ``by_hand``."""
    gen = torch.Generator().manual_seed(seed)
    ones = _sparse(src, dst, torch.ones(src.numel(), dtype=DT), n)  # (repeated edges count twice)
    if kind == "ones":
        return ones
    if kind == "weighted":
        return _sparse(src, dst, torch.rand(src.numel(), generator=gen, dtype=DT) * 2 - 0.5, n)
    if kind == "gcn_norm":
        return gcn_norm(ones, add_self_loops=True)[0]
    return _by_hand(ones)


def _edges(loops: bool, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, N - 2, (2, 60), generator=gen)  # the last two nodes isolated
    keep = src != dst
    src, dst = src[keep], dst[keep]
    if loops:
        src, dst = torch.cat([src, torch.arange(0, N, 3)]), torch.cat([dst, torch.arange(0, N, 3)])
    return src, dst


def _step(model: nn.Module, run, x: torch.Tensor, w: torch.Tensor, graph, shard: bool) -> dict:
    x = x.clone().requires_grad_(True)
    out = run(x, graph)
    (out * w).sum().backward()
    grads = {k: sc.global_sum(p.grad) if shard else p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    return {"out": out.detach(), "x_grad": x.grad, "grads": grads}


def _close(got, want, what: str) -> None:
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL, msg=what)


def _eager(kind: str, adj: torch.Tensor, x: torch.Tensor, w: torch.Tensor, training: bool) -> dict:
    torch.manual_seed(4)
    model = Net(kind).double().train(training)
    return _step(model, model, x, w, adj, False)


def adjacency_worker(rank: int, world_size: int, payload: dict) -> dict:
    """The compiled model on this worker's shard of the adjacency's graph, in each mode."""
    part = payload["part"]
    shard = ShardGraph.from_part(part, rank, world_size, payload["num_nodes"], payload["num_edges"])
    out = {"ids": part.global_ids}
    for training in (True, False):
        torch.manual_seed(4)
        model = Net(payload["kind"]).double().train(training)
        out[training] = _step(model, sc.distribute(model), part.node_data["x"], part.node_data["w"], shard, True)
    return out


def _check_workers(pool, kind: str, adj: torch.Tensor, x: torch.Tensor, w: torch.Tensor, assignment: torch.Tensor,
                   parts: int) -> None:
    g = sc.Graph.from_adjacency(adj)
    want = {t: _eager(kind, adj, x, w, t) for t in (True, False)}
    split = split_graph(g, assignment, parts, {"x": x, "w": w})
    results = pool(parts).run(adjacency_worker, [{"part": p, "kind": kind, "num_nodes": g.num_nodes,
                                                  "num_edges": g.num_edges} for p in split])
    for training in (True, False):
        for key in ("out", "x_grad"):
            full = torch.zeros_like(want[training][key])
            for r in results:
                full[r["ids"]] = r[training][key]
            _close(full, want[training][key], f"{kind} {key} training={training} on {parts} workers")
        for r in results:
            for k, grad in want[training]["grads"].items():
                _close(r[training]["grads"][k], grad, f"{kind} {k} training={training} on {parts} workers")


def _inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(N, 6, generator=gen, dtype=DT), torch.randn(N, 3, generator=gen, dtype=DT)


# (The adjacency of ones without self-loops is the graph of edge_index: test_kept_graphs.)
@pytest.mark.parametrize("loops, values", [(True, "ones"), *((loops, v) for loops in (False, True)
                                                             for v in ("weighted", "gcn_norm", "by_hand"))])
@pytest.mark.parametrize("kind", list(LAYERS))
def test_a_layer_on_an_adjacency_with_values_matches_eager_pyg_on_one_machine(kind, loops, values):
    adj = adjacency(values, *_edges(loops), N, seed=2)
    x, w = _inputs()
    for training in (True, False):
        want = _eager(kind, adj, x, w, training)
        torch.manual_seed(4)
        model = Net(kind).double().train(training)
        got = _step(model, sc.distribute(model), x, w, adj, False)
        for key in ("out", "x_grad"):
            _close(got[key], want[key], f"{key} training={training}")
        for k, grad in want["grads"].items():
            _close(got["grads"][k], grad, f"{k} training={training}")


@pytest.mark.parametrize("kind", list(LAYERS))
def test_a_layer_on_a_normalised_adjacency_matches_eager_pyg_on_two_and_three_workers(pool, kind):
    x, w = _inputs()
    for parts, values in ((2, "gcn_norm"), (3, "weighted")):
        adj = adjacency(values, *_edges(loops=True), N, seed=2)
        _check_workers(pool, kind, adj, x, w, torch.arange(N) % parts, parts)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(graph=graphs(max_nodes=20, max_edges=50), values=st.sampled_from(["weighted", "gcn_norm", "by_hand"]),
       kind=st.sampled_from(["GCNConv", "GCNConv(normalize=False)", "SAGEConv(max)", "GraphConv(mean)"]),
       data=st.data())
def test_random_adjacencies_and_partitions_match_eager_pyg(pool, graph, values, kind, data):
    src, dst, n, seed = graph
    parts = data.draw(st.integers(2, 3))
    assignment = torch.tensor(data.draw(st.lists(st.integers(0, parts - 1), min_size=n, max_size=n)))
    adj = adjacency(values, src, dst, n, seed)
    gen = torch.Generator().manual_seed(seed)
    x, w = torch.randn(n, 6, generator=gen, dtype=DT), torch.randn(n, 3, generator=gen, dtype=DT)
    _check_workers(pool, kind, adj, x, w, assignment, parts)


def test_an_adjacency_with_values_is_refused_by_a_layer_that_would_misread_it():
    adj = adjacency("gcn_norm", *_edges(loops=False), N, seed=2)
    x, _ = _inputs()

    class Cheb(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = gnn.ChebConv(6, 3, K=2)

        def forward(self, x, adj_t):
            return self.conv(x, adj_t)  # the line the refusal names

    with pytest.raises(CompileError, match=r"torch_geometric\.nn\.ChebConv was given a sparse adjacency with values "
                                           r"other than 1 or with self-loops .* Give torch_geometric\.nn\.ChebConv the "
                                           r"graph of edges .*at test_pyg_adjacency\.py:\d+: `return self\.conv"):
        sc.distribute(Cheb().double())(x, adj)


def test_an_adjacency_whose_values_require_grad_is_refused():
    adj = adjacency("weighted", *_edges(loops=False), N, seed=2).requires_grad_(True)
    x, _ = _inputs()
    with pytest.raises(CompileError, match=r"a sparse adjacency whose values require grad .* Give adj_t\.detach\(\)"):
        sc.distribute(Net("GCNConv").double())(x, adj)

