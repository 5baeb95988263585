"""DGL front-end: DGL's layers compile unchanged and compute what DGL computes.

Runs only where DGL is installed (``scripts/dgl_env.sh`` makes that environment;
``scripts/test.sh`` runs this file there). Each layer: the compiled model on one machine
equals DGL eager (outputs, input and parameter gradients, float64) on random graphs with
isolated nodes, self-loops and multi-edges; a composite model on 1, 2 and 3 workers equals
the compiled model on one machine.
"""

from __future__ import annotations

import pytest

dgl = pytest.importorskip("dgl")

import dgl.nn as dglnn
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import graphs
from torch import nn

import sarcompile as sc
from sarcompile.graph.shard import ShardGraph, split_graph

TOL = 1e-9  # float64: the only differences are summation order
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))


class One(nn.Module):
    """A model holding one DGL layer (the compiled module must not be the layer itself:
    its forward would be traced, and DGL's forward calls DGLGraph methods)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, g, x, edge_weight=None):
        return self.layer(g, x, edge_weight=edge_weight)


class OneWeighted(One):
    """GraphConv with a weight passed to forward."""

    def forward(self, g, x, weight=None, edge_weight=None):
        return self.layer(g, x, weight=weight, edge_weight=edge_weight)


def _randomize(model: nn.Module, seed: int) -> nn.Module:
    """float64, every parameter drawn at random (DGL starts biases at zero)."""
    gen = torch.Generator().manual_seed(seed)
    model.double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5)
    return model


def _graph(draw_result, self_loops: bool = False):
    src, dst, n, seed = draw_result
    g = dgl.graph((src, dst), num_nodes=n)
    if self_loops:
        g = dgl.add_self_loop(g)
    return g, seed


def _run(model: nn.Module, graph, x: torch.Tensor, w: torch.Tensor, **kwargs):
    """Output, input gradient and parameter gradients of ``sum(model(graph, x) * w)``."""
    model.zero_grad()
    x = x.clone().requires_grad_(True)
    out = model(graph, x, **kwargs)
    (out * w).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return out.detach(), x.grad, grads


def assert_matches_dgl(layer: nn.Module, g, seed: int, in_dim: int, wrap=One, **kwargs) -> None:
    model = _randomize(wrap(layer) if wrap else layer, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(g.num_nodes(), in_dim, generator=gen, dtype=torch.float64)
    want = _run(model, g, x, 1.0, **kwargs)  # DGL eager on the DGLGraph
    w = torch.randn(want[0].shape, generator=gen, dtype=torch.float64)
    want = _run(model, g, x, w, **kwargs)
    compiled = sc.distribute(model)
    got = _run(compiled, sc.Graph.from_dgl(g), x, w, **kwargs)
    scale = max(1.0, float(want[0].abs().max()) if want[0].numel() else 1.0)
    torch.testing.assert_close(got[0], want[0], atol=TOL * scale, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=TOL * scale, rtol=0)
    assert got[2].keys() == want[2].keys()
    for k in want[2]:
        torch.testing.assert_close(got[2][k], want[2][k], atol=TOL * scale, rtol=0, msg=k)
    # The compiled module shares the DGL layer's parameters under DGL's keys.
    assert list(compiled.state_dict()) == list(model.state_dict())
    assert all(a is b for a, b in zip(compiled.parameters(), model.parameters()))


# -- graphs -----------------------------------------------------------------------------------------
def test_from_dgl_keeps_edge_order_and_nodes():
    g = dgl.graph((torch.tensor([2, 0, 1, 1, 3]), torch.tensor([0, 1, 1, 2, 3])), num_nodes=6)
    sg = sc.Graph.from_dgl(g)
    assert sg.num_nodes == 6 and sg.num_edges == 5
    assert sg.src.tolist() == [2, 0, 1, 1, 3] and sg.dst.tolist() == [0, 1, 1, 2, 3]
    assert sg.in_degrees().tolist() == g.in_degrees().tolist()


def test_from_dgl_refuses_heterographs_and_blocks():
    hg = dgl.heterograph({("user", "follows", "user"): ([0], [1]), ("user", "buys", "item"): ([0], [0])})
    with pytest.raises(sc.GraphError, match="to_homogeneous"):
        sc.Graph.from_dgl(hg)
    block = dgl.to_block(dgl.graph(([0, 1], [1, 2])), torch.tensor([1, 2]))
    with pytest.raises(sc.GraphError, match="DGLBlock"):
        sc.Graph.from_dgl(block)
    with pytest.raises(sc.GraphError, match="DGLGraph"):
        sc.Graph.from_dgl(object())


def test_hetero_from_dgl_keeps_types_relations_and_edge_order():
    hg = dgl.heterograph(
        {("user", "follows", "user"): ([2, 0], [1, 1]), ("user", "buys", "item"): ([0, 1, 1], [3, 0, 0])},
        num_nodes_dict={"user": 3, "item": 5},
    )
    g = sc.HeteroGraph.from_dgl(hg)
    assert set(g.node_types) == {"user", "item"} and g.num_nodes("item") == 5
    buys = g[("user", "buys", "item")]
    assert buys.bipartite and buys.src.tolist() == [0, 1, 1] and buys.dst.tolist() == [3, 0, 0]
    assert buys.in_degrees().tolist() == hg.in_degrees(etype="buys").tolist()
    assert not g["follows"].bipartite and g["follows"].src.tolist() == [2, 0]
    with pytest.raises(sc.GraphError, match="dgl.DGLGraph"):
        sc.HeteroGraph.from_dgl(object())


# -- each layer against DGL eager -------------------------------------------------------------------
@given(data=st.data())
@SETTINGS
def test_sageconv_matches_dgl(data):
    g, seed = _graph(data.draw(graphs(max_nodes=20, max_edges=60)))
    aggr = data.draw(st.sampled_from(["mean", "gcn", "pool"]))
    in_dim, out_dim = data.draw(st.sampled_from([(5, 3), (3, 5)]))  # both of DGL's linear-map orders
    bias = data.draw(st.booleans())
    act = data.draw(st.sampled_from([None, torch.tanh]))
    assert_matches_dgl(dglnn.SAGEConv(in_dim, out_dim, aggr, bias=bias, activation=act), g, seed, in_dim)


@given(data=st.data())
@SETTINGS
def test_sageconv_edge_weight_matches_dgl(data):
    g, seed = _graph(data.draw(graphs(max_nodes=20, max_edges=60)))
    aggr = data.draw(st.sampled_from(["mean", "gcn"]))
    ew = torch.rand(g.num_edges(), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    assert_matches_dgl(dglnn.SAGEConv(4, 3, aggr), g, seed, 4, edge_weight=ew)


@given(data=st.data())
@SETTINGS
def test_graphconv_matches_dgl(data):
    g, seed = _graph(data.draw(graphs(max_nodes=20, max_edges=60)))
    norm = data.draw(st.sampled_from(["both", "right", "left", "none"]))
    in_dim, out_dim = data.draw(st.sampled_from([(5, 3), (3, 5)]))
    layer = dglnn.GraphConv(
        in_dim, out_dim, norm=norm, bias=data.draw(st.booleans()), allow_zero_in_degree=True,
        activation=data.draw(st.sampled_from([None, torch.tanh, nn.ELU()])),
    )
    assert_matches_dgl(layer, g, seed, in_dim, wrap=data.draw(st.sampled_from([One, None])))  # None: the bare layer


@given(data=st.data())
@SETTINGS
def test_graphconv_external_weight_and_edge_weight_match_dgl(data):
    g, seed = _graph(data.draw(graphs(max_nodes=20, max_edges=60)), self_loops=True)
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    ew = torch.rand(g.num_edges(), generator=gen, dtype=torch.float64) + 0.1
    layer = dglnn.GraphConv(4, 3, norm="right", weight=False)
    assert_matches_dgl(layer, g, seed, 4, wrap=OneWeighted, weight=weight, edge_weight=ew)


@given(data=st.data())
@SETTINGS
def test_gatconv_matches_dgl(data):
    g, seed = _graph(data.draw(graphs(max_nodes=20, max_edges=60)))
    heads = data.draw(st.integers(1, 3))
    residual = data.draw(st.sampled_from([False, "linear", "identity"]))
    in_dim = 2 * heads if residual == "identity" else 5  # in == heads * out: DGL's residual is Identity
    layer = dglnn.GATConv(
        in_dim, 2, num_heads=heads, residual=bool(residual), bias=data.draw(st.booleans()),
        negative_slope=data.draw(st.sampled_from([0.2, 0.05])), allow_zero_in_degree=True,
        activation=data.draw(st.sampled_from([None, F.elu])),
    )
    assert_matches_dgl(layer, g, seed, in_dim)


def test_zero_in_degree_is_refused_as_dgl_does():
    g = dgl.graph((torch.tensor([0, 1]), torch.tensor([1, 2])), num_nodes=4)
    for layer in (dglnn.GraphConv(3, 2), dglnn.GATConv(3, 2, num_heads=2)):
        model = One(layer).double()
        x = torch.randn(4, 3, dtype=torch.float64)
        with pytest.raises(dgl.DGLError):
            model(g, x)
        with pytest.raises(sc.GraphError, match="allow_zero_in_degree"):
            sc.distribute(model)(sc.Graph.from_dgl(g), x)
        g2 = dgl.add_self_loop(g)  # with a self-loop on every node both run
        assert_matches_dgl(layer, g2, 0, 3)


def test_unsupported_options_are_refused_by_name():
    g = sc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    x = torch.randn(2, 3)
    cases = [
        (dglnn.SAGEConv(3, 2, "lstm"), "aggregator_type='lstm'"),
        (dglnn.GATConv((3, 3), 2, num_heads=1), r"pair of input sizes takes a \(source, destination\) pair"),
    ]
    for layer, message in cases:
        with pytest.raises(sc.CompileError, match=message):
            sc.distribute(One(layer))(g, x)


def test_attention_dropout_is_counter_based():
    """attn_drop uses sarcompile's counter-based mask: masks change from step to step, eval
    mode is DGL's (no dropout), and the DGL module's state_dict gains nothing."""
    torch.manual_seed(0)
    g = dgl.add_self_loop(dgl.graph((torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0]))))
    model = One(dglnn.GATConv(3, 4, num_heads=2, attn_drop=0.5)).double()
    keys = list(model.state_dict())
    compiled = sc.distribute(model)
    x = torch.randn(4, 3, dtype=torch.float64)
    a, b = compiled(sc.Graph.from_dgl(g), x), compiled(sc.Graph.from_dgl(g), x)
    assert not torch.equal(a, b)
    assert list(compiled.state_dict()) == keys
    model.eval()
    torch.testing.assert_close(compiled(sc.Graph.from_dgl(g), x), model(g, x), atol=TOL, rtol=0)


# -- a composite model on 1 and 2 workers ------------------------------------------------------------
class DGLNet(nn.Module):
    """Every supported layer kind: SAGE mean/gcn/pool, GraphConv both (out-degrees cross
    workers) and right, GAT with a residual and attention dropout; feature dropout on SAGE
    and GAT."""

    def __init__(self, f_in: int = 6):
        super().__init__()
        self.sage = dglnn.SAGEConv(f_in, 8, "mean", feat_drop=0.2)
        self.sage_gcn = dglnn.SAGEConv(8, 8, "gcn")
        self.sage_pool = dglnn.SAGEConv(8, 6, "pool", activation=torch.tanh)
        self.conv = dglnn.GraphConv(6, 8, norm="both", allow_zero_in_degree=True)
        self.gat = dglnn.GATConv(8, 4, num_heads=2, feat_drop=0.1, attn_drop=0.3, residual=True,
                                 allow_zero_in_degree=True)
        self.out = dglnn.GraphConv(8, 3, norm="right", allow_zero_in_degree=True)

    def forward(self, g, x):
        h = F.relu(self.sage(g, x))
        h = h + self.sage_gcn(g, h)
        h = F.elu(self.conv(g, self.sage_pool(g, h)))
        return self.out(g, self.gat(g, h).flatten(1))


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return _randomize(DGLNet(), seed)


def _train_step(model: nn.Module, graph, x: torch.Tensor, w: torch.Tensor, seed: int):
    torch.manual_seed(seed)  # the attention-dropout stream's seed is drawn at compile time
    compiled = sc.distribute(model)
    x = x.clone().requires_grad_(True)
    out = compiled(graph, x)
    (out * w).sum().backward()
    return out.detach(), x.grad, {k: p.grad.clone() for k, p in model.named_parameters()}


def _worker(rank: int, world_size: int, payload: dict):
    import dgl  # noqa: F401  (the front-end loads when the program imports DGL)

    part = payload["part"]
    shard = ShardGraph.from_part(part, rank, world_size, payload["num_nodes"], payload["num_edges"])
    model = _net(payload["seed"])
    out, x_grad, _ = _train_step(model, shard, part.node_data["x"], part.node_data["w"], payload["seed"])
    sc.sync_gradients(model)
    return out, x_grad, {k: p.grad.clone() for k, p in model.named_parameters()}


def test_composite_model_matches_dgl_in_eval_mode():
    gen = torch.Generator().manual_seed(3)
    src, dst = torch.randint(0, 30, (90,), generator=gen), torch.randint(0, 28, (90,), generator=gen)
    g = dgl.graph((src, dst), num_nodes=32)  # nodes 28..31 get no in-edge
    assert_matches_dgl(_net(3).eval(), g, 3, 6, wrap=None)


@given(data=st.data())
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_composite_model_workers_match_one_machine(pool, data):
    src, dst, n, seed = data.draw(graphs(max_nodes=24, max_edges=80))
    seed %= 2**16
    world_size = data.draw(st.sampled_from([1, 2, 3]))
    if data.draw(st.booleans()):
        assignment = torch.tensor(data.draw(st.lists(st.integers(0, world_size - 1), min_size=n, max_size=n)))
    else:  # every node on one worker: the other has none
        assignment = torch.full((n,), data.draw(st.integers(0, world_size - 1)))
    g = sc.Graph.from_dgl(dgl.graph((src, dst), num_nodes=n))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=gen, dtype=torch.float64)
    w = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    want = _train_step(_net(seed), g, x, w, seed)

    parts = split_graph(g, assignment, world_size, {"x": x, "w": w})
    payloads = [{"part": p, "seed": seed, "num_nodes": n, "num_edges": g.num_edges} for p in parts]
    results = pool(world_size).run(_worker, payloads)
    scale = max(1.0, float(want[0].abs().max()) if want[0].numel() else 1.0)
    for i, what in enumerate(("out", "x_grad")):
        full = torch.zeros_like(want[i])
        for p, r in zip(parts, results):
            full[p.global_ids] = r[i]
        torch.testing.assert_close(full, want[i], atol=TOL * scale, rtol=0, msg=what)
    for r in results:
        for k, grad in want[2].items():
            torch.testing.assert_close(r[2][k], grad, atol=TOL * scale, rtol=0, msg=k)


class _Traced(nn.Module):
    """``forward(g, x) = body(g, x)`` written as DGL user code."""

    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, g, x):
        return self.body(g, x)


def _with(g, field: str, value: torch.Tensor):
    g.ndata[field] = value
    return g


def test_what_the_traced_graph_cannot_express_is_refused_clearly():
    g = sc.Graph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
    x = torch.randn(3, 2, dtype=torch.float64)
    cases = [
        (lambda g, x: g.add_self_loop().in_degrees().to(x).unsqueeze(-1) * x, "remove_self_loop"),
        (lambda g, x: dgl.nn.functional.edge_softmax(g, torch.ones(g.num_edges(), 1), norm_by="src").sum(-1).sum() * x,
         "norm_by='src'"),
        (lambda g, x: nn.Linear(2, 2).double()(x), "make it in __init__"),
        (lambda g, x: dgl.reverse(g).in_degrees().to(x).unsqueeze(-1) * x,
         r"dgl.reverse\(g\) in forward builds another graph .* before Graph.from_dgl and sc.partition"),
        (lambda g, x: x + dgl.mean_nodes(_with(g, "h", x), "h"),
         r"dgl.mean_nodes\(g\) in forward combines the rows of every node .* sc.global_sum"),
    ]
    for body, message in cases:
        with pytest.raises(sc.CompileError, match=message):
            sc.distribute(_Traced(body))(g, x)


def test_the_in_degree_check_of_dgl_layers_runs_when_the_program_runs():
    """EGATConv checks ``(g.in_degrees() == 0).any()`` always: the compiled program makes the
    same check on the real graph and raises where DGL raises."""
    layer = dglnn.EGATConv(3, 2, 3, 2, num_heads=1).double()
    model = _Traced(lambda g, x: layer(g, x, torch.ones(g.num_edges(), 2, dtype=x.dtype))[0])
    model.layer = layer
    g = dgl.graph((torch.tensor([0, 1]), torch.tensor([1, 2])), num_nodes=3)  # node 0 has no in-edge
    x = torch.randn(3, 3, dtype=torch.float64)
    with pytest.raises(dgl.DGLError):
        model(g, x)
    compiled = sc.distribute(model)
    with pytest.raises(sc.GraphError, match="no in-edge"):
        compiled(sc.Graph.from_dgl(g), x)
    g = dgl.add_self_loop(g)
    torch.set_default_dtype(torch.float64)
    try:
        torch.testing.assert_close(compiled(sc.Graph.from_dgl(g), x), model(g, x), rtol=0, atol=TOL)
    finally:
        torch.set_default_dtype(torch.float32)
