"""The residency pass: every value's residency, and a compile-time refusal, naming the
line, of what would mix the rows of a per-node or per-edge value."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sarcompile as sc
from sarcompile.compile.call_shape import CallShape
from sarcompile.compile.pipeline import compile_program
from sarcompile.errors import CompileError
from sarcompile.compile.passes.context import CompileOptions
from sarcompile.ir.node_info import info
from sarcompile.ir.vocab import Residency

DT = torch.float64


def _graph(n=12, e=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return sc.Graph.from_edges(torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen), n)


def compiled(model: nn.Module, *args, partitioned: bool = False):
    """The program of ``model`` as called with ``args`` (the graph among them)."""
    where = next(i for i, a in enumerate(args) if isinstance(a, sc.Graph))
    call = CallShape.of_call(model.forward, args, {}, where)
    return compile_program(model, CompileOptions(), partitioned, call)


def refused(model: nn.Module, *args, match: str) -> str:
    with pytest.raises(CompileError, match=match) as e:
        compiled(model, *args)
    return str(e.value)


class Fn(nn.Module):
    """``forward(g, x) = body(g, x)``: one line of user code per model."""

    def __init__(self, body, *modules: nn.Module):
        super().__init__()
        self.body = body
        self.mods = nn.ModuleList(modules)

    def forward(self, g, x):
        return self.body(self, g, x)


# -- refused ---------------------------------------------------------------------------------
G, X = _graph(), torch.randn(12, 4, dtype=DT)


def test_sum_over_nodes_is_refused_naming_the_line_and_the_fix():
    msg = refused(Fn(lambda m, g, x: x + x.sum(0)), G, X, match="sum over dim 0 reduces over the node axis")
    assert "test_residency.py" in msg and "x.sum(0)" in msg
    assert "feature dims" in msg


class WithConstant(nn.Module):
    """``forward(g, x, c)``: a graph layer on ``x`` shifted by the column sums of ``c``."""

    def __init__(self, on_x: bool = False):
        super().__init__()
        self.conv, self.on_x = sc.nn.SAGEConv(4, 3), on_x

    def forward(self, g, x, c):
        return self.conv(g, x + (x if self.on_x else c).sum(0))


def test_a_refusal_names_a_constant_read_as_rows_only_for_its_row_count():
    """A [12, 4] constant beside a 12-node graph (a worker's part of that size) reads as rows:
    its column sum is refused, and the message says it compiles as a constant, and how."""
    c = torch.randn(12, 4, dtype=DT)
    msg = refused(WithConstant().to(DT), G, X, c, match="sum over dim 0 reduces over the node axis")
    assert "('c' [12, 4] was read as rows of the graph because the row count matches" in msg, msg
    assert "register_buffer" in msg
    assert compiled(WithConstant().to(DT), G, X, c[:5]) is not None  # another row count: a constant, compiles
    # Summing x itself, which the graph layer needs as rows: no such note
    msg = refused(WithConstant(on_x=True).to(DT), G, X, c, match="sum over dim 0 reduces over the node axis")
    assert "read as rows of the graph because" not in msg, msg


@pytest.mark.parametrize("body, match", [
    (lambda m, g, x: x.sum(), "sum over all elements"),
    (lambda m, g, x: x.cumsum(0), "cumsum over dim 0"),
    (lambda m, g, x: x[torch.randperm(12)], "picks rows"),
    (lambda m, g, x: torch.randperm(x.size(0)).unsqueeze(-1) + x, "randperm"),
    (lambda m, g, x: x[0] + x, "picks rows .* by position"),
    (lambda m, g, x: x[1:], "picks rows"),
    (lambda m, g, x: x[::4], "picks rows"),
    (lambda m, g, x: x.t(), "moves the row axis"),
    (lambda m, g, x: x.flip(0), "flip over dim 0"),
    (lambda m, g, x: torch.softmax(x, 0), "softmax over dim 0"),
    (lambda m, g, x: x.sort(0)[0], "sort over dim 0"),
    (lambda m, g, x: x.topk(2, 0)[0], "topk over dim 0"),
    (lambda m, g, x: x / x.size(0), "row count"),
    (lambda m, g, x: x + torch.arange(x.size(0)).unsqueeze(-1), "arange"),
    (lambda m, g, x: x.t() @ x, "moves the row axis"),
    (lambda m, g, x: torch.cat([x, x], 0), "cat along dim 0"),
    (lambda m, g, x: x.sum(0 - 2), "node axis"),  # -2 of a 2-D tensor is the rows
    (lambda m, g, x: x.sum(1).sum(-1), "node axis"),  # -1 of the 1-D result is the rows
    (lambda m, g, x: x.reshape(-1), "rows do not stay rows"),
    (lambda m, g, x: torch.randn_like(x) + x, "randn_like"),
])
def test_row_mixing_code_is_refused(body, match):
    refused(Fn(body), G, X, match=match)


def test_global_attention_over_nodes_is_refused():
    class Global(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(4, 2, batch_first=True).double()

        def forward(self, g, x):
            h = x.unsqueeze(0)
            return self.attn(h, h, h, need_weights=False)[0][0] + sc.spmm(g, x, "sum")

    refused(Global(), G, X, match="MultiheadAttention attends over all")


def test_arithmetic_on_the_graph_is_refused():
    refused(Fn(lambda m, g, x: sc.spmm(g.flip([0]), x, "sum")), G, X, match="`flip` uses the graph")
    refused(Fn(lambda m, g, x: sc.spmm(g, x + g, "sum")), G, X, match="`add` uses the graph")


def test_a_message_slicing_edges_by_position_is_refused():
    class Every4th(nn.Module):
        def forward(self, x_j, x_i, e):
            return x_j[0::4].repeat(4, 1)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.msg = Every4th()

        def forward(self, g, x):
            return sc.ops.message_passing(g, self.msg, x, None, "sum")

    msg = refused(M(), G, X, match="picks rows of a per-edge value")
    assert "message function Every4th" in msg and "x_j[0::4]" in msg


def test_the_graph_placeholder_of_a_pyg_model_is_a_graph():
    pytest.importorskip("torch_geometric")

    class Edges(nn.Module):
        def forward(self, x, edge_index):
            return x * edge_index.num_nodes

    # (where DGL is loaded the graph is traced as a DGL graph, whose num_nodes is a method: the
    # message then names the line instead)
    refused(Edges(), X, G, match=r"row count|edge_index\.num_nodes")


# -- PyG layers that used to compile to wrong answers ---------------------------------------------
gnn = pytest.importorskip("torch_geometric.nn")


class PyG(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, edge_index):
        return self.layer(x, edge_index)


def test_pyg_gpsconv_is_refused():
    model = PyG(gnn.GPSConv(4, gnn.GCNConv(4, 4), heads=2)).double().eval()
    # (torch < 2.3 cannot even trace PyG's to_dense_batch: torch.ones(1, proxy))
    msg = refused(model, X, G, match="MultiheadAttention attends over all (nodes|rows)|cannot trace")
    assert "'layer" in msg  # names the layer


def test_pyg_meshcnnconv_is_refused():
    if not hasattr(gnn, "MeshCNNConv"):
        pytest.skip("this PyG has no MeshCNNConv")
    kernels = nn.ModuleList([nn.Linear(4, 3) for _ in range(5)])
    model = PyG(gnn.MeshCNNConv(4, 3, kernels)).double()
    msg = refused(model, X, G, match="message function _Message of layer 'layer' \\(MeshCNNConv\\)")
    assert "picks rows of a per-edge value" in msg or "cannot be traced" in msg


def test_pyg_dirgnnconv_is_refused():
    model = PyG(gnn.DirGNNConv(gnn.GCNConv(4, 4))).double()
    refused(model, X, G, match="`flip` uses the graph")


# -- accepted, and exact -------------------------------------------------------------------------
class RowWise(nn.Module):
    """Row-wise code of every kind the pass accepts, around graph layers."""

    def __init__(self):
        super().__init__()
        self.sage = sc.nn.SAGEConv(4, 6)
        self.mlp = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 6))
        self.norm = nn.LayerNorm(6)
        self.bn = sc.nn.BatchNorm(12)
        self.drop = sc.nn.NodeDropout(0.3, seed=3)
        self.gcn = sc.nn.GCNConv(12, 3)
        self.scale = nn.Parameter(torch.randn(1, 6))

    def forward(self, g, x):
        h = torch.relu(self.sage(g, x))
        h = h + self.norm(self.mlp(h)) * self.scale  # residual, LayerNorm over features, broadcast param
        h = torch.cat([h, F.softmax(h, dim=-1)], dim=-1)  # concatenation along features
        h = h.view(h.size(0), 3, 4).transpose(1, 2).reshape(-1, 12)  # reshapes that keep the rows
        h = self.drop(g, self.bn(h))
        h = h - h.mean(-1, keepdim=True) + h[:, :1] + h[..., -1:] + h.max(1).values.unsqueeze(-1)
        return self.gcn(g, h)


def test_row_wise_model_compiles_and_is_exact():
    torch.manual_seed(0)
    model = RowWise().double().train()
    program = compiled(model, G, X).module
    eager_state = {k: v.clone() for k, v in model.state_dict().items()}
    want = model(G, X)
    model.load_state_dict(eager_state)  # the same buffers (steps, running statistics) again
    torch.testing.assert_close(program(G, X), want, rtol=0, atol=0)


def test_row_wise_model_on_two_workers_compiles():
    torch.manual_seed(0)
    program = compiled(RowWise().double(), G, X, partitioned=True)
    names = [name for name, _ in program.stages]
    assert names.index("residency") < names.index("sar")


def test_residency_of_every_value():
    torch.manual_seed(0)
    program = compiled(RowWise().double(), G, X)
    res = {n.name: info(n).residency for n in program.module.graph.nodes}
    assert res["g"] is Residency.GRAPH and res["x"] is Residency.NODE
    assert res["sage_spmm"] is Residency.NODE and res["scale"] is Residency.PARAM
    assert res["size"] is Residency.ROWS
    stage = dict(program.stages)["residency"]
    assert "sage_spmm = sarcompile_ir_ops_spmm(g, x, 'mean')  # node" in stage


def test_edge_values_and_the_graph_methods():
    class Edges(nn.Module):
        def forward(self, g, x, edge_weight):
            e = sc.sddmm(g, x, x, "dot")  # [E]
            w = torch.sigmoid(edge_weight).unsqueeze(-1) * e.unsqueeze(-1)
            return sc.spmm(g, x, "sum", edge_weight=w.squeeze(-1)) + g.in_degrees().unsqueeze(-1)

    w = torch.rand(40, dtype=DT)
    program = compiled(Edges(), G, X, w)
    res = {n.name: info(n).residency for n in program.module.graph.nodes}
    assert res["edge_weight"] is Residency.EDGE and res["sddmm"] is Residency.EDGE and res["mul"] is Residency.EDGE
    assert res["in_degrees"] is Residency.NODE
    torch.testing.assert_close(program.module(G, X, w), Edges()(G, X, w))


def test_an_outer_product_of_rows_is_refused():
    """[E, 1] * [E] broadcasts to [E, E]: row i of the result reads every edge."""

    class Outer(nn.Module):
        def forward(self, g, x, edge_weight):
            return sc.spmm(g, x, "sum", edge_weight=(edge_weight.unsqueeze(-1) * edge_weight).sum(-1))

    refused(Outer(), G, X, torch.rand(40, dtype=DT), match="lines its rows up with another axis")


def test_node_and_edge_values_do_not_mix():
    class Mixed(nn.Module):
        def forward(self, g, x, edge_weight):
            return sc.sddmm(g, x, x, "add") + x[:1].sum()  # noqa

    refused(Mixed(), G, X, torch.rand(40, dtype=DT), match="picks rows")

    class Mixed2(nn.Module):
        def forward(self, g, x, edge_weight):
            return sc.spmm(g, x * edge_weight.unsqueeze(-1), "sum")

    refused(Mixed2(), G, X, torch.rand(40, dtype=DT), match="combines per-node and per-edge")


def test_dropout_of_rows_is_row_local_and_dropouts_drawing_from_torch_are_refused_on_workers():
    compiled(Fn(lambda m, g, x: m.mods[0](x), nn.Dropout(0.5)).train(), G, X, partitioned=True)  # keyed masks
    model = Fn(lambda m, g, x: m.mods[0](x), nn.AlphaDropout(0.5)).train()
    compiled(model, G, X)  # one machine: the same draws as eager
    with pytest.raises(CompileError, match="torch's RNG row by row.*F.dropout or nn.Dropout"):
        compiled(model, G, X, partitioned=True)
    compiled(model.eval(), G, X, partitioned=True)  # eval: the identity


# -- rules on their own --------------------------------------------------------------------------
@pytest.mark.parametrize("shape, dim, ok", [
    ((12,), -1, False),  # a 1-D per-node tensor: its only axis is the rows
    ((12, 4), -1, True),
    ((12, 4), -2, False),
    ((12, 4, 2), 1, True),
    ((12, 4, 2), -3, False),
])
def test_negative_dims_need_the_number_of_dims(shape, dim, ok):
    x = torch.randn(*shape, dtype=DT)
    model = Fn(lambda m, g, x: (x.sum(dim, keepdim=True) * x) + sc.spmm(g, x, "sum"))
    if ok:
        torch.testing.assert_close(compiled(model, G, x).module(G, x), model(G, x))
    else:
        refused(model, G, x, match="node axis")


@pytest.mark.parametrize("other, ok", [
    (torch.randn(4), True),  # features: broadcast over the rows
    (torch.randn(1, 4), True),
    (torch.randn(12, 4), False),  # lines up with the rows of one machine only
    (torch.randn(12, 1, 4), False),  # moves the rows to axis 1, where the output may not have them
])
def test_broadcasting_with_parameters(other, ok):
    model = Fn(lambda m, g, x: x * m.p)
    model.p = nn.Parameter(other.double())
    if ok:
        compiled(model, G, X)
    else:
        refused(model, G, X, match="lines|at dim 1")


def mystery(x):
    return x


def double_rows(x):
    return 2 * x


torch.fx.wrap("mystery")
torch.fx.wrap("double_rows")


def test_unknown_functions_are_refused():
    refused(Fn(lambda m, g, x: mystery(x)), G, X, match="cannot prove")
    refused(Fn(lambda m, g, x: m.mods[0](x), nn.LSTM(4, 4)), G, X, match="cannot prove that LSTM")


def test_declared_helpers_are_trusted():
    from sarcompile.ir.lowering import declare

    declare(double_rows, "x")
    model = Fn(lambda m, g, x: double_rows(x))
    torch.testing.assert_close(compiled(model, G, X).module(G, X), 2 * X)


def test_probe_leaves_buffers_and_rng_alone():
    model = Fn(lambda m, g, x: m.mods[0](g, m.mods[1](x)), sc.nn.NodeDropout(0.5, seed=1), sc.nn.BatchNorm(4))
    model = model.double().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    compiled(model, G, X)
    assert torch.equal(torch.get_rng_state(), rng)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_an_lstm_over_a_sequence_per_row_is_row_local_and_so_is_its_hidden_state():
    """JumpingKnowledge(mode="lstm") runs an LSTM over [rows, layers, features] with
    batch_first: each row's sequence is its own. Without batch_first the sequence would
    run over rows; the hidden state has its rows on axis 1, which reducing dim 0 brings back."""
    lstm = nn.LSTM(4, 3, batch_first=True, bidirectional=True).double()
    seq = Fn(lambda m, g, x: m.mods[0](torch.stack([x, 2 * x], 1))[0].sum(-1), lstm)
    torch.testing.assert_close(compiled(seq, G, X).module(G, X), seq(G, X))
    across = Fn(lambda m, g, x: m.mods[0](x)[0], nn.LSTM(4, 3).double())
    refused(across, G, X, match="runs its sequence along the row axis")
    hidden = Fn(lambda m, g, x: m.mods[0](torch.stack([x, x], 1))[1][0].sum(0), nn.LSTM(4, 3, batch_first=True).double())
    torch.testing.assert_close(compiled(hidden, G, X).module(G, X), hidden(G, X))
    over_rows = Fn(lambda m, g, x: m.mods[0](torch.stack([x, x], 1))[1][0].sum(1), nn.LSTM(4, 3, batch_first=True))
    refused(over_rows.double(), G, X, match="sum over dim 1 reduces over the node axis")


def test_to_another_tensor_takes_only_its_dtype_and_device():
    """``deg.to(feat)`` (DGL's SGConv, GCN2Conv) converts a per-node [n] tensor to feat's
    dtype: no broadcasting; a parameter converted like a per-node tensor stays a parameter."""
    w = nn.Parameter(torch.ones(4, dtype=torch.float32))
    model = Fn(lambda m, g, x: x * g.in_degrees().to(x).unsqueeze(-1) + m.w.to(x), nn.Identity())
    model.w = w
    program = compiled(model, G, X)
    torch.testing.assert_close(program.module(G, X), model(G, X))


def test_an_rnn_cell_on_rows_is_row_local():
    """GatedGraphConv's ``GRUCell(a, h)``: one step per row, input and state ``[rows, F]``."""
    cell = nn.GRUCell(4, 4).double()
    model = Fn(lambda m, g, x: m.mods[0](sc.spmm(g, x, "sum"), x), cell)
    torch.testing.assert_close(compiled(model, G, X).module(G, X), model(G, X))
    # a 1-D input is one sample whose features are the rows
    refused(Fn(lambda m, g, x: m.mods[0](x[:, 0]), nn.GRUCell(23, 2).double()), G, X, match="GRUCell")


def test_all_rows_of_a_node_tensor_and_shapes_with_trailing_ones():
    """DGL's ``feat_0[: feat.size(0)]`` (GCN2Conv) is every row; ``x.shape + (1,) * (h.dim() - 1)``
    (TAGConv, APPNPConv) a shape whose first size is still the row count; a slice to another
    count is refused."""
    def body(m, g, x):
        deg = g.in_degrees().to(x)
        h = x.unsqueeze(-1)
        return (x[: deg.size(0)] + 1).unsqueeze(-1) * torch.reshape(deg, deg.shape + (1,) * (h.dim() - 1))

    model = Fn(body)
    torch.testing.assert_close(compiled(model, G, X).module(G, X), model(G, X))
    refused(Fn(lambda m, g, x: x[: x.size(0) - 1]), G, X, match="row count")
