"""The IR ops (spmm, sddmm, edge_softmax) against brute-force dense computations.

The references below use only dense one-hot incidence matrices and explicit loops over
nodes; they share no code with the package. Forward values and gradients are compared
as whole tensors.
"""

from __future__ import annotations

import networkx as nx
import pytest
import torch
import torch.fx
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings

import sarcompile as sc
from sarcompile.errors import GraphError
from strategies import graphs

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DT = torch.float64


# -- hypothesis graphs --------------------------------------------------------------------------


def rand(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=DT).requires_grad_()


# -- dense references ---------------------------------------------------------------------------


def incidence(src, dst, n):
    """S[e, u] = 1 if edge e leaves u; D[e, v] = 1 if edge e enters v."""
    return F.one_hot(src, n).to(DT), F.one_hot(dst, n).to(DT)


def gather_rows(M, t):
    """Row e of the result is sum_u M[e, u] * t[u] (a dense gather)."""
    width = 1
    for d in t.shape[1:]:
        width *= d
    return (M @ t.reshape(t.shape[0], width)).reshape(M.shape[0], *t.shape[1:])


def ref_spmm(src, dst, n, x, reduce, w=None):
    S, D = incidence(src, dst, n)
    if reduce in ("max", "min"):
        rows = []
        for v in range(n):
            srcs = [int(src[i]) for i in range(src.numel()) if int(dst[i]) == v]
            if not srcs:
                rows.append(torch.zeros(x.shape[1:], dtype=x.dtype))
            else:
                neighbours = torch.stack([x[u] for u in srcs])
                rows.append(neighbours.max(dim=0).values if reduce == "max" else neighbours.min(dim=0).values)
        return torch.stack(rows)
    msg = gather_rows(S, x)
    if w is not None:
        msg = msg * w.reshape(*w.shape, *([1] * (x.dim() - w.dim())))
    out = gather_rows(D.T.contiguous(), msg)
    if reduce == "mean":
        deg = D.sum(0).clamp(min=1)
        out = out / deg.reshape(-1, *([1] * (x.dim() - 1)))
    return out


def ref_sddmm(src, dst, n, a, b, op):
    S, D = incidence(src, dst, n)
    au, bv = gather_rows(S, a), gather_rows(D, b)
    if op == "add":
        return au + bv
    if op == "sub":
        return au - bv
    if op == "mul":
        return au * bv
    return (au * bv).sum(-1)


def ref_edge_softmax(src, dst, n, e):
    pieces, order = [], []
    for v in range(n):
        idx = [i for i in range(dst.numel()) if int(dst[i]) == v]
        if idx:
            pieces.append(torch.softmax(e[idx], dim=0))
            order += idx
    if not order:
        return e * 0
    out = torch.cat(pieces)
    return out[torch.argsort(torch.tensor(order))]


def check(out, ref, inputs, gen):
    """Forward values and the gradients w.r.t. every input, as whole tensors."""
    torch.testing.assert_close(out, ref)
    go = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    got = torch.autograd.grad(out, inputs, go, allow_unused=True, materialize_grads=True)
    if ref.requires_grad:
        want = torch.autograd.grad(ref, inputs, go, allow_unused=True, materialize_grads=True)
    else:  # e.g. a max over a graph without edges: the reference is a constant 0
        want = [torch.zeros_like(t) for t in inputs]
    for name, g1, g2 in zip(range(len(inputs)), got, want):
        torch.testing.assert_close(g1, g2, msg=lambda m, i=name: f"gradient of input {i}: {m}")


# -- spmm ---------------------------------------------------------------------------------------

F_, H_ = 3, 2
# (node feature tail, edge weight tail or None)
SHAPES = [((F_,), None), ((F_,), ()), ((H_, F_), None), ((H_, F_), ()), ((H_, F_), (H_,)), ((H_,), (H_,))]


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@given(graphs())
@SETTINGS
def test_spmm_sum_mean(reduce, data):
    src, dst, n, seed = data
    g = sc.Graph.from_edges(src, dst, n)
    gen = torch.Generator().manual_seed(seed)
    E = src.numel()
    for xtail, wtail in SHAPES:
        x = rand(gen, n, *xtail)
        if wtail is None:
            out = sc.spmm(g, x, reduce)
            check(out, ref_spmm(src, dst, n, x, reduce), [x], gen)
        else:
            w = rand(gen, E, *wtail)
            out = sc.spmm(g, x, reduce, edge_weight=w)
            assert out.shape == (n, *xtail)
            check(out, ref_spmm(src, dst, n, x, reduce, w), [x, w], gen)


@pytest.mark.parametrize("reduce", ["max", "min"])
@given(graphs())
@SETTINGS
def test_spmm_max_min(reduce, data):
    src, dst, n, seed = data
    g = sc.Graph.from_edges(src, dst, n)
    gen = torch.Generator().manual_seed(seed)
    for xtail in [(F_,), (H_, F_), ()]:
        x = rand(gen, n, *xtail)
        out = sc.spmm(g, x, reduce)
        assert out.shape == x.shape
        check(out, ref_spmm(src, dst, n, x, reduce), [x], gen)


def test_spmm_min_gradient_goes_to_the_smallest_with_ties_to_the_smallest_id():
    # 0->2, 1->2, 3->2 with x[0] == x[3] the smallest; node 1 larger; node 4 isolated
    g = sc.Graph.from_edges(torch.tensor([0, 1, 3]), torch.tensor([2, 2, 2]), 5)
    x = torch.tensor([[-3.0], [5.0], [0.0], [-3.0], [7.0]], dtype=DT, requires_grad=True)
    out = sc.spmm(g, x, "min")
    assert out.flatten().tolist() == [0.0, 0.0, -3.0, 0.0, 0.0]
    (gx,) = torch.autograd.grad(out, x, torch.ones_like(out))
    assert gx.flatten().tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


@given(graphs())
@SETTINGS
def test_spmm_default_reduce_is_sum(data):
    src, dst, n, seed = data
    g = sc.Graph.from_edges(src, dst, n)
    x = torch.randn(n, 2, generator=torch.Generator().manual_seed(seed), dtype=DT)
    torch.testing.assert_close(sc.spmm(g, x), ref_spmm(src, dst, n, x, "sum"))


def test_spmm_small_by_hand():
    # 0->1 twice, 2->1, 2->0, 1->1 (self-loop); node 3 isolated
    g = sc.Graph.from_edges(torch.tensor([0, 0, 2, 2, 1]), torch.tensor([1, 1, 1, 0, 1]), 4)
    x = torch.tensor([[1.0], [10.0], [100.0], [1000.0]], dtype=DT)
    assert sc.spmm(g, x, "sum").flatten().tolist() == [100.0, 112.0, 0.0, 0.0]
    assert sc.spmm(g, x, "mean").flatten().tolist() == [100.0, 28.0, 0.0, 0.0]
    assert sc.spmm(g, x, "max").flatten().tolist() == [100.0, 100.0, 0.0, 0.0]
    w = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=DT)
    assert sc.spmm(g, x, "sum", edge_weight=w).flatten().tolist() == [400.0, 353.0, 0.0, 0.0]


def test_spmm_max_gradient_goes_to_winner_with_multi_edges():
    # Node 0 receives from 1 three times and from 2 once; x[1] wins every feature.
    g = sc.Graph.from_edges(torch.tensor([1, 2, 1, 1]), torch.tensor([0, 0, 0, 0]), 4)
    x = torch.tensor([[0.0, 0.0], [5.0, 7.0], [1.0, -3.0], [9.0, 9.0]], dtype=DT, requires_grad=True)
    out = sc.spmm(g, x, "max")
    torch.testing.assert_close(out, torch.tensor([[5.0, 7.0], [0, 0], [0, 0], [0, 0]], dtype=DT))
    go = torch.tensor([[2.0, 3.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]], dtype=DT)
    (gx,) = torch.autograd.grad(out, x, go)
    torch.testing.assert_close(gx, torch.tensor([[0, 0], [2.0, 3.0], [0, 0], [0, 0]], dtype=DT))


def test_spmm_max_mixed_winners_and_empty():
    # Per feature a different source wins; node 2 has no in-edge (gives 0, no gradient).
    g = sc.Graph.from_edges(torch.tensor([0, 1, 1]), torch.tensor([3, 3, 3]), 4)
    x = torch.tensor([[4.0, -1.0], [2.0, 6.0], [-7.0, -8.0], [0.5, 0.5]], dtype=DT, requires_grad=True)
    out = sc.spmm(g, x, "max")
    torch.testing.assert_close(out, torch.tensor([[0, 0], [0, 0], [0, 0], [4.0, 6.0]], dtype=DT))
    go = torch.arange(8, dtype=DT).reshape(4, 2) + 1
    (gx,) = torch.autograd.grad(out, x, go)
    torch.testing.assert_close(gx, torch.tensor([[7.0, 0], [0, 8.0], [0, 0], [0, 0]], dtype=DT))


def test_spmm_max_all_negative_is_not_clamped_to_zero():
    g = sc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([2, 2]), 3)
    x = torch.tensor([[-3.0], [-2.0], [-1.0]], dtype=DT)
    assert sc.spmm(g, x, "max").flatten().tolist() == [0.0, 0.0, -2.0]


def test_spmm_max_tie_between_sources_goes_to_smallest_id():
    # Documented in graph.Block: ties go to the smallest global source id.
    g = sc.Graph.from_edges(torch.tensor([3, 1, 2]), torch.tensor([0, 0, 0]), 4)
    x = torch.tensor([[0.0], [5.0], [1.0], [5.0]], dtype=DT, requires_grad=True)
    out = sc.spmm(g, x, "max")
    (gx,) = torch.autograd.grad(out, x, torch.ones_like(out))
    assert gx.flatten().tolist() == [0.0, 1.0, 0.0, 0.0]


def test_spmm_keeps_dtype():
    g = sc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    for reduce in ("sum", "mean", "max", "min"):
        assert sc.spmm(g, torch.randn(2, 3), reduce).dtype == torch.float32


# -- sddmm --------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["add", "sub", "mul", "dot"])
@given(graphs())
@SETTINGS
def test_sddmm(op, data):
    src, dst, n, seed = data
    g = sc.Graph.from_edges(src, dst, n)
    gen = torch.Generator().manual_seed(seed)
    for tail in [(F_,), (H_, F_)]:
        a, b = rand(gen, n, *tail), rand(gen, n, *tail)
        out = sc.sddmm(g, a, b, op)
        expected_shape = (src.numel(), *tail[:-1]) if op == "dot" else (src.numel(), *tail)
        assert out.shape == expected_shape
        check(out, ref_sddmm(src, dst, n, a, b, op), [a, b], gen)


def test_sddmm_small_by_hand():
    g = sc.Graph.from_edges(torch.tensor([0, 2, 1, 1]), torch.tensor([1, 1, 1, 2]), 3)
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=DT)
    b = torch.tensor([[10.0, 20.0], [30.0, 40.0], [50.0, 60.0]], dtype=DT)
    # edges in given order: 0->1, 2->1, 1->1, 1->2
    assert sc.sddmm(g, a, b, "sub").tolist() == [[-29, -38], [-25, -34], [-27, -36], [-47, -56]]
    assert sc.sddmm(g, a, b, "dot").tolist() == [110.0, 390.0, 250.0, 390.0]
    assert sc.sddmm(g, a, b).tolist() == sc.sddmm(g, a, b, "add").tolist()  # default op is add


# -- edge_softmax -------------------------------------------------------------------------------


@given(graphs())
@SETTINGS
def test_edge_softmax(data):
    src, dst, n, seed = data
    g = sc.Graph.from_edges(src, dst, n)
    gen = torch.Generator().manual_seed(seed)
    E = src.numel()
    for tail in [(), (H_,)]:
        e = rand(gen, E, *tail) * 3
        out = sc.edge_softmax(g, e)
        assert out.shape == e.shape
        check(out, ref_edge_softmax(src, dst, n, e), [e], gen)
        # sums to one over the in-edges of every node that has some
        total = torch.zeros(n, *tail, dtype=DT).index_add_(0, dst, out.detach())
        has = g.in_degrees() > 0
        torch.testing.assert_close(total[has], torch.ones_like(total[has]))


def test_edge_softmax_large_scores_are_stable():
    g = sc.Graph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([2, 2, 2]), 3)
    out = sc.edge_softmax(g, torch.tensor([1000.0, 1000.0, -1000.0], dtype=DT))
    torch.testing.assert_close(out, torch.tensor([0.5, 0.5, 0.0], dtype=DT))


@given(graphs())
@SETTINGS
def test_attention_pipeline(data):
    """sddmm -> edge_softmax -> weighted spmm with heads, as a GAT layer does."""
    src, dst, n, seed = data
    g = sc.Graph.from_edges(src, dst, n)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = rand(gen, n, H_, F_), rand(gen, n, H_, F_), rand(gen, n, H_, F_)
    out = sc.spmm(g, v, "sum", edge_weight=sc.edge_softmax(g, sc.sddmm(g, k, q, "dot")))
    ref = ref_spmm(src, dst, n, v, "sum", ref_edge_softmax(src, dst, n, ref_sddmm(src, dst, n, k, q, "dot")))
    check(out, ref, [q, k, v], gen)


# -- errors -------------------------------------------------------------------------------------


@pytest.fixture
def small():
    g = sc.Graph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 4)
    return g, torch.randn(4, 3), torch.randn(3)


def test_error_bad_reduce(small):
    g, x, _ = small
    with pytest.raises(GraphError, match=r"reduce must be one of.*'prod'"):
        sc.spmm(g, x, reduce="prod")


def test_error_max_with_edge_weight(small):
    g, x, w = small
    with pytest.raises(GraphError, match=r"max.*edge_weight"):
        sc.spmm(g, x, "max", edge_weight=w)


def test_error_bad_sddmm_op(small):
    g, x, _ = small
    with pytest.raises(GraphError, match=r"op must be one of.*'pow'"):
        sc.sddmm(g, x, x, op="pow")


def test_error_wrong_row_counts(small):
    g, x, w = small
    with pytest.raises(GraphError, match=r"x has 5 rows but the graph needs 4"):
        sc.spmm(g, torch.randn(5, 3), "sum")
    with pytest.raises(GraphError, match=r"x has 3 rows but the graph needs 4"):
        sc.spmm(g, torch.randn(3, 3), "max")
    with pytest.raises(GraphError, match=r"edge_weight has 4 rows but the graph needs 3"):
        sc.spmm(g, x, "sum", edge_weight=torch.randn(4))
    with pytest.raises(GraphError, match=r"\ba has 2 rows but the graph needs 4"):
        sc.sddmm(g, torch.randn(2, 3), x, "dot")
    with pytest.raises(GraphError, match=r"\bb has 6 rows but the graph needs 4"):
        sc.sddmm(g, x, torch.randn(6, 3), "add")
    with pytest.raises(GraphError, match=r"\be has 4 rows but the graph needs 3"):
        sc.edge_softmax(g, torch.randn(4))


@pytest.mark.parametrize(
    "not_a_graph, name",
    [
        (torch.tensor([[0, 1], [1, 2]]), "Tensor"),
        ((torch.tensor([0]), torch.tensor([1])), "tuple"),
        (nx.path_graph(4), "Graph"),
        (None, "NoneType"),
    ],
)
def test_error_non_graph_first_argument(small, not_a_graph, name):
    _, x, _ = small
    pat = rf"first argument.*sarcompile Graph.*got {name}.*from_edges"
    with pytest.raises(GraphError, match=pat):
        sc.spmm(not_a_graph, x)
    with pytest.raises(GraphError, match=pat):
        sc.sddmm(not_a_graph, x, x)
    with pytest.raises(GraphError, match=pat):
        sc.edge_softmax(not_a_graph, torch.randn(3))


def test_error_raised_at_trace_time():
    class Bad(torch.nn.Module):
        def forward(self, g, x):
            return sc.spmm(g, x, reduce="prod")

    with pytest.raises(GraphError, match="prod"):
        torch.fx.symbolic_trace(Bad())


# -- torch.fx: one node per op call -------------------------------------------------------------

from sarcompile.ir.ops import edge_softmax, sddmm, spmm  # noqa: E402  (imported by name on purpose)


class ByName(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3).double()

    def forward(self, g, x):
        h = spmm(g, x, "sum") + spmm(g, x, reduce="mean")
        h = self.lin(h) + spmm(g, torch.relu(x), "max")
        e = sddmm(g, h, x, op="dot")
        a = edge_softmax(g, e)
        return spmm(g, h, "sum", edge_weight=a) + sddmm(g, x, h, "mul").sum() * 0


class ByModule(torch.nn.Module):
    def forward(self, g, x):
        e = sc.sddmm(g, x, x, "add").sum(-1)
        return sc.ops.spmm(g, x, "mean", edge_weight=sc.edge_softmax(g, e))


def op_nodes(gm):
    reg = sc.ops.registry()
    return [n.target.__name__ for n in gm.graph.nodes if n.op == "call_function" and n.target in reg]


def test_registry_holds_the_public_ops():
    reg = sc.ops.registry()
    assert {spmm, sddmm, edge_softmax} <= set(reg)
    assert sc.spmm is spmm and sc.ops.spmm is spmm
    assert {reg[f].name for f in (spmm, sddmm, edge_softmax)} == {"spmm", "sddmm", "edge_softmax"}


@pytest.mark.parametrize(
    "model, expected",
    [
        (ByName, ["spmm", "spmm", "spmm", "sddmm", "edge_softmax", "spmm", "sddmm"]),
        (ByModule, ["sddmm", "edge_softmax", "spmm"]),
    ],
)
def test_fx_trace_one_node_per_op(model, expected):
    m = model()
    gm = torch.fx.symbolic_trace(m)
    assert op_nodes(gm) == expected
    # every op node targets the registered public op, nothing from inside it leaks out
    reg = sc.ops.registry()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in reg:
            assert node.target is reg[node.target].fn
    targets = {str(n.target) for n in gm.graph.nodes}
    assert not any("scatter" in t or "index_add" in t or "sparse" in t for t in targets)
    # the traced module computes the same as the eager one
    g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2, 3]), torch.tensor([1, 2, 0, 0, 3]), 5)
    x = torch.randn(5, 3, dtype=DT)
    torch.testing.assert_close(gm(g, x), m(g, x))


def test_fx_trace_with_sarcompile_tracer():
    from sarcompile.compile.trace import trace

    gm = trace(ByName())
    assert op_nodes(gm) == ["spmm", "spmm", "spmm", "sddmm", "edge_softmax", "spmm", "sddmm"]


def test_edge_weight_gradient_in_chunks(monkeypatch):
    """The edge-weight gradient works through the edges in chunks; any chunk size agrees."""
    from sarcompile.codegen import torch_kernels

    gen = torch.Generator().manual_seed(3)
    n, e = 30, 200
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    g = sc.Graph.from_edges(src, dst, n)
    for xtail, wtail in [((F_,), ()), ((H_, F_), (H_,))]:
        x, w = rand(gen, n, *xtail), rand(gen, e, *wtail)
        want = torch.autograd.grad(sc.spmm(g, x, "sum", edge_weight=w).sum(), (x, w))
        monkeypatch.setattr(torch_kernels, "EDGE_CHUNK_ELEMENTS", 7)  # several edges per chunk, many chunks
        got = torch.autograd.grad(sc.spmm(g, x, "sum", edge_weight=w).sum(), (x, w))
        monkeypatch.undo()
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)


# -- message_passing ---------------------------------------------------------------------------
class _EdgeMLP(torch.nn.Module):
    """EdgeConv-style message with edge features: MLP(x_i, x_j - x_i, e)."""

    def __init__(self, f: int, fe: int, out: int):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(2 * f + fe, 7), torch.nn.Tanh(), torch.nn.Linear(7, out))

    def forward(self, x_j, x_i, e):
        return self.mlp(torch.cat([x_i, x_j - x_i, e], dim=-1))


def ref_message_passing(src, dst, n, fn, x, e, reduce):
    """Loop over nodes: reduce the messages of each node's in-edges, one edge at a time."""
    rows = []
    for v in range(n):
        idx = [i for i in range(dst.numel()) if int(dst[i]) == v]
        msgs = [fn(x[src[i]][None], x[v][None], e[i][None])[0] for i in idx]
        if not msgs:
            rows.append(torch.zeros(fn.mlp[-1].out_features, dtype=x.dtype))
        elif reduce == "max":
            rows.append(torch.stack(msgs).max(dim=0).values)
        else:
            total = torch.stack(msgs).sum(0)
            rows.append(total / len(msgs) if reduce == "mean" else total)
    return torch.stack(rows)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@given(graphs(max_nodes=12, max_edges=30))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_message_passing(reduce, data):
    src, dst, n, seed = data
    torch.manual_seed(seed % 2**16)
    fn = _EdgeMLP(3, 2, 4).double()
    gen = torch.Generator().manual_seed(seed)
    x, e = rand(gen, n, 3), rand(gen, src.numel(), 2)
    out = sc.ops.message_passing(sc.Graph.from_edges(src, dst, n), fn, x, e, reduce)
    check(out, ref_message_passing(src, dst, n, fn, x, e, reduce), [x, e, *fn.parameters()], gen)


def test_message_passing_errors(small):
    g, x, _ = small
    fn = _EdgeMLP(x.shape[1], 0, 2)
    with pytest.raises(GraphError, match="reduce must be one of"):
        sc.ops.message_passing(g, fn, x, None, "min")
    with pytest.raises(GraphError, match=r"torch.nn.Module"):
        sc.ops.message_passing(g, lambda xj, xi, e: xj, x, None, "sum")
    with pytest.raises(GraphError, match="Dropout.*recomputes"):
        sc.ops.message_passing(g, torch.nn.Sequential(torch.nn.Dropout(0.5)), x, None, "sum")


def test_gather_table_reads_rows_by_global_id_on_every_shard():
    """A table with a row per node of the whole graph (LINKX's embedding), read per edge:
    on each shard, edge by edge, what the whole graph reads for the same global edge."""
    from sarcompile.graph.shard import ShardGraph, split_graph

    gen = torch.Generator().manual_seed(3)
    n = 12
    src, dst = torch.randint(0, n, (40,), generator=gen), torch.randint(0, n, (40,), generator=gen)
    g = sc.Graph.from_edges(src, dst, n)
    table = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    for end, ids in (("src", src), ("dst", dst)):
        torch.testing.assert_close(sc.ops.gather_table(g, table, end), table[ids])
        parts = split_graph(g, torch.randint(0, 3, (n,), generator=gen), 3)
        for rank, part in enumerate(parts):
            shard = ShardGraph.from_part(part, rank, 3, n, g.num_edges)
            got = sc.ops.gather_table(shard, table, end)
            torch.testing.assert_close(got, table[ids[shard.edge_ids]])
    with pytest.raises(GraphError, match="one row per node of the whole graph"):
        sc.ops.gather_table(g, table[:5], "src")
