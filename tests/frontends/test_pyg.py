"""PyG models compile unchanged: the compiled model (one machine, and N workers) computes
what the eager PyG model computes with ``edge_index = stack([g.src, g.dst])``; what no
rule covers fails at compile time naming the layer."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as gnn
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch import nn

import sarcompile as sc
from pyg_models import DT, EdgeMLPConv, assert_close, check_distributed, dist_cases, make_model
from strategies import graphs

SETTINGS = settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))


class One(nn.Module):
    """One layer in a plain PyG model: ``forward(x, edge_index[, edge_weight])``."""

    def __init__(self, layer: nn.Module, weighted: bool = False):
        super().__init__()
        self.layer, self.weighted = layer, weighted

    def forward(self, x, edge_index, edge_weight):
        if isinstance(self.layer, gnn.BatchNorm):
            return self.layer(x)
        if self.weighted:
            return self.layer(x, edge_index, edge_weight)
        return self.layer(x, edge_index)


def mlp(d_in: int, d_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, 7), nn.ReLU(), nn.Linear(7, d_out))


class DoubledSAGE(gnn.SAGEConv):
    """A PyG layer subclassed with its own message: lowered as a general MessagePassing."""

    def message(self, x_j):
        return 2 * x_j


class Gated(gnn.MessagePassing):
    """Own message and update; ``x = (x, x)`` as PyG's layers write it."""

    def __init__(self, f: int):
        super().__init__(aggr="add")
        self.gate = nn.Linear(2 * f, f)

    def forward(self, x, edge_index):
        if isinstance(x, torch.Tensor):
            x = (x, x)
        return self.propagate(edge_index, x=x) + x[1]

    def message(self, x_j, x_i):
        return torch.sigmoid(self.gate(torch.cat([x_i, x_j], -1))) * x_j

    def update(self, inputs):
        return torch.tanh(inputs)


# (id, layer factory for 5 input features, called with a per-edge tensor: False, True (weights
# [E]) or a width (features [E, width]), eval mode)
LAYERS = [
    ("sage-mean", lambda: gnn.SAGEConv(5, 4), False, False),
    ("sage-sum-nobias", lambda: gnn.SAGEConv(5, 4, aggr="sum", bias=False), False, False),
    ("sage-max-noroot", lambda: gnn.SAGEConv(5, 4, aggr="max", root_weight=False), False, False),
    ("sage-project-normalize", lambda: gnn.SAGEConv(5, 4, project=True, normalize=True), False, False),
    ("gcn", lambda: gnn.GCNConv(5, 4), False, False),
    ("gcn-weighted-improved", lambda: gnn.GCNConv(5, 4, improved=True), True, False),
    ("gcn-weighted", lambda: gnn.GCNConv(5, 4, bias=False), True, False),
    ("gcn-no-loops", lambda: gnn.GCNConv(5, 4, add_self_loops=False), False, False),
    ("gcn-no-loops-weighted", lambda: gnn.GCNConv(5, 4, add_self_loops=False), True, False),
    ("gcn-no-normalize", lambda: gnn.GCNConv(5, 4, normalize=False), False, False),
    ("gcn-no-normalize-weighted", lambda: gnn.GCNConv(5, 4, normalize=False), True, False),
    ("gin", lambda: gnn.GINConv(mlp(5, 4)), False, False),
    ("gin-train-eps", lambda: gnn.GINConv(mlp(5, 4), eps=0.3, train_eps=True), False, False),
    ("gat", lambda: gnn.GATConv(5, 3, heads=2), False, False),
    ("gat-mean-residual-noloops", lambda: gnn.GATConv(5, 3, heads=3, concat=False, residual=True,
                                                       add_self_loops=False, negative_slope=0.1), False, False),
    ("gat-nobias-eval-dropout", lambda: gnn.GATConv(5, 4, bias=False, dropout=0.5), False, True),
    ("gatv2", lambda: gnn.GATv2Conv(5, 3, heads=2), False, False),
    ("gatv2-shared-mean-residual", lambda: gnn.GATv2Conv(5, 3, heads=2, concat=False, share_weights=True,
                                                         residual=True, negative_slope=0.3), False, False),
    ("gatv2-noloops-nobias-eval-dropout", lambda: gnn.GATv2Conv(5, 4, add_self_loops=False, bias=False,
                                                                 dropout=0.5), False, True),
    # edge features: the new self-loops' features as PyG fills them (fill_value)
    ("gat-edge-mean", lambda: gnn.GATConv(5, 3, heads=2, edge_dim=2), 2, False),
    ("gat-edge-max-eval-dropout", lambda: gnn.GATConv(5, 3, heads=2, edge_dim=2, fill_value="max", dropout=0.5),
     2, True),
    ("gat-edge-add-mean-heads", lambda: gnn.GATConv(5, 3, heads=3, concat=False, edge_dim=2, fill_value="add"),
     2, False),
    ("gat-edge-mul", lambda: gnn.GATConv(5, 3, edge_dim=2, fill_value="mul"), 2, False),
    ("gat-edge-noloops", lambda: gnn.GATConv(5, 3, heads=2, edge_dim=2, add_self_loops=False), 2, False),
    ("gat-edge-1d-float-fill", lambda: gnn.GATConv(5, 3, heads=2, edge_dim=1, fill_value=0.5), True, False),
    ("gat-no-edge-dim-ignores-edge-attr", lambda: gnn.GATConv(5, 3, heads=2), 2, False),
    ("gatv2-edge-mean", lambda: gnn.GATv2Conv(5, 3, heads=2, edge_dim=2), 2, False),
    ("gatv2-edge-min-eval-dropout", lambda: gnn.GATv2Conv(5, 3, heads=2, edge_dim=2, fill_value="min",
                                                          dropout=0.5), 2, True),
    ("gatv2-edge-tensor-fill", lambda: gnn.GATv2Conv(5, 3, heads=2, edge_dim=2,
                                                     fill_value=torch.tensor([0.5, -1.0])), 2, False),
    ("gatv2-edge-noloops-shared", lambda: gnn.GATv2Conv(5, 3, edge_dim=2, add_self_loops=False,
                                                        share_weights=True), 2, False),
    ("graphconv-sum", lambda: gnn.GraphConv(5, 4), False, False),
    ("graphconv-sum-weighted", lambda: gnn.GraphConv(5, 4), True, False),
    ("graphconv-mean-weighted", lambda: gnn.GraphConv(5, 4, aggr="mean", bias=False), True, False),
    ("graphconv-max", lambda: gnn.GraphConv(5, 4, aggr="max"), False, False),
    ("graphconv-min", lambda: gnn.GraphConv(5, 4, aggr="min"), False, False),
    ("sage-min", lambda: gnn.SAGEConv(5, 4, aggr="min"), False, False),
    ("batchnorm", lambda: gnn.BatchNorm(5), False, False),
    ("batchnorm-no-affine-cumulative", lambda: gnn.BatchNorm(5, affine=False, momentum=None), False, False),
    ("batchnorm-eval", lambda: gnn.BatchNorm(5), False, True),
    ("mp-own-max", lambda: EdgeMLPConv(5, 3, 4, "max"), 3, False),
    ("mp-own-add", lambda: EdgeMLPConv(5, 3, 4, "add"), 3, False),
    ("mp-own-mean", lambda: EdgeMLPConv(5, 3, 4, "mean"), 3, False),
    ("mp-own-update", lambda: Gated(5), False, False),
    ("mp-sage-subclass", lambda: DoubledSAGE(5, 4, aggr="max"), False, False),
    ("mp-edgeconv", lambda: gnn.EdgeConv(mlp(10, 4), aggr="max"), False, False),
    ("mp-gine", lambda: gnn.GINEConv(mlp(5, 4)), 5, False),
    ("mp-gine-edge-dim", lambda: gnn.GINEConv(mlp(5, 4), edge_dim=2, train_eps=True), 2, False),
]


def run(model, x, graph_arg, edge_weight, weight):
    """Output and the gradients of sum(out * weight) w.r.t. x, the edge weights and
    every parameter."""
    x = x.clone().requires_grad_(True)
    ew = None if edge_weight is None else edge_weight.clone().requires_grad_(True)
    out = model(x, graph_arg, ew)
    (out * weight).sum().backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    return out.detach(), x.grad, None if ew is None else ew.grad, grads


@pytest.mark.parametrize("factory,weighted,eval_mode", [c[1:] for c in LAYERS], ids=[c[0] for c in LAYERS])
@given(graph=graphs(max_nodes=20, max_edges=50), data=st.data())
@SETTINGS
def test_layer_matches_pyg(factory, weighted, eval_mode, graph, data):
    src, dst, n, seed = graph
    torch.manual_seed(seed)
    eager = One(factory(), weighted).to(DT)
    assume(n > 1 or eval_mode or not isinstance(eager.layer, gnn.BatchNorm))  # torch refuses 1-row batches
    if isinstance(eager.layer, gnn.BatchNorm):  # running statistics that are not the defaults
        eager.layer.module.running_mean.uniform_(-1, 1)
        eager.layer.module.running_var.uniform_(0.5, 2)
    eager.train(not eval_mode)
    compiled_model = copy.deepcopy(eager)
    compiled = sc.distribute(compiled_model)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=gen, dtype=DT)
    weight = torch.randn(n, 1, generator=gen, dtype=DT)
    edge_weight = None
    if weighted is not True and weighted:  # edge features
        edge_weight = torch.randn(src.numel(), weighted, generator=gen, dtype=DT)
    elif weighted:  # positive, some zero (a node whose in-weights are all 0 has degree 0)
        edge_weight = torch.rand(src.numel(), generator=gen, dtype=DT) * torch.randint(0, 4, (src.numel(),), generator=gen)
    g = sc.Graph.from_edges(src, dst, n)

    want = run(eager, x, torch.stack([src, dst]), edge_weight, weight)
    got = run(compiled, x, g, edge_weight, weight)
    for what, a, b in zip(("output", "x grad", "edge weight grad"), got[:3], want[:3]):
        if b is None:  # (on a graph without edges, an empty gradient says the same as none)
            assert a is None or (what == "edge weight grad" and a.numel() == 0), what
        else:
            assert_close(a, b, what)
    assert got[3].keys() == want[3].keys()
    for k, gw in want[3].items():
        if gw is None:  # (PyG skips a layer's edge path on a graph without edges; we give it zeros)
            assert got[3][k] is None or (src.numel() == 0 and not got[3][k].any()), k
        else:
            assert_close(got[3][k], gw, f"grad of {k}")
    for (k, b), (_, c) in zip(eager.named_buffers(), compiled_model.named_buffers()):
        assert_close(c, b, f"buffer {k}")  # running statistics updated as PyG updates them


def test_edge_path_on_a_graph_without_edges_gets_zero_gradients():
    """PyG's GATConv skips its edge path when there are no edges (its parameters get no
    gradient); ours gives them zeros, as a worker whose part has no edges must for the
    all-reduce. The same derivative, and Adam's first step with a zero gradient moves nothing."""
    layer = gnn.GATConv(5, 3, heads=2, edge_dim=2, add_self_loops=False).to(DT)
    compiled = sc.distribute(One(layer, 2))
    none = torch.empty(0, dtype=torch.long)
    out = compiled(torch.randn(3, 5, dtype=DT), sc.Graph.from_edges(none, none, 3), torch.empty(0, 2, dtype=DT))
    out.sum().backward()
    assert_close(out, layer.bias.expand(3, -1).detach(), "output")
    assert torch.equal(layer.att_edge.grad, torch.zeros_like(layer.att_edge))
    assert torch.equal(layer.lin_edge.weight.grad, torch.zeros_like(layer.lin_edge.weight))


def test_compiled_model_shares_the_pyg_parameters():
    model = make_model("attention_mix", 0)
    compiled = sc.distribute(model)
    g = sc.Graph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
    compiled(torch.randn(3, 6, dtype=DT), g).sum().backward()
    assert list(compiled.state_dict()) == list(model.state_dict())
    assert all(p.grad is not None for p in model.parameters())
    lowered = compiled.program(False).module
    ours = {id(p) for p in model.parameters()}
    assert {id(p) for p in lowered.parameters()} <= ours  # referenced, never copied


def test_sarcompile_does_not_import_torch_geometric():
    code = "import sys, sarcompile; assert 'torch_geometric' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- N workers ---------------------------------------------------------------------------
DIST_SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))


@given(case=dist_cases(["sage_bn_gcn", "attention_mix", "weighted", "edge_features"]))
@DIST_SETTINGS
def test_workers_match_eager_pyg(pool, case):
    check_distributed(pool, case)


@pytest.mark.parametrize("world_size,mode", [(1, "sar"), (2, "stash"), (3, "sar")])
def test_edge_attention_workers_match_eager_pyg(pool, world_size, mode):
    """GATConv / GATv2Conv with edge features (fill 'mean', 'max', a float; no self-loops;
    dropout in eval) on a graph with self-loops, multi-edges and isolated nodes: the
    self-loop features each worker fills from its own nodes' in-edges are PyG's."""
    gen = torch.Generator().manual_seed(world_size)
    n = 17
    src, dst = torch.randint(0, n - 2, (60,), generator=gen), torch.randint(0, n - 2, (60,), generator=gen)
    src, dst = torch.cat([src, torch.tensor([3, 3, 5, 0, 0])]), torch.cat([dst, torch.tensor([3, 3, 5, 1, 1])])
    assignment = torch.randint(0, world_size, (n,), generator=gen)
    check_distributed(pool, (world_size, "edge_attention", mode, src, dst, n, 5 + world_size, assignment))


@given(case=dist_cases(["edge_attention"]))
@settings(DIST_SETTINGS, max_examples=4)
def test_edge_attention_on_random_graphs_and_splits(pool, case):
    check_distributed(pool, case)


@given(case=dist_cases(["drop_attention"]))
@settings(DIST_SETTINGS, max_examples=4)
def test_attention_dropout_same_on_any_number_of_workers(pool, case):
    check_distributed(pool, case, oracle="compiled")


@pytest.mark.parametrize("world_size", [2, 3])
def test_dropout_everywhere_trains_on_workers_as_the_compiled_model_on_one_machine(pool, world_size):
    """F.dropout, nn.Dropout, dropout_edge, attention dropout and an MLP's own dropout."""
    gen = torch.Generator().manual_seed(world_size)
    n = 19
    src, dst = torch.randint(0, n, (70,), generator=gen), torch.randint(0, n, (70,), generator=gen)
    assignment = torch.randint(0, world_size, (n,), generator=gen)
    check_distributed(pool, (world_size, "drop_everywhere", "sar", src, dst, n, 11, assignment), oracle="compiled")


@pytest.mark.parametrize("world_size,mode", [(2, "sar"), (3, "stash")])
def test_masked_assignments_match_eager_pyg_on_workers(pool, world_size, mode):
    """PyG's tutorial GCNConv (``deg_inv_sqrt[deg_inv_sqrt == float('inf')] = 0``), with and
    without self-loops, and the other masked assignments sarcompile rewrites, on a graph
    whose last nodes have no edges."""
    gen = torch.Generator().manual_seed(world_size)
    n = 19
    src, dst = torch.randint(0, n - 3, (60,), generator=gen), torch.randint(0, n - 3, (60,), generator=gen)
    assignment = torch.randint(0, world_size, (n,), generator=gen)
    check_distributed(pool, (world_size, "masked_assignments", mode, src, dst, n, 3, assignment))


# --- what is refused, and how ---------------------------------------------------------
class Two(nn.Module):
    def __init__(self, second: nn.Module):
        super().__init__()
        self.conv1 = gnn.SAGEConv(4, 4)
        self.conv2 = second

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index), edge_index)


def compile_error(second: nn.Module) -> str:
    g = sc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    with pytest.raises(sc.CompileError) as e:
        sc.distribute(Two(second))(torch.randn(2, 4), g)
    return str(e.value)


@pytest.mark.parametrize("layer,words", [
    # picks nodes by degree, in PyG's code: the line named is the model's calling it
    (lambda: gnn.MFConv(4, 4), ["'conv2'", "(MFConv)", "`return self.conv2(self.conv1(x, edge_index)", "nonzero"]),
    (lambda: gnn.SAGEConv(4, 4, flow="target_to_source"), ["'conv2'", "SAGEConv", "flow='target_to_source'"]),
    (lambda: gnn.GATConv(4, 4, edge_dim=3), ["GATConv(edge_dim=3) was called without edge_attr", "pass edge_attr"]),
    (lambda: gnn.GATConv(4, 4, edge_dim=3, fill_value="any"), ["'conv2'", "GATConv", "fill_value='any'", "'mean'"]),
    (lambda: gnn.GATv2Conv(4, 4, dropout=1.0), ["'conv2'", "GATv2Conv", "dropout=1.0"]),
    (lambda: gnn.GraphNorm(4), ["'conv2'", "GraphNorm", "normalises over the nodes", "BatchNorm"]),
    (lambda: gnn.BatchNorm(4, allow_single_element=True), ["'conv2'", "allow_single_element=True"]),
    (lambda: gnn.SAGEConv(-1, 4), ["'conv2'", "lazily initialised"]),
])
def test_unsupported_layers_and_options_name_the_layer(layer, words):
    message = compile_error(layer())
    for word in words:
        assert word in message, message


def test_subclass_that_overrides_aggregate_gets_the_general_lowering():
    class Doubled(gnn.SAGEConv):
        def aggregate(self, inputs, index, ptr=None, dim_size=None):
            return 2 * super().aggregate(inputs, index, ptr, dim_size)

    torch.manual_seed(0)
    model = Two(Doubled(4, 4)).double()
    g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 0, 0, 1]), 3)
    x = torch.randn(3, 4, dtype=torch.float64)
    want = model(x, torch.stack([g.src, g.dst]))
    torch.testing.assert_close(sc.distribute(copy.deepcopy(model))(x, g), want, rtol=1e-12, atol=1e-12)


def test_unsupported_call_arguments_are_refused():
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.gat = gnn.GATConv(4, 4)

        def forward(self, x, edge_index):
            return self.gat(x, edge_index, return_attention_weights=True)[0]

    class WeightedMax(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = gnn.GraphConv(4, 4, aggr="max")

        def forward(self, x, edge_index, edge_weight):
            return self.conv(x, edge_index, edge_weight)

    class EdgeAttr(nn.Module):
        def __init__(self):
            super().__init__()
            self.gat = gnn.GATv2Conv(4, 4)

        def forward(self, x, edge_index, edge_attr):
            return self.gat(x, edge_index, edge_attr)  # PyG fails on it too: there is no lin_edge

    g = sc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    with pytest.raises(sc.CompileError, match=r"GATv2Conv \(without edge_dim\) was called with edge_attr"):
        sc.distribute(EdgeAttr())(torch.randn(2, 4), g, torch.randn(2, 3))
    with pytest.raises(sc.CompileError, match="GATConv was called with return_attention_weights"):
        sc.distribute(Attention())(torch.randn(2, 4), g)
    with pytest.raises(sc.CompileError, match="GraphConv.aggr='max'. with edge_weight"):
        sc.distribute(WeightedMax())(torch.randn(2, 4), g, torch.ones(2))


def test_pyg_linear_and_sequential_trace():
    model = gnn.Sequential("x, edge_index", [
        (gnn.Linear(4, 6), "x -> x"),
        nn.ReLU(),
        (gnn.GCNConv(6, 3), "x, edge_index -> h"),
        (lambda x, h: torch.cat([x, F.relu(h)], -1), "x, h -> x"),
        (gnn.Linear(9, 2), "x -> x"),
    ]).double()
    src, dst = torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 2])
    x = torch.randn(3, 4, dtype=DT)
    want = model(x, torch.stack([src, dst]))
    got = sc.distribute(model)(x, sc.Graph.from_edges(src, dst, 3))
    assert_close(got, want, "output")


def test_a_bare_pyg_layer_compiles():
    layer = gnn.GATv2Conv(4, 3, heads=2).double()
    src, dst = torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 2])
    x = torch.randn(3, 4, dtype=DT)
    want = layer(x, torch.stack([src, dst]))
    assert_close(sc.distribute(layer)(x, sc.Graph.from_edges(src, dst, 3)), want, "output")


def test_plan_of_a_pyg_model():
    """plan() finds the graph in PyG's argument order and shows every lowered layer."""

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.sage = gnn.SAGEConv(8, 16)
            self.norm = gnn.BatchNorm(16)
            self.gat = gnn.GATConv(16, 4, heads=2)
            self.edge = gnn.EdgeConv(nn.Linear(16, 3))

        def forward(self, x, edge_index):
            h = torch.relu(self.norm(self.sage(x, edge_index)))
            return self.edge(self.gat(h, edge_index), edge_index)

    gen = torch.Generator().manual_seed(0)
    g = sc.Graph.from_edges(torch.randint(0, 60, (300,), generator=gen), torch.randint(0, 60, (300,), generator=gen), 60)
    plan = sc.distribute(Model()).plan(g, 2, x=torch.randn(1, 8))
    assert [(op.layer, op.op, op.strategy) for op in plan.ops] == [
        ("sage", "spmm(mean)", "direct"),
        ("norm", "batch_norm", "allreduce"),
        ("gat", "attention", "remat"),
        ("edge", "message_passing(max)", "remat"),
    ]
    assert all(e.peak_bytes > 0 for e in plan.memory_estimate())


@pytest.mark.parametrize("name", ["GraphSAGE", "GCN", "GAT", "GIN"])
def test_pyg_ready_made_models(name):
    """torch_geometric.nn.models: their forward branches on optional inputs being None,
    which are traced as constants when they are not given."""
    from torch_geometric.nn import models

    gen = torch.Generator().manual_seed(1)
    n = 30
    src, dst = torch.randint(0, n, (100,), generator=gen), torch.randint(0, n, (100,), generator=gen)
    torch.manual_seed(1)
    eager = getattr(models, name)(6, 8, num_layers=3, out_channels=3, norm="batch_norm").to(DT)
    compiled_model = copy.deepcopy(eager)
    x = torch.randn(n, 6, generator=gen, dtype=DT)
    weight = torch.randn(n, 3, generator=gen, dtype=DT)
    results = []
    for model, graph in ((eager, torch.stack([src, dst])), (sc.distribute(compiled_model), sc.Graph.from_edges(src, dst, n))):
        xi = x.clone().requires_grad_(True)
        out = model(xi, graph)
        (out * weight).sum().backward()
        results.append((out.detach(), xi.grad))
    assert_close(results[1][0], results[0][0], "output")
    assert_close(results[1][1], results[0][1], "x grad")
    grads = dict(compiled_model.named_parameters())
    for k, p in eager.named_parameters():
        assert_close(grads[k].grad, p.grad, f"grad of {k}")


def test_gcn_cached_normalises_the_graph_it_is_given():
    """GCNConv(cached=True) on the one graph of full-batch training: PyG's numbers, call after call."""
    torch.manual_seed(0)
    layer = gnn.GCNConv(4, 3, cached=True).double()
    src, dst = torch.randint(0, 9, (30,)), torch.randint(0, 9, (30,))
    x = torch.randn(9, 4, dtype=DT)
    compiled = sc.distribute(layer)
    for _ in range(2):
        torch.testing.assert_close(compiled(x, sc.Graph.from_edges(src, dst, 9)), layer(x, torch.stack([src, dst])))
