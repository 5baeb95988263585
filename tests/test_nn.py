"""sc.nn layers against PyG's layers of the same name; sc.distribute on one machine;
NodeDropout's masks."""

from __future__ import annotations

import copy

import pytest
import torch
import torch_geometric.nn as pyg_nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import sarcompile as sc
from sarcompile.graph.shard import ShardGraph, split_graph
from strategies import graphs

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DT = torch.float64


def hub_graph():
    """A fixed graph with a node of in-degree 120 (multi-edges), self-loops, an isolated node."""
    gen = torch.Generator().manual_seed(7)
    src = torch.cat([torch.randint(0, 20, (120,), generator=gen), torch.tensor([1, 2, 3, 3, 5])])
    dst = torch.cat([torch.full((120,), 4), torch.tensor([1, 0, 3, 2, 6])])
    return src, dst, 22


def copy_params(ours: nn.Module, theirs: nn.Module) -> list[str]:
    """Copy every parameter and buffer of ours into theirs by name; the names must match."""
    ours_p, theirs_p = dict(ours.named_parameters()), dict(theirs.named_parameters())
    assert set(ours_p) == set(theirs_p), (sorted(ours_p), sorted(theirs_p))
    with torch.no_grad():
        for name, p in ours_p.items():
            assert theirs_p[name].shape == p.shape, name
            theirs_p[name].copy_(p)
        theirs_b = dict(theirs.named_buffers())
        for name, b in ours.named_buffers():
            theirs_b[name].copy_(b)
    return sorted(ours_p)


def compare_with_pyg(ours, theirs, src, dst, n, f_in, seed):
    names = copy_params(ours, theirs)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f_in, generator=gen, dtype=DT)
    g = sc.Graph.from_edges(src, dst, n)
    edge_index = torch.stack([src, dst])

    x1 = x.clone().requires_grad_()
    x2 = x.clone().requires_grad_()
    out1 = ours(g, x1)
    out2 = theirs(x2, edge_index)
    torch.testing.assert_close(out1, out2)
    go = torch.randn(out1.shape, generator=gen, dtype=DT)
    p1 = [dict(ours.named_parameters())[k] for k in names]
    p2 = [dict(theirs.named_parameters())[k] for k in names]
    grads1 = torch.autograd.grad(out1, [x1, *p1], go, allow_unused=True, materialize_grads=True)
    grads2 = torch.autograd.grad(out2, [x2, *p2], go, allow_unused=True, materialize_grads=True)
    for name, a, b in zip(["x", *names], grads1, grads2):
        torch.testing.assert_close(a, b, msg=lambda m, name=name: f"gradient of {name}: {m}")


# -- SAGEConv -----------------------------------------------------------------------------------


@pytest.mark.parametrize("aggr", ["mean", "sum", "max"])
@given(graphs(), st.booleans())
@SETTINGS
def test_sage_matches_pyg(aggr, data, bias):
    src, dst, n, seed = data
    torch.manual_seed(seed)
    ours = sc.nn.SAGEConv(4, 3, aggr, bias=bias).double()
    theirs = pyg_nn.SAGEConv(4, 3, aggr=aggr, bias=bias).double()
    compare_with_pyg(ours, theirs, src, dst, n, 4, seed)


@pytest.mark.parametrize("aggr", ["mean", "sum", "max"])
def test_sage_matches_pyg_on_hub(aggr):
    src, dst, n = hub_graph()
    torch.manual_seed(0)
    ours = sc.nn.SAGEConv(5, 4, aggr).double()
    theirs = pyg_nn.SAGEConv(5, 4, aggr=aggr).double()
    compare_with_pyg(ours, theirs, src, dst, n, 5, 1)


def test_sage_without_bias_and_bad_aggr():
    layer = sc.nn.SAGEConv(3, 2, "sum", bias=False)
    assert layer.lin_l.bias is None
    with pytest.raises(ValueError, match="aggr"):
        sc.nn.SAGEConv(3, 2, "prod")


# -- GCNConv ------------------------------------------------------------------------------------


@given(graphs(), st.booleans())
@SETTINGS
def test_gcn_matches_pyg(data, bias):
    src, dst, n, seed = data
    torch.manual_seed(seed)
    ours = sc.nn.GCNConv(4, 3, bias=bias).double()
    if bias:
        with torch.no_grad():
            ours.bias.normal_()  # a zero bias would hide a missing bias gradient
    theirs = pyg_nn.GCNConv(4, 3, bias=bias).double()
    compare_with_pyg(ours, theirs, src, dst, n, 4, seed)


def test_gcn_matches_pyg_on_hub():
    src, dst, n = hub_graph()
    torch.manual_seed(0)
    ours = sc.nn.GCNConv(5, 4).double()
    theirs = pyg_nn.GCNConv(5, 4).double()
    compare_with_pyg(ours, theirs, src, dst, n, 5, 2)


# -- GINConv ------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps, train_eps", [(0.0, False), (0.3, False), (0.0, True), (-0.25, True)])
@given(graphs())
@SETTINGS
def test_gin_matches_pyg(eps, train_eps, data):
    src, dst, n, seed = data
    torch.manual_seed(seed)
    mlp = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    ours = sc.nn.GINConv(mlp, eps=eps, train_eps=train_eps).double()
    theirs = pyg_nn.GINConv(copy.deepcopy(mlp), eps=eps, train_eps=train_eps).double()
    assert isinstance(ours.eps, nn.Parameter) == train_eps
    compare_with_pyg(ours, theirs, src, dst, n, 4, seed)


def test_gin_matches_pyg_on_hub():
    src, dst, n = hub_graph()
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 2)).double()
    ours = sc.nn.GINConv(mlp, eps=0.5, train_eps=True).double()
    theirs = pyg_nn.GINConv(copy.deepcopy(mlp), eps=0.5, train_eps=True).double()
    compare_with_pyg(ours, theirs, src, dst, n, 5, 3)


# -- sc.distribute on one machine ---------------------------------------------------------------


class Composite(nn.Module):
    def __init__(self, f_in: int = 5, hidden: int = 8, f_out: int = 3):
        super().__init__()
        self.sage = sc.nn.SAGEConv(f_in, hidden, "mean")
        self.sage_max = sc.nn.SAGEConv(hidden, hidden, "max")
        self.sage_sum = sc.nn.SAGEConv(hidden, hidden, "sum")
        self.gcn = sc.nn.GCNConv(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.drop = nn.Dropout(0.5)
        mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, f_out))
        self.gin = sc.nn.GINConv(mlp, eps=0.2, train_eps=True)
        self.scale = nn.Parameter(torch.ones(f_out))  # top-level parameter and buffer
        self.register_buffer("shift", torch.zeros(f_out))

    def forward(self, g, x):
        h = torch.relu(self.sage(g, x))
        h = h + torch.tanh(self.sage_sum(g, h))  # residual
        h = h + self.sage_max(g, torch.sin(h))  # residual
        h = self.drop(self.norm(self.gcn(g, h)) + h)
        return self.gin(g, h) * self.scale + self.shift


def make_composite(seed: int = 0) -> Composite:
    torch.manual_seed(seed)
    m = Composite().double().eval()
    with torch.no_grad():
        m.gcn.bias.normal_()
        m.norm.weight.normal_()
        m.norm.bias.normal_()
        m.scale.normal_()
        m.shift.normal_()
    return m


def grads_of(model, g, x, go):
    x = x.clone().requires_grad_()
    out = model(g, x)
    names = [k for k, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    grads = torch.autograd.grad(out, [x, *params], go(out), allow_unused=True, materialize_grads=True)
    return out, dict(zip(["x", *names], grads))


MODEL = make_composite()
DIST = sc.distribute(MODEL)


@given(graphs())
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_distribute_matches_eager(data):
    src, dst, n, seed = data
    g = sc.Graph.from_edges(src, dst, n)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=gen, dtype=DT)
    go_t = torch.randn(n, 3, generator=gen, dtype=DT)
    out1, g1 = grads_of(MODEL, g, x, lambda out: go_t)
    out2, g2 = grads_of(DIST, g, x, lambda out: go_t)
    torch.testing.assert_close(out2, out1)
    assert g1.keys() == g2.keys()
    for k in g1:
        torch.testing.assert_close(g2[k], g1[k], msg=lambda m, k=k: f"gradient of {k}: {m}")


def test_distribute_program_is_lowered_to_ir_ops():
    src, dst, n = hub_graph()
    g = sc.Graph.from_edges(src, dst, n)
    model = make_composite(1)
    dm = sc.distribute(model)
    dm(g, torch.randn(n, 5, dtype=DT))
    gm = dm.program(False).module
    reg = sc.ops.registry()
    ops = [node.target.__name__ for node in gm.graph.nodes if node.op == "call_function" and node.target in reg]
    assert ops.count("spmm") == 5  # 3 SAGE + GCN + GIN
    leaves = {str(node.target) for node in gm.graph.nodes if node.op == "call_module"}
    assert not any(t in ("sage", "sage_max", "sage_sum", "gcn", "gin") for t in leaves)


def test_distribute_state_dict_shared():
    model = make_composite(2)
    dm = sc.distribute(model)
    assert list(dm.state_dict().keys()) == list(model.state_dict().keys())
    for (k1, v1), (k2, v2) in zip(dm.state_dict().items(), model.state_dict().items()):
        assert k1 == k2 and v1.data_ptr() == v2.data_ptr()
    assert [id(p) for p in dm.parameters()] == [id(p) for p in model.parameters()]

    # The eager model's checkpoint loads into the distributed one and vice versa.
    dm.load_state_dict(model.state_dict())
    model.load_state_dict(dm.state_dict())

    src, dst, n = hub_graph()
    g = sc.Graph.from_edges(src, dst, n)
    x = torch.randn(n, 5, dtype=DT)
    dm(g, x)  # compile before loading: the compiled program must see the new weights
    new = {k: (torch.randn_like(v) if v.is_floating_point() else v.clone()) for k, v in model.state_dict().items()}
    dm.load_state_dict(new)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, new[k], msg=lambda m, k=k: f"{k} not loaded into the original: {m}")
    torch.testing.assert_close(dm(g, x), model(g, x))
    reference = make_composite(99)
    reference.load_state_dict(new)
    torch.testing.assert_close(dm(g, x), reference(g, x))


def test_distribute_gradients_land_on_original():
    model = make_composite(3)
    src, dst, n = hub_graph()
    g = sc.Graph.from_edges(src, dst, n)
    x = torch.randn(n, 5, dtype=DT)
    go = torch.randn(n, 3, dtype=DT)
    _, expected = grads_of(model, g, x, lambda out: go)

    dm = sc.distribute(model)
    model.zero_grad(set_to_none=True)
    xr = x.clone().requires_grad_()
    (dm(g, xr) * go).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"no gradient on the original's {name}"
        torch.testing.assert_close(p.grad, expected[name], msg=lambda m, name=name: f"{name}: {m}")
    torch.testing.assert_close(xr.grad, expected["x"])
    # A second backward accumulates, as in eager mode.
    (dm(g, x) * go).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, 2 * expected[name])


def test_distribute_train_and_eval_share_parameters():
    model = make_composite(4)
    dm = sc.distribute(model)
    src, dst, n = hub_graph()
    g = sc.Graph.from_edges(src, dst, n)
    x = torch.randn(n, 5, dtype=DT)
    dm.train()
    assert model.training and model.drop.training
    out_train = dm(g, x)
    assert out_train.shape == (n, 3)
    dm.eval()
    assert not model.training and not model.drop.training
    torch.testing.assert_close(dm(g, x), model(g, x))


def test_distribute_decorates_a_class():
    @sc.distribute
    class Deco(nn.Module):
        def __init__(self, f_in, f_out):
            super().__init__()
            self.conv = sc.nn.SAGEConv(f_in, f_out, "sum")
            self.gcn = sc.nn.GCNConv(f_out, f_out)

        def forward(self, g, x):
            return self.gcn(g, torch.relu(self.conv(g, x)))

    torch.manual_seed(0)
    m = Deco(4, 3).double()
    assert isinstance(m, sc.DistributedModule)
    assert type(m.original).__name__ == "Deco"
    assert list(m.state_dict()) == ["conv.lin_l.weight", "conv.lin_l.bias", "conv.lin_r.weight", "gcn.bias", "gcn.lin.weight"]
    src, dst, n = hub_graph()
    g = sc.Graph.from_edges(src, dst, n)
    x = torch.randn(n, 4, dtype=DT)
    eager = copy.deepcopy(m.original)
    torch.testing.assert_close(m(g, x), eager(g, x))

    @sc.distribute(mode="stash")
    class Deco2(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = sc.nn.SAGEConv(4, 2, "max")

        def forward(self, g, x):
            return self.conv(g, x)

    m2 = Deco2().double()
    assert isinstance(m2, sc.DistributedModule) and m2.options.mode == "stash"
    torch.testing.assert_close(m2(g, x), m2.original(g, x))


class EdgeModel(nn.Module):
    """Raw IR ops with learned edge scores, as an attention layer writes them."""

    def __init__(self, f_in: int = 5, heads: int = 2, hidden: int = 3):
        super().__init__()
        self.heads, self.hidden = heads, hidden
        self.q = nn.Linear(f_in, heads * hidden)
        self.k = nn.Linear(f_in, heads * hidden)
        self.v = nn.Linear(f_in, heads * hidden)
        self.gate = nn.Linear(f_in, 1)

    def forward(self, g, x):
        n = x.shape[0]
        q = self.q(x).view(n, self.heads, self.hidden)
        k = self.k(x).view(n, self.heads, self.hidden)
        v = self.v(x).view(n, self.heads, self.hidden)
        att = sc.edge_softmax(g, sc.sddmm(g, k, q, "dot"))
        out = sc.spmm(g, v, "sum", edge_weight=att).flatten(1)
        w = torch.sigmoid(sc.sddmm(g, self.gate(x), self.gate(x), "sub").squeeze(-1))
        return out + sc.spmm(g, x, "mean", edge_weight=w)[:, :1] + sc.spmm(g, x, "max")[:, :1]


@given(graphs())
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_distribute_raw_ops_match_eager(data):
    src, dst, n, seed = data
    torch.manual_seed(0)
    model = EdgeModel().double()
    dm = sc.distribute(model)
    g = sc.Graph.from_edges(src, dst, n)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=gen, dtype=DT)
    go = torch.randn(n, 6, generator=gen, dtype=DT)
    out1, g1 = grads_of(model, g, x, lambda out: go)
    out2, g2 = grads_of(dm, g, x, lambda out: go)
    torch.testing.assert_close(out2, out1)
    for k in g1:
        torch.testing.assert_close(g2[k], g1[k], msg=lambda m, k=k: f"gradient of {k}: {m}")


def test_distribute_dtype_change_through_wrapper():
    torch.manual_seed(0)
    model = Composite().eval()  # float32
    dm = sc.distribute(model)
    src, dst, n = hub_graph()
    g = sc.Graph.from_edges(src, dst, n)
    x = torch.randn(n, 5)
    assert dm(g, x).dtype == torch.float32
    dm.double()
    assert model.sage.lin_l.weight.dtype == DT and model.gin.eps.dtype == DT
    out = dm(g, x.double())
    assert out.dtype == DT
    torch.testing.assert_close(out, model(g, x.double()))


def test_distribute_load_state_dict_assign():
    model = make_composite(5)
    dm = sc.distribute(model)
    src, dst, n = hub_graph()
    g = sc.Graph.from_edges(src, dst, n)
    x = torch.randn(n, 5, dtype=DT)
    dm(g, x)  # compiled
    new = {k: (torch.randn_like(v) if v.is_floating_point() else v.clone()) for k, v in model.state_dict().items()}
    dm.load_state_dict(new, assign=True)
    assert model.scale is dm.scale
    out = dm(g, x)
    out.sum().backward()
    assert model.scale.grad is not None, "the gradient did not land on the original's (new) parameter"
    torch.testing.assert_close(out, model(g, x))


def test_distribute_sees_reassigned_buffer():
    model = make_composite(6)
    dm = sc.distribute(model)
    src, dst, n = hub_graph()
    g = sc.Graph.from_edges(src, dst, n)
    x = torch.randn(n, 5, dtype=DT)
    dm(g, x)  # compiled
    dm.shift = torch.full((3,), 5.0, dtype=DT)
    assert model.shift is dm.shift
    torch.testing.assert_close(dm(g, x), model(g, x))


def test_distribute_respects_eval_on_the_original():
    torch.manual_seed(0)
    model = Composite().double().train()
    dm = sc.distribute(model)
    src, dst, n = hub_graph()
    g = sc.Graph.from_edges(src, dst, n)
    x = torch.randn(n, 5, dtype=DT)
    model.eval()
    out = dm(g, x)
    assert not model.training and not model.drop.training, "dm(g, x) put the original back into training mode"
    torch.testing.assert_close(out, model(g, x))


def test_distribute_errors():
    with pytest.raises(sc.CompileError, match="torch.nn.Module"):
        sc.distribute(42)
    dm = sc.distribute(make_composite())
    with pytest.raises(sc.CompileError, match="already distributed"):
        sc.distribute(dm)
    with pytest.raises(sc.CompileError, match="graph"):
        dm(torch.randn(3, 5, dtype=DT))


# -- NodeDropout --------------------------------------------------------------------------------


def masks(nd, graph, n, width=6):
    """The scaled keep mask NodeDropout applies to n rows of ones."""
    return nd(graph, torch.ones(n, width, dtype=DT))


def test_node_dropout_same_mask_regardless_of_row_order():
    n = 40
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, n, (150,), generator=gen), torch.randint(0, n, (150,), generator=gen)
    g = sc.Graph.from_edges(src, dst, n)
    template = sc.nn.NodeDropout(p=0.4, seed=1234)
    full = masks(copy.deepcopy(template), g, n)
    assert 0 < (full == 0).sum() < full.numel()

    # Rows permuted: a one-worker shard whose row i is node perm[i].
    perm = torch.randperm(n, generator=gen)
    inv = torch.argsort(perm)
    gp = sc.Graph.from_edges(inv[src], inv[dst], n)
    block = gp.block
    block.src_gids = perm
    shard = ShardGraph(0, 1, perm, [block], [torch.empty(0, dtype=torch.long)], gp.csr_perm, n, gp.num_edges)
    torch.testing.assert_close(masks(copy.deepcopy(template), shard, n), full[perm])

    # Split over 3 workers: each node draws the same mask wherever it lives.
    assignment = torch.randint(0, 3, (n,), generator=gen)
    rebuilt = torch.full_like(full, float("nan"))
    for r, part in enumerate(split_graph(g, assignment, 3)):
        sg = ShardGraph.from_part(part, r, 3, n, g.num_edges)
        rebuilt[sg.global_ids] = masks(copy.deepcopy(template), sg, sg.num_nodes)
    torch.testing.assert_close(rebuilt, full)

    # The mask scales the input; it does not depend on its values.
    x = torch.randn(n, 6, dtype=DT)
    torch.testing.assert_close(copy.deepcopy(template)(g, x), x * full)


def test_node_dropout_successive_calls_differ_and_resume_from_checkpoint():
    g = sc.Graph.from_edges(torch.tensor([0]), torch.tensor([1]), 50)
    nd = sc.nn.NodeDropout(p=0.5, seed=7)
    m1 = masks(nd, g, 50)
    saved = copy.deepcopy(nd.state_dict())
    m2 = masks(nd, g, 50)
    assert int(nd.stream.step) == 2
    assert not torch.equal(m1, m2)
    # Same seed, same step: same masks; a checkpoint resumes the sequence.
    other = sc.nn.NodeDropout(p=0.5, seed=7)
    torch.testing.assert_close(masks(other, g, 50), m1)
    resumed = sc.nn.NodeDropout(p=0.5, seed=0)
    resumed.load_state_dict(saved)
    torch.testing.assert_close(masks(resumed, g, 50), m2)
    # Another seed: another mask.
    assert not torch.equal(masks(sc.nn.NodeDropout(p=0.5, seed=8), g, 50), m1)


def test_node_dropout_default_seed_from_torch_rng():
    torch.manual_seed(11)
    a = sc.nn.NodeDropout(p=0.5)
    torch.manual_seed(11)
    b = sc.nn.NodeDropout(p=0.5)
    assert int(a.stream.seed) == int(b.stream.seed)
    g = sc.Graph.from_edges(torch.tensor([0]), torch.tensor([1]), 30)
    torch.testing.assert_close(masks(a, g, 30), masks(b, g, 30))


def test_node_dropout_eval_is_identity():
    g = sc.Graph.from_edges(torch.tensor([0]), torch.tensor([1]), 20)
    nd = sc.nn.NodeDropout(p=0.5, seed=3).eval()
    x = torch.randn(20, 4)
    torch.testing.assert_close(nd(g, x), x)
    assert int(nd.stream.step) == 0
    torch.testing.assert_close(sc.nn.NodeDropout(p=0.0, seed=3)(g, x), x)


def test_node_dropout_keep_rate():
    n, width, p = 20000, 50, 0.3
    g = sc.Graph.from_edges(torch.tensor([0]), torch.tensor([1]), n)
    nd = sc.nn.NodeDropout(p=p, seed=42)
    out = masks(nd, g, n, width)
    kept = out != 0
    assert abs(kept.double().mean().item() - (1 - p)) < 0.005
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / (1 - p)))
    # Not one mask per node or per feature: it varies along both axes.
    per_feature = kept.double().mean(0)
    assert per_feature.min() > 0.6 and per_feature.max() < 0.8
    assert 0.5 < kept[:, 0].eq(kept[:, 1]).double().mean() < 0.7  # ~ 0.7^2 + 0.3^2 = 0.58
    # successive calls are (nearly) independent
    kept2 = masks(nd, g, n, width) != 0
    assert 0.5 < kept.eq(kept2).double().mean() < 0.66


def test_node_dropout_bad_p():
    for p in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="probability"):
            sc.nn.NodeDropout(p=p)


class DropModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = sc.nn.NodeDropout(p=0.5, seed=5)
        self.conv = sc.nn.SAGEConv(4, 3, "mean")

    def forward(self, g, x):
        return self.conv(g, self.drop(g, x))


def test_node_dropout_inside_distribute():
    torch.manual_seed(0)
    model = DropModel().double().train()
    eager = copy.deepcopy(model)
    dm = sc.distribute(model)
    src, dst, n = hub_graph()
    g = sc.Graph.from_edges(src, dst, n)
    x = torch.randn(n, 4, dtype=DT)
    for _ in range(2):
        torch.testing.assert_close(dm(g, x), eager(g, x))
    assert int(model.drop.stream.step) == 2  # the step buffer lives on the original
    dm.eval()
    torch.testing.assert_close(dm(g, x), model.conv(g, x))


# -- BatchNorm --------------------------------------------------------------------------------
class _Norm(nn.Module):
    def __init__(self, norm: nn.Module):
        super().__init__()
        self.lin = nn.Linear(5, 4)
        self.norm = norm

    def forward(self, g, x):
        return torch.tanh(self.norm(self.lin(x) + sc.spmm(g, x[:, :4], "mean")))


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"affine": False}, {"momentum": None}, {"momentum": 0.5, "eps": 1e-3}, {"track_running_stats": False}],
)
def test_batch_norm_is_torch_batch_norm_on_one_machine(kwargs):
    """Eager and compiled sc.nn.BatchNorm against torch.nn.BatchNorm1d over three training
    steps (outputs, input and parameter gradients, running statistics), then in eval."""
    gen = torch.Generator().manual_seed(0)
    g = sc.Graph.from_edges(torch.randint(0, 30, (90,), generator=gen), torch.randint(0, 30, (90,), generator=gen), 30)
    torch.manual_seed(1)
    ref = _Norm(nn.BatchNorm1d(4, **kwargs)).double()
    eager = _Norm(sc.nn.BatchNorm(4, **kwargs)).double()
    eager.load_state_dict(ref.state_dict())
    compiled_model = copy.deepcopy(eager)
    compiled = sc.distribute(compiled_model)
    for step in range(4):
        training = step < 3
        x = torch.randn(30, 5, generator=gen, dtype=torch.float64)
        w = torch.randn(30, 4, generator=gen, dtype=torch.float64)
        results = []
        for m, params in ((ref, ref), (eager, eager), (compiled, compiled_model)):
            m.train(training)
            params.zero_grad()
            xi = x.clone().requires_grad_(True)
            out = m(g, xi)
            (out * w).sum().backward()
            grads = {k: p.grad.clone() for k, p in params.named_parameters()}
            results.append((out.detach(), xi.grad, grads, {k: b.clone() for k, b in params.named_buffers()}))
        want = results[0]
        for got in results[1:]:
            torch.testing.assert_close(got[0], want[0], atol=1e-12, rtol=0)
            torch.testing.assert_close(got[1], want[1], atol=1e-12, rtol=0)
            assert got[2].keys() == want[2].keys() and got[3].keys() == want[3].keys()
            for k in want[2]:
                torch.testing.assert_close(got[2][k], want[2][k], atol=1e-12, rtol=0, msg=k)
            for k in want[3]:
                torch.testing.assert_close(got[3][k], want[3][k], atol=1e-12, rtol=0, msg=k)


def test_batch_norm_state_dict_moves_to_and_from_torch():
    ours = sc.nn.BatchNorm(6)
    theirs = nn.BatchNorm1d(6)
    with torch.no_grad():
        theirs.running_mean.uniform_()
        theirs.weight.uniform_()
    theirs.num_batches_tracked.fill_(5)
    ours.load_state_dict(theirs.state_dict())
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for k, v in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v)
    x = torch.randn(10, 6)
    torch.testing.assert_close(ours.eval()(x), theirs.eval()(x))


def test_batch_norm_rejects_other_shapes_and_single_node():
    with pytest.raises(sc.GraphError, match=r"\[num_nodes, channels\]"):
        sc.nn.BatchNorm(3)(torch.randn(4, 3, 2))
    with pytest.raises(sc.GraphError, match="momentum"):
        sc.nn.BatchNorm(3, momentum=2.0)(torch.randn(4, 3))
    # One node in all cannot give a batch variance: torch's error on one machine, ours on a shard.
    g = sc.Graph.from_edges(torch.tensor([0]), torch.tensor([0]), 1)
    with pytest.raises(ValueError, match="more than 1"):
        sc.distribute(_Norm(sc.nn.BatchNorm(4)))(ShardGraph.single(g), torch.randn(1, 5))


def test_batch_norm_in_plan():
    g = sc.Graph.from_edges(torch.arange(20), (torch.arange(20) + 1) % 20, 20)
    plan = sc.distribute(_Norm(sc.nn.BatchNorm(4))).plan(g, 2, x=torch.randn(1, 5), method="contiguous")
    row = next(op for op in plan.ops if op.op == "batch_norm")
    assert (row.layer, row.strategy) == ("norm", "allreduce")
    assert row.forward_bytes == [(4 + 1 + 4) * 8] * 2  # sums, count, squared deviations (float64)
    assert "batch_norm" in str(plan) and "allreduce" in str(plan)
