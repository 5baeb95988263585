"""Graphs from anywhere the model keeps them: on the model (``self.g = g``, in a submodule,
a list of graphs), or passed in a list (``blocks=[g, g]``, metapath graphs). Each is an
input of the program; on a worker the model holds (or is given) the worker's shard. Exact
against eager on one machine and on 2 and 3 workers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import sarcompile as sc
from sarcompile.graph.shard import ShardGraph, split_graph
from sarcompile.errors import CompileError

DT = torch.float64
TOL = 1e-9
N = 17


class Propagate(nn.Module):
    """APPNP's propagation, holding its graph: ``k`` steps of mean aggregation mixed with
    the input (a layer of a model that passes the graph to its layers' constructors)."""

    def __init__(self, g, k: int = 3, alpha: float = 0.2):
        super().__init__()
        self.g, self.k, self.alpha = g, k, alpha

    def forward(self, h):
        h0 = h
        for _ in range(self.k):
            h = (1 - self.alpha) * sc.spmm(self.g, h, "mean") + self.alpha * h0
        return h


class Kept(nn.Module):
    """The graph given to the constructor and kept (DGL's APPNP and TAGCN examples):
    ``model(features)``; a submodule keeps it too."""

    def __init__(self, g):
        super().__init__()
        self.g = g
        self.conv = sc.nn.SAGEConv(6, 8, "mean")
        self.lin = nn.Linear(8, 3)
        self.propagate = Propagate(g)

    def forward(self, features):
        h = torch.relu(self.conv(self.g, features))
        return self.propagate(self.lin(h))


class Metapaths(nn.Module):
    """A list of graphs over the same nodes kept on the model (HAN's metapath graphs)."""

    def __init__(self, graphs: list):
        super().__init__()
        self.metapaths = graphs
        self.lins = nn.ModuleList([nn.Linear(6, 4) for _ in graphs])

    def forward(self, x):
        return sum(sc.spmm(g, lin(x), "sum") for g, lin in zip(self.metapaths, self.lins))


class Blocks(nn.Module):
    """DGL's minibatch model trained full-graph: ``forward(blocks, x)`` with one block per
    layer, every one the whole graph; and an argument with a list of metapath graphs."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([sc.nn.SAGEConv(6, 8, "mean"), sc.nn.SAGEConv(8, 3, "sum")])

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = torch.relu(h)
        return h


def _graphs(seed: int = 0) -> tuple[sc.Graph, sc.Graph, torch.Tensor, torch.Tensor]:
    """Two graphs over the same N nodes, features and per-node loss weights."""
    gen = torch.Generator().manual_seed(seed)
    g1, g2 = (sc.Graph.from_edges(torch.randint(0, N, (e,), generator=gen), torch.randint(0, N, (e,), generator=gen), N)
              for e in (60, 40))
    return g1, g2, torch.randn(N, 6, generator=gen, dtype=DT), torch.randn(N, 1, generator=gen, dtype=DT)


def _build(name: str, g1, g2) -> tuple[nn.Module, Any]:
    """The model ``name`` over graphs ``g1`` and ``g2`` (whole or a worker's shards), and how
    it is called: ``call(model, x)``."""
    torch.manual_seed(1)
    if name == "kept":
        return Kept(g1).double(), lambda m, x: m(x)
    if name == "metapaths":
        return Metapaths([g1, g2]).double(), lambda m, x: m(x)
    if name == "blocks":
        return Blocks().double(), lambda m, x: m([g1, g1], x)
    if name == "blocks_of_two":
        return Blocks().double(), lambda m, x: m(blocks=(g1, g2), x=x)
    raise KeyError(name)


NAMES = ["kept", "metapaths", "blocks", "blocks_of_two"]


def _step(model: nn.Module, run: nn.Module, call, x: torch.Tensor, w: torch.Tensor, shard: bool) -> dict:
    x = x.clone().requires_grad_(True)
    out = call(run, x)
    (out * w).sum().backward()
    grads = {k: sc.global_sum(p.grad) if shard else p.grad for k, p in model.named_parameters()}
    return {"out": out.detach(), "x_grad": x.grad, "grads": grads}


@pytest.mark.parametrize("name", NAMES)
def test_a_graph_kept_or_in_a_list_compiles_exact_against_eager(name):
    g1, g2, x, w = _graphs()
    model, call = _build(name, g1, g2)
    want = _step(model, model, call, x, w, False)
    model.zero_grad()
    got = _step(model, sc.distribute(model), call, x, w, False)
    for key in ("out", "x_grad"):
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=TOL)
    for k in want["grads"]:
        torch.testing.assert_close(got["grads"][k], want["grads"][k], rtol=0, atol=TOL, msg=k)


def _worker(rank: int, world_size: int, payload: dict) -> dict:
    shards = [ShardGraph.from_part(p, rank, world_size, N, e) for p, e in zip(payload["parts"], payload["edges"])]
    part = payload["parts"][0]
    results = {}
    for name in payload["names"]:
        if payload["assign"] and name == "kept":  # built with the whole graph, given the shard after
            model, call = _build(name, payload["whole"], payload["whole"])
            compiled = sc.distribute(model)
            compiled.g = shards[0]
            compiled.propagate.g = shards[0]
        else:  # built on the worker with its shards, as the eager model is built with the graph
            model, call = _build(name, *shards)
            compiled = sc.distribute(model)
        results[name] = _step(model, compiled, call, part.node_data["x"], part.node_data["w"], True)
    return {"results": results, "ids": part.global_ids}


@pytest.mark.parametrize("world_size, names", [(2, NAMES), (3, ["kept", "blocks_of_two"])])
def test_kept_and_listed_graphs_are_exact_on_workers(pool, world_size, names):
    g1, g2, x, w = _graphs(world_size)
    assignment = torch.arange(N) * world_size // N
    parts = [split_graph(g, assignment, world_size, {"x": x, "w": w}) for g in (g1, g2)]
    payloads = [{"parts": [parts[0][r], parts[1][r]], "edges": [g1.num_edges, g2.num_edges], "whole": g1,
                 "assign": world_size == 2, "names": names} for r in range(world_size)]
    results = pool(world_size).run(_worker, payloads)
    for name in names:
        model, call = _build(name, g1, g2)
        want = _step(model, model, call, x, w, False)
        for key in ("out", "x_grad"):
            full = torch.zeros_like(want[key])
            for r in results:
                full[r["ids"]] = r["results"][name][key]
            torch.testing.assert_close(full, want[key], rtol=0, atol=TOL, msg=f"{name} {key}")
        for r in results:
            for k, grad in want["grads"].items():
                torch.testing.assert_close(r["results"][name]["grads"][k], grad, rtol=0, atol=TOL, msg=f"{name} {k}")


def test_a_plan_finds_the_graph_the_model_keeps():
    g1, _, x, _ = _graphs()
    plan = sc.distribute(Kept(g1).double()).plan(g1, 2, x=x, method="random")  # before any call
    assert [op.layer for op in plan.ops] == ["conv", "propagate", "propagate", "propagate"]
    compiled = sc.distribute(Blocks().double())
    compiled([g1, g1], x)  # (a list's length is known from a call)
    plan = compiled.plan(g1, 2, x=x, method="random")
    assert [op.layer for op in plan.ops] == ["layers.0", "layers.1"]


def test_no_graph_says_where_it_looked_and_what_to_do():
    class NoGraph(nn.Module):
        def forward(self, x):
            return x * 2

    with pytest.raises(CompileError, match=r"no graph: sarcompile looked in forward's arguments .* and in the model's "
                                           r"attributes .* keep it on the model: self.g = g .* model.g = part.graph"):
        sc.distribute(NoGraph())(torch.ones(3, 2))


def test_a_whole_graph_kept_with_a_shard_given_is_refused_naming_it():
    g1, _, x, _ = _graphs()
    model = Kept(g1).double()
    compiled = sc.distribute(model)
    compiled.g = ShardGraph.single(g1)  # the submodule still keeps the whole graph
    assert model.g is compiled.g
    with pytest.raises(CompileError, match=r"shards \(self.g\) and whole graphs \(self.propagate.g\) at once; .* "
                                           r"model.propagate.g = part.graph"):
        compiled(x)


class KeptTyped(nn.Module):
    """A typed graph kept (DGL's RGCN-hetero example): per relation a sum into its
    destination type; ``model(x_dict)``."""

    def __init__(self, g):
        super().__init__()
        self.g = g
        self.lin = nn.ModuleDict({f"{s}__{r}__{d}": nn.Linear(4, 4) for s, r, d in g.edge_types})

    def forward(self, x: dict):
        h = dict(x)
        for rel in self.g.edge_types:
            h[rel[2]] = h[rel[2]] + sc.spmm(self.g[rel], self.lin["__".join(rel)](x[rel[0]]), "sum")
        return h["paper"]


def _typed() -> tuple[sc.HeteroGraph, dict]:
    gen = torch.Generator().manual_seed(5)
    edges = {("author", "writes", "paper"): (torch.randint(0, 7, (20,), generator=gen),
                                             torch.randint(0, 9, (20,), generator=gen)),
             ("paper", "cites", "paper"): (torch.randint(0, 9, (15,), generator=gen),
                                           torch.randint(0, 9, (15,), generator=gen))}
    g = sc.HeteroGraph.from_edges(edges, {"paper": 9, "author": 7})
    return g, {t: torch.randn(g.num_nodes(t), 4, generator=gen, dtype=DT) for t in g.node_types}


def _typed_worker(rank: int, world_size: int, payload: dict) -> dict:
    part = sc.load_partition(payload["dir"], rank=rank, world_size=world_size)
    torch.manual_seed(3)
    model = KeptTyped(payload["graph"]).double()
    compiled = sc.distribute(model)
    compiled.g = part.graph
    x = {t: v[part.global_ids[t]].clone().requires_grad_(True) for t, v in payload["x"].items()}
    out = compiled(x)
    out.sum().backward()
    return {"out": out.detach(), "ids": part.global_ids["paper"],
            "grads": {k: sc.global_sum(p.grad) for k, p in model.named_parameters()}}


def test_a_kept_typed_graph_is_exact_on_one_machine_and_two_workers(pool, tmp_path):
    g, x = _typed()
    torch.manual_seed(3)
    model = KeptTyped(g).double()
    want = model(x)
    want.sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    torch.testing.assert_close(sc.distribute(model)(x), want, rtol=0, atol=TOL)
    sc.partition(g, 2, tmp_path, method="random", seed=1)
    results = pool(2).run(_typed_worker, [{"dir": str(tmp_path), "graph": g, "x": x}] * 2)
    full = torch.zeros_like(want)
    for r in results:
        full[r["ids"]] = r["out"]
    torch.testing.assert_close(full, want.detach(), rtol=0, atol=TOL)
    for r in results:
        for k, grad in grads.items():
            torch.testing.assert_close(r["grads"][k], grad, rtol=0, atol=TOL, msg=k)


# -- a sparse adjacency (PyG's adj_t) -----------------------------------------------------------------
class AdjNet(nn.Module):
    """PyG's layers called with ``adj_t`` (as ``T.ToSparseTensor()`` makes it without
    torch_sparse: a ``torch.sparse_csr`` tensor, rows the destinations)."""

    def __init__(self):
        super().__init__()
        gnn = pytest.importorskip("torch_geometric.nn")
        self.c1 = gnn.GCNConv(6, 8)
        self.c2 = gnn.GATConv(8, 4, heads=2)
        self.c3 = gnn.SAGEConv(8, 3)

    def forward(self, x, adj_t):
        return self.c3(torch.relu(self.c2(torch.relu(self.c1(x, adj_t)), adj_t)), adj_t)


def _adjacency(seed: int = 0) -> tuple[torch.Tensor, sc.Graph, torch.Tensor, torch.Tensor]:
    """PyG's adj_t of a graph without self-loops (repeated edges once, as adj_t holds them),
    the same graph as a sarcompile Graph, features and loss weights."""
    T = pytest.importorskip("torch_geometric.transforms")
    from torch_geometric.data import Data

    gen = torch.Generator().manual_seed(seed)
    edges = torch.randint(0, N, (2, 70), generator=gen)
    edges = torch.unique(edges[:, edges[0] != edges[1]], dim=1)
    adj_t = T.ToSparseTensor()(Data(edge_index=edges, num_nodes=N)).adj_t.to(DT)
    return (adj_t, sc.Graph.from_edges(edges[0], edges[1], N), torch.randn(N, 6, generator=gen, dtype=DT),
            torch.randn(N, 3, generator=gen, dtype=DT))


def _adj_worker(rank: int, world_size: int, payload: dict) -> dict:
    part = payload["part"]
    shard = ShardGraph.from_part(part, rank, world_size, N, payload["num_edges"])
    torch.manual_seed(4)
    model = AdjNet().double()
    result = _step(model, sc.distribute(model), lambda m, x: m(x, shard), part.node_data["x"], part.node_data["w"],
                   True)
    return {**result, "ids": part.global_ids}


def test_a_sparse_adjacency_is_exact_against_pyg_on_one_machine_and_two_workers(pool):
    adj_t, g, x, w = _adjacency()
    torch.manual_seed(4)
    model = AdjNet().double()
    want = _step(model, model, lambda m, x: m(x, adj_t), x, w, False)
    model.zero_grad()
    got = _step(model, sc.distribute(model), lambda m, x: m(x, adj_t), x, w, False)
    for key in ("out", "x_grad"):
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=TOL)
    parts = split_graph(g, torch.arange(N) % 2, 2, {"x": x, "w": w})
    results = pool(2).run(_adj_worker, [{"part": p, "num_edges": g.num_edges} for p in parts])
    for key in ("out", "x_grad"):
        full = torch.zeros_like(want[key])
        for r in results:
            full[r["ids"]] = r[key]
        torch.testing.assert_close(full, want[key], rtol=0, atol=TOL, msg=key)
    for r in results:
        for k, grad in want["grads"].items():
            torch.testing.assert_close(r["grads"][k], grad, rtol=0, atol=TOL, msg=k)


# An adjacency with values or self-loops (a normalised adj_t): tests/frontends/test_pyg_adjacency.py.
