"""DGL models that keep their graph (``self.g = g``, DGL's APPNP, GCN and TAGCN examples,
called as ``model(features)``) or take a list of blocks (``model(blocks, x)``, trained on
the full graph with every block the graph): exact against eager DGL on one machine, where
the DGL graph kept is converted, and on 2 workers, where the model keeps the worker's
shard (``model.g = part.graph``). Runs in the DGL environment (``scripts/dgl_env.sh``)."""

from __future__ import annotations

import contextlib

import pytest

dgl = pytest.importorskip("dgl")

import dgl.nn as dglnn
import torch
import torch.nn.functional as F
from torch import nn

import sarcompile as sc
from sarcompile.graph.shard import ShardGraph, split_graph

TOL = 1e-9
N = 19


@contextlib.contextmanager
def float64():
    """DGL's APPNPConv makes its edge weights with torch.ones: float64 where the model is."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


class APPNP(nn.Module):
    """DGL's APPNP example: the graph given to the constructor and kept."""

    def __init__(self, g):
        super().__init__()
        self.g = g
        self.layers = nn.ModuleList([nn.Linear(6, 8), nn.Linear(8, 3)])
        self.propagate = dglnn.APPNPConv(k=3, alpha=0.1)

    def forward(self, features):
        h = self.layers[1](F.relu(self.layers[0](features)))
        return self.propagate(self.g, h)


class GCN(nn.Module):
    """DGL's GCN example of its 0.x days: the graph kept, layers given it in forward."""

    def __init__(self, g):
        super().__init__()
        self.g = g
        self.layers = nn.ModuleList([dglnn.GraphConv(6, 8, activation=F.relu), dglnn.GraphConv(8, 3)])

    def forward(self, features):
        h = features
        for layer in self.layers:
            h = layer(self.g, h)
        return h


class Blocks(nn.Module):
    """DGL's minibatch SAGE, called full-graph: ``model([g, g], x)``."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([dglnn.SAGEConv(6, 8, "mean"), dglnn.SAGEConv(8, 3, "gcn")])

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = F.relu(h)
        return h


def _data(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    g = dgl.graph((torch.randint(0, N, (70,), generator=gen), torch.randint(0, N, (70,), generator=gen)), num_nodes=N)
    g = dgl.add_self_loop(dgl.remove_self_loop(g))  # (GraphConv refuses nodes without in-edges)
    return g, torch.randn(N, 6, generator=gen, dtype=torch.float64), torch.randn(N, 3, generator=gen, dtype=torch.float64)


def _model(name: str, g) -> nn.Module:
    torch.manual_seed(2)
    return (Blocks() if name == "blocks" else {"appnp": APPNP, "gcn": GCN}[name](g)).double()


def _step(model: nn.Module, run: nn.Module, name: str, g, x: torch.Tensor, w: torch.Tensor, shard: bool) -> dict:
    x = x.clone().requires_grad_(True)
    out = run([g, g], x) if name == "blocks" else run(x)
    (out * w).sum().backward()
    return {"out": out.detach(), "x_grad": x.grad,
            "grads": {k: sc.global_sum(p.grad) if shard else p.grad for k, p in model.named_parameters()}}


NAMES = ["appnp", "gcn", "blocks"]


@pytest.mark.parametrize("name", NAMES)
def test_a_kept_dgl_graph_or_a_list_of_blocks_matches_dgl(name):
    g, x, w = _data()
    with float64():
        model = _model(name, g)
        want = _step(model, model, name, g, x, w, False)
        model.zero_grad()
        compiled = sc.distribute(model)
        got = _step(model, compiled, name, sc.Graph.from_dgl(g), x, w, False)
    assert any("spmm" in code or "message_passing" in code for _, code in compiled.program(False).stages[-1:])
    for key in ("out", "x_grad"):
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=TOL)
    for k, grad in want["grads"].items():
        torch.testing.assert_close(got["grads"][k], grad, rtol=0, atol=TOL, msg=k)


def _worker(rank: int, world_size: int, payload: dict) -> dict:
    part = payload["part"]
    shard = ShardGraph.from_part(part, rank, world_size, N, payload["num_edges"])
    results = {}
    with float64():
        for name in NAMES:
            model = _model(name, payload["graph"])  # built as on one machine, with the DGL graph
            compiled = sc.distribute(model)
            if name != "blocks":
                compiled.g = shard  # the worker's shard in its place
            results[name] = _step(model, compiled, name, shard, part.node_data["x"], part.node_data["w"], True)
    return {"results": results, "ids": part.global_ids}


def test_a_kept_dgl_graph_or_a_list_of_blocks_is_exact_on_two_workers(pool):
    g, x, w = _data(1)
    whole = sc.Graph.from_dgl(g)
    parts = split_graph(whole, torch.arange(N) % 2, 2, {"x": x, "w": w})
    results = pool(2).run(_worker, [{"part": p, "graph": g, "num_edges": whole.num_edges} for p in parts])
    with float64():
        for name in NAMES:
            model = _model(name, g)
            want = _step(model, model, name, g, x, w, False)
            for key in ("out", "x_grad"):
                full = torch.zeros_like(want[key])
                for r in results:
                    full[r["ids"]] = r["results"][name][key]
                torch.testing.assert_close(full, want[key], rtol=0, atol=TOL, msg=f"{name} {key}")
            for r in results:
                for k, grad in want["grads"].items():
                    torch.testing.assert_close(r["results"][name]["grads"][k], grad, rtol=0, atol=TOL, msg=k)


def test_dgl_graphs_given_as_arguments_are_converted():
    g, x, w = _data(2)
    model = _model("blocks", g)
    want = _step(model, model, "blocks", g, x, w, False)
    model.zero_grad()
    got = _step(model, sc.distribute(model), "blocks", g, x, w, False)  # the DGL graphs themselves
    for key in ("out", "x_grad"):
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=TOL)


def test_a_sampled_block_is_refused_saying_to_give_the_graph():
    g, x, _ = _data()
    block = dgl.to_block(g, torch.arange(N))
    with pytest.raises(sc.CompileError, match=r"a DGL block \(a sampled minibatch's, dgl.to_block\) .* Give the graph "
                                              r"itself \(a list \[g, g\]"):
        sc.distribute(_model("blocks", g))([block, block], x)
