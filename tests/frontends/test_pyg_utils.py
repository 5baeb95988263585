"""PyG's graph utilities while a layer is traced (sarcompile/frontends/pyg/utils.py): the
general lowering of message functions with several node tensors, ``index`` and PyG's
``softmax`` / ``scatter`` / ``degree``, the self-loop utilities, ``gcn_norm`` and
``get_laplacian``, checked against eager PyG on one machine on graphs with isolated
nodes, self-loops and duplicate edges; the layers built on them on 1, 2 and 3 workers
through the PyG zoo."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

pytest.importorskip("torch_geometric")
import torch_geometric.nn as gnn  # noqa: E402
from torch_geometric.nn import MessagePassing  # noqa: E402
from torch_geometric.nn.conv.gcn_conv import gcn_norm  # noqa: E402
from torch_geometric.utils import (  # noqa: E402
    add_remaining_self_loops,  # noqa: F401  (looked up by name, see test_self_loop_utilities_carry_edge_attributes_as_pyg)
    add_self_loops,
    degree,
    dropout_adj,
    dropout_edge,
    get_laplacian,
    remove_self_loops,
    scatter,
    softmax,
)

import sarcompile as sc  # noqa: E402
from commands import ROOT, import_script  # noqa: E402
from pyg_models import MaskedUpdates, TutorialGCNConv  # noqa: E402

DT = torch.float64


def _graph() -> tuple[torch.Tensor, torch.Tensor, int]:
    # isolated node 5, a self-loop on 2, a duplicate edge 0->1 and a hub 3
    src = torch.tensor([0, 0, 1, 2, 2, 4, 1, 0, 4, 3, 3, 3])
    dst = torch.tensor([1, 1, 2, 2, 0, 3, 3, 3, 0, 1, 2, 4])
    return src, dst, 7


class Attend(MessagePassing):
    """Several node tensors on both ends, an edge tensor, ``index`` into PyG's softmax."""

    def __init__(self, aggr="add"):
        super().__init__(aggr=aggr)
        self.q, self.k = nn.Linear(4, 3), nn.Linear(4, 3)
        self.e = nn.Linear(2, 3)

    def forward(self, x, edge_index, edge_attr):
        return self.propagate(edge_index, x=x, q=self.q(x), k=self.k(x), edge_attr=edge_attr)

    def message(self, x_j, q_i, k_j, edge_attr, index, ptr, size_i):
        score = (q_i * (k_j + self.e(edge_attr))).sum(-1, keepdim=True)
        return softmax(score, index, ptr, size_i) * x_j


class Normalised(MessagePassing):
    """``scatter`` and ``degree`` over ``edge_index[1]`` in forward, then a plain message."""

    def forward(self, x, edge_index):
        row, col = edge_index
        deg = degree(col, x.size(0), dtype=x.dtype).clamp(min=1).unsqueeze(-1)
        return self.propagate(edge_index, x=x) / deg

    def message(self, x_j, x_i):
        return x_j * torch.tanh(x_i)

    def aggregate(self, inputs, index, dim_size=None):
        return scatter(inputs, index, 0, dim_size, "max") + scatter(inputs, index, 0, dim_size, "mul")


class Wrap(nn.Module):
    def __init__(self, layer: nn.Module, edge: bool = False):
        super().__init__()
        self.layer, self.edge = layer, edge

    def forward(self, x, edge_index, edge_attr=None):
        return self.layer(x, edge_index, edge_attr) if self.edge else self.layer(x, edge_index)


def _random_graph(seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """20 nodes: edges among the first 16 (17..19 isolated, so PyG's own node count is
    16 where it is not told it), self-loops (two on node 3), duplicate edges."""
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, 16, (40,), generator=gen), torch.randint(0, 16, (40,), generator=gen)
    loops = torch.tensor([3, 3, 5, 15])
    src, dst = torch.cat([src, loops, src[:6]]), torch.cat([dst, loops, dst[:6]])
    order = torch.randperm(src.numel(), generator=gen)
    return src[order], dst[order], 20


def _check(model: nn.Module, edge: bool = False, graph=None, edge_width: int = 2) -> None:
    src, dst, n = graph or _graph()
    torch.manual_seed(1)
    model = model.to(DT)
    x = torch.randn(n, 4, dtype=DT)
    shape = (src.numel(),) if edge_width == 0 else (src.numel(), edge_width)
    e = torch.rand(shape, dtype=DT) * torch.randint(0, 3, shape) if edge else None

    def run(m, graph):
        xi = x.clone().requires_grad_(True)
        ei = None if e is None else e.clone().requires_grad_(True)
        out = m(xi, graph, ei) if edge else m(xi, graph)
        (out * torch.arange(out.numel(), dtype=DT).reshape(out.shape).sin()).sum().backward()
        grads = [p.grad for p in m.parameters()]
        return out, xi.grad, None if ei is None else ei.grad, grads

    compiled = sc.distribute(copy.deepcopy(model))
    want = run(model, torch.stack([src, dst]))
    got = run(compiled, sc.Graph.from_edges(src, dst, n))
    for w, g in zip(want[:3], got[:3]):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12, equal_nan=True)
    for w, g in zip(want[3], got[3]):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("aggr", ["add", "mean", "max", "min", "mul", ["sum", "max"], gnn.aggr.StdAggregation(),
                                  gnn.aggr.SoftmaxAggregation(learn=True), gnn.aggr.PowerMeanAggregation(learn=True),
                                  gnn.aggr.VarAggregation()])
def test_message_with_several_node_tensors_and_softmax_matches_pyg(aggr):
    _check(Wrap(Attend(aggr), edge=True), edge=True)


def test_scatter_degree_and_overridden_aggregate_match_pyg():
    _check(Wrap(Normalised()))


def test_edge_index_used_as_a_tensor_is_refused():
    class Gather(MessagePassing):
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j, index):
            return x_j * index.unsqueeze(-1)  # arithmetic on the destination ids

    src, dst, n = _graph()
    with pytest.raises(sc.CompileError, match=r"edge_index\[1\].*used as a tensor"):
        sc.distribute(Wrap(Gather()))(torch.randn(n, 4), sc.Graph.from_edges(src, dst, n))


class Utility(MessagePassing):
    """``utility(edge_index, edge_attr)`` -> a new graph and its edge values, which weigh
    the messages (``x_j * w``); ``x`` goes through a parameter first so its gradient
    reaches one."""

    def __init__(self, utility):
        super().__init__()
        self.utility = utility
        self.lin = nn.Linear(4, 2)

    def forward(self, x, edge_index, edge_attr=None):
        edge_index, w = self.utility(x, edge_index, edge_attr)
        return self.propagate(edge_index, x=self.lin(x), w=w)

    def message(self, x_j, w):
        if w is None:
            return x_j
        return x_j * (w.view(-1, 1) if w.dim() == 1 else w)


FILLS = [None, 0.5, 2, "torch.tensor([0.25, -1.5])", "add", "sum", "mean", "max", "min", "mul"]


def _fill(fill):
    return torch.tensor([0.25, -1.5], dtype=DT) if fill == "torch.tensor([0.25, -1.5])" else fill


@pytest.mark.parametrize("given", [True, False], ids=["num_nodes", "no_num_nodes"])
@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("fn", ["add_self_loops", "add_remaining_self_loops"])
def test_self_loop_utilities_carry_edge_attributes_as_pyg(fn, fill, given):
    if fn == "add_remaining_self_loops" and fill in ("max", "min", "mul"):
        pytest.skip("eager PyG's backward fails here: it writes the existing loops into scatter's output in place")
    def utility(x, edge_index, e):
        # looked up when called, as a layer's module global is: the traced call sees the rule
        return globals()[fn](edge_index, e, _fill(fill), x.size(0) if given else None)

    for seed in (0, 1):
        _check(Wrap(Utility(utility), edge=True), edge=True, graph=_random_graph(seed))


@pytest.mark.parametrize("edge", [True, False])
def test_remove_self_loops_matches_pyg(edge):
    def utility(x, edge_index, e):
        return remove_self_loops(edge_index, e)

    _check(Wrap(Utility(utility), edge=edge), edge=edge, graph=_random_graph(2))


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("improved", [True, False])
@pytest.mark.parametrize("edge", [True, False])
@pytest.mark.parametrize("given", [True, False], ids=["num_nodes", "no_num_nodes"])
def test_gcn_norm_matches_pyg(edge, improved, loops, flow, given):
    def utility(x, edge_index, w):
        return gcn_norm(edge_index, w, x.size(0) if given else None, improved, loops, flow, x.dtype)

    _check(Wrap(Utility(utility), edge=edge), edge=edge, graph=_random_graph(3), edge_width=0)


@pytest.mark.parametrize("normalization", [None, "sym", "rw"])
@pytest.mark.parametrize("edge", [True, False])
def test_get_laplacian_and_its_max_match_pyg(normalization, edge):
    def utility(x, edge_index, w):
        edge_index, w = get_laplacian(edge_index, w, normalization, x.dtype, x.size(0))
        return edge_index, w / w.max()  # ChebConv's lambda_max: the largest over every edge

    _check(Wrap(Utility(utility), edge=edge), edge=edge, graph=_random_graph(4), edge_width=0)


def test_indexing_degrees_scatter_onto_sources_and_loop_updates_match_pyg():
    """``x[row]``, ``x.index_select(0, col)``, out- and in-degree, ``scatter`` onto the
    sources (sum, mean), ``e[row == col] -= 1`` and ``+= per-node values`` on a graph with
    one self-loop per node, ``e[row != col] *= 2``."""

    def utility(x, edge_index, e):
        edge_index, _ = remove_self_loops(edge_index)
        edge_index, _ = add_self_loops(edge_index, num_nodes=x.size(0))
        row, col = edge_index
        out_deg, in_deg = degree(row, x.size(0), dtype=x.dtype), degree(col, x.size(0), dtype=x.dtype)
        base = x[row][:, 0] * x.index_select(0, col)[:, 1] + 1.0 / out_deg.clamp(min=1)[row]
        pushed = scatter(base, row, 0, x.size(0), "sum") + scatter(base * base, row, 0, x.size(0), "mean")
        w = base * 0.5  # updated in place below (base is needed for backward as it is)
        w[row == col] -= 1
        w[row == col] += pushed / in_deg
        w[row != col] *= 2
        return edge_index, w

    for seed in (5, 6):
        _check(Wrap(Utility(utility)), graph=_random_graph(seed))


def test_unsupported_uses_are_refused():
    src, dst, n = _graph()
    g = sc.Graph.from_edges(src, dst, n)

    def refuses(utility, match):
        with pytest.raises(sc.CompileError, match=match):
            sc.distribute(Wrap(Utility(utility)))(torch.randn(n, 4), g)

    refuses(lambda x, ei, e: (ei, scatter(x[ei[1]][:, 0], ei[0], 0, None, "max")[ei[1]]), "onto the sources")
    refuses(lambda x, ei, e: (ei, x[ei[0] == ei[1]]), "self-loops")
    # a per-node update of the loops needs one loop per node (this graph has any number)
    refuses(lambda x, ei, e: (ei, _update(x[ei[0]][:, 0], ei, x[:, 0])), "exactly one")


def _update(w, edge_index, value):
    w[edge_index[0] == edge_index[1]] += value
    return w


def test_arma_is_refused_naming_its_node_axis():
    # (The layers built on the utilities are run on 1, 2 and 3 workers by
    # tests/benchmarks/test_pyg_zoo.py, with every case the saved sweep calls exact.)
    zoo = import_script(ROOT / "benchmarks" / "pyg_zoo.py")
    arma = zoo.sweep(["ARMAConv"], world_sizes=(1,), log=lambda s: None)[0]
    assert arma.outcome == zoo.REFUSED and "node_dim" in arma.detail, arma


def test_a_layer_propagating_under_no_grad_is_refused():
    """PyG's LabelPropagation decorates forward with torch.no_grad(): a traced program would
    give gradients where PyG gives none."""

    class Frozen(MessagePassing):
        @torch.no_grad()
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

    src, dst, n = _graph()
    with pytest.raises(sc.CompileError, match="no_grad"):
        sc.distribute(Wrap(Frozen()))(torch.randn(n, 4), sc.Graph.from_edges(src, dst, n))
    with torch.no_grad():  # called so by the user: nothing to keep
        sc.distribute(Wrap(Frozen()))(torch.randn(n, 4), sc.Graph.from_edges(src, dst, n))



class EdgeDropout(nn.Module):
    """A GCN layer on the edges ``dropout_edge`` keeps, and the mask."""

    def __init__(self, force_undirected: bool = False):
        super().__init__()
        self.force_undirected = force_undirected
        self.conv = gnn.GCNConv(3, 2, add_self_loops=False, normalize=False)

    def forward(self, x, edge_index):
        kept, mask = dropout_edge(edge_index, p=0.4, training=self.training, force_undirected=self.force_undirected)
        return self.conv(x, kept), mask


class AdjDropout(EdgeDropout):
    """The same with PyG's deprecated ``dropout_adj``."""

    def forward(self, x, edge_index):
        return self.conv(x, dropout_adj(edge_index, p=0.4, training=self.training)[0])


def test_edge_dropout_runs_the_layer_on_the_kept_edges_and_refuses_what_pairs_or_picks_rows():
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 12, (200,), generator=gen), torch.randint(0, 12, (200,), generator=gen)
    g, x = sc.Graph.from_edges(src, dst, 12), torch.randn(12, 3, generator=gen)
    model = EdgeDropout()
    out, mask = sc.distribute(model, seed=3)(x, g)
    assert mask.dtype == torch.bool and 0.45 < mask.double().mean() < 0.75  # p = 0.4
    torch.testing.assert_close(out, model.conv(x, torch.stack([src, dst])[:, mask]))  # PyG on the kept edges
    adj = AdjDropout()
    adj.conv = model.conv
    torch.testing.assert_close(sc.distribute(adj, seed=3)(x, g), out)  # the same edges
    model.eval()
    out, mask = sc.distribute(model)(x, g)
    assert mask.all()
    torch.testing.assert_close(out, model.conv(x, torch.stack([src, dst])))
    with pytest.raises(sc.CompileError, match="force_undirected"):
        sc.distribute(EdgeDropout(force_undirected=True))(x, g)

    class WithFeatures(nn.Module):
        def forward(self, x, edge_index):
            return dropout_adj(edge_index, torch.ones(200), p=0.4, training=True)

    with pytest.raises(sc.CompileError, match="call dropout_edge"):
        sc.distribute(WithFeatures())(x, g)


# -- t[mask] = value inside a layer (sarcompile/frontends/pyg/assign.py) ----------------------------
MASKED = {
    "tutorial GCNConv": lambda: TutorialGCNConv(4, 3),
    "tutorial GCNConv without self-loops (degree 0: inf zeroed)": lambda: TutorialGCNConv(4, 3, loops=False),
    "parameter, +=, y[mask], per-edge mask": lambda: MaskedUpdates(4, 3),
    "a view taken before, not read after": lambda: Assigning("view not read after"),
    "h[:, 0] = v (the tracer's rule)": lambda: Assigning("column"),
}


@pytest.mark.parametrize("name", list(MASKED))
def test_masked_assignments_match_pyg(name):
    """Rewritten to torch.where: outputs and every gradient as eager PyG's in-place updates
    (on 1, 2 and 3 workers in tests/frontends/test_pyg.py)."""
    for seed in (7, 8):
        _check(Wrap(MASKED[name]()), graph=_random_graph(seed))


class Assigning(MessagePassing):
    """An assignment into a tensor, ``how``: most of them refused."""

    def __init__(self, how: str):
        super().__init__(aggr="add")
        self.how = how

    def forward(self, x, edge_index):
        h = x * 2
        if self.how == "view read after":
            first = h[:, :2]
            h[h > 1] = 0.0
            h = h[:, 2:] + first
        elif self.how == "input":
            x[x > 1] = 0.0
        elif self.how == "index":
            h[degree(edge_index[1], x.size(0)).long()] = 0.0
        elif self.how == "a value per masked row":
            h[h[:, 0] > 0] = x[:3]
        elif self.how == "view not read after":  # (compiles: nothing reads the view later)
            first = h[:, :2]
            h[first[:, 0] > 1] = 0.0
        elif self.how == "column":  # (compiles: every row, one feature column)
            h[:, 1] = 0.5
        return self.propagate(edge_index, x=h)


@pytest.mark.parametrize("how,words", [
    ("view read after", r"a view of t taken before the assignment .* is read after it"),
    ("input", "t is the layer's input"),
    ("index", "with an index of dtype torch.int64"),
    ("a value per masked row", r"a value of shape \(3, 4\), one row per masked entry"),
])
def test_masked_assignments_that_are_not_eager_s_are_refused_naming_the_line_and_the_fix(how, words):
    src, dst, n = _graph()
    with pytest.raises(sc.CompileError, match=words) as refused:
        sc.distribute(Wrap(Assigning(how)))(torch.randn(n, 4), sc.Graph.from_edges(src, dst, n))
    assert "test_pyg_utils.py:" in str(refused.value) and "t = torch.where(mask, value, t)" in str(refused.value)
