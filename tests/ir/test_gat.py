"""GAT: sc.nn.GATConv against PyG's GATConv (eager and compiled through the fuse pass),
attention dropout keyed by edge id, the fused ``sc.ops.attention`` against the unfused
chain of IR ops, and the online-softmax kernel (``AttentionState``/``attention_grads``)
over several blocks."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import graphs

import sarcompile as sc
from sarcompile.codegen.torch_kernels import AttentionState, attention_grads
from sarcompile.graph.graph import Block
from sarcompile.ir.ops import edge_dropout, edge_softmax, sddmm, spmm
from sarcompile.graph.shard import ShardGraph, split_graph
from gat_cases import DT, assert_same, compare_gat_with_pyg, make_gat, run_with_grads

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- helpers ------------------------------------------------------------------------------------


def hub_graph(deg: int = 320):
    """A node (4) with in-degree ``deg`` (multi-edges and a self-loop among them), a few
    other edges and self-loops, and isolated nodes (20, 21)."""
    gen = torch.Generator().manual_seed(7)
    src = torch.cat([torch.randint(0, 20, (deg,), generator=gen), torch.tensor([1, 2, 3, 3, 5, 4, 4])])
    dst = torch.cat([torch.full((deg,), 4), torch.tensor([1, 0, 3, 2, 6, 4, 9])])
    return src, dst, 22


# -- GATConv vs PyG -----------------------------------------------------------------------------


@given(
    graphs(),
    st.integers(1, 8),
    st.booleans(),
    st.floats(0.0, 0.9, allow_subnormal=False),
    st.booleans(),
    st.integers(1, 4),
)
@SETTINGS
def test_gat_matches_pyg(data, heads, concat, slope, residual, out_dim):
    src, dst, n, seed = data
    ours, theirs = make_gat(4, out_dim, heads, concat, slope, residual, seed)
    compare_gat_with_pyg(ours, theirs, src, dst, n, 4, seed)


@pytest.mark.parametrize(
    "heads, concat, slope, residual", [(1, True, 0.2, False), (8, True, 0.05, True), (5, False, 0.6, True)]
)
def test_gat_matches_pyg_on_hub(heads, concat, slope, residual):
    src, dst, n = hub_graph()
    assert int(torch.bincount(dst, minlength=n)[4]) >= 300
    ours, theirs = make_gat(5, 3, heads, concat, slope, residual, seed=heads)
    compare_gat_with_pyg(ours, theirs, src, dst, n, 5, seed=11)


def test_gat_isolated_node_attends_only_to_itself():
    # node 2 has no edges at all: with its one self-loop its output is lin(x)[2] (+ bias)
    src, dst, n = torch.tensor([0, 1, 1]), torch.tensor([1, 0, 1]), 3
    ours, theirs = make_gat(3, 2, 4, True, 0.2, False, seed=0)
    compare_gat_with_pyg(ours, theirs, src, dst, n, 3, seed=0)
    x = torch.randn(n, 3, dtype=DT)
    g = sc.Graph.from_edges(src, dst, n)
    torch.testing.assert_close(ours(g, x)[2], ours.lin(x)[2] + ours.bias)
    torch.testing.assert_close(sc.distribute(ours)(g, x)[2], ours.lin(x)[2] + ours.bias)


def test_gat_without_bias_and_without_self_loops():
    src, dst, n = hub_graph(40)
    ours, theirs = make_gat(4, 3, 2, True, 0.2, False, seed=3, bias=False)
    assert ours.bias is None
    compare_gat_with_pyg(ours, theirs, src, dst, n, 4, seed=3)
    # add_self_loops=False: a node without in-edges gets 0 from the attention
    torch.manual_seed(0)
    layer = sc.nn.GATConv(4, 3, heads=2, add_self_loops=False, bias=False).double()
    g = sc.Graph.from_edges(src, dst, n)
    x = torch.randn(n, 4, dtype=DT)
    out = layer(g, x)
    torch.testing.assert_close(sc.distribute(layer)(g, x), out)
    assert torch.equal(out[20], torch.zeros(6, dtype=DT))


@pytest.mark.parametrize("concat", [True, False])
def test_compiled_eval_matches_pyg_with_dropout(concat):
    src, dst, n = hub_graph(60)
    ours, theirs = make_gat(4, 3, 3, concat, 0.2, True, seed=5, dropout=0.5)
    ours.eval()
    theirs.eval()
    compare_gat_with_pyg(ours, theirs, src, dst, n, 4, seed=5)
    assert int(ours.attn_drop.step) == 0  # eval calls draw no mask
    # the same module, switched back to training, drops attention (it differs from PyG's eval)
    dm = sc.distribute(ours)
    g = sc.Graph.from_edges(src, dst, n)
    x = torch.randn(n, 4, dtype=DT)
    ours.train()
    assert not torch.allclose(dm(g, x), theirs(x, torch.stack([src, dst])))
    ours.eval()
    torch.testing.assert_close(dm(g, x), theirs(x, torch.stack([src, dst])))


# -- attention dropout --------------------------------------------------------------------------


def dropout_layer(seed=1234, heads=4, concat=True):
    torch.manual_seed(0)
    layer = sc.nn.GATConv(4, 3, heads=heads, concat=concat, dropout=0.5, residual=True, seed=seed).double()
    with torch.no_grad():
        layer.bias.normal_()
    return layer.train()


@pytest.mark.parametrize("concat", [True, False])
def test_attention_dropout_fused_equals_unfused(concat):
    src, dst, n = hub_graph(150)
    g = sc.Graph.from_edges(src, dst, n)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=gen, dtype=DT)
    compiled_layer = dropout_layer(concat=concat)
    eager = copy.deepcopy(compiled_layer)
    dm = sc.distribute(compiled_layer)
    width = 12 if concat else 3
    targets = None
    outs = []
    for step in (1, 2, 3):
        go = torch.randn(n, width, generator=gen, dtype=DT)
        fused = run_with_grads(lambda x: dm(g, x), compiled_layer, x, go)
        unfused = run_with_grads(lambda x: eager(g, x), eager, x, go)
        assert int(compiled_layer.attn_drop.step) == int(eager.attn_drop.step) == step
        assert_same(fused, unfused)
        outs.append(fused[0].detach())
        if targets is None:
            nodes = list(dm.program(False).module.graph.nodes)
            att = [nd for nd in nodes if nd.target is sc.ops.attention]
            assert len(att) == 1 and att[0].args[5] == 0.5
            targets = [nd.target for nd in nodes if nd.op == "call_function"]
            assert sc.ops.edge_dropout not in targets and sc.edge_softmax not in targets
    # successive training calls draw different masks
    assert not torch.allclose(outs[0], outs[1]) and not torch.allclose(outs[1], outs[2])
    # the same seed gives the same sequence of masks; another seed another one
    again = sc.distribute(dropout_layer(concat=concat))
    for o in outs:
        torch.testing.assert_close(again(g, x), o)
    assert not torch.allclose(sc.distribute(dropout_layer(seed=99, concat=concat))(g, x), outs[0])
    # dropout really drops: the training output differs from the eval one
    compiled_layer.eval()
    assert not torch.allclose(dm(g, x), outs[-1])


def test_attention_dropout_does_not_depend_on_edge_order():
    """The mask is a function of (seed, step, edge id, head): permuting how the edges are
    stored (keeping each edge's id) gives the same outputs per node, eager and fused."""
    src, dst, n = hub_graph(150)
    g = sc.Graph.from_edges(src, dst, n)
    perm = torch.randperm(src.numel(), generator=torch.Generator().manual_seed(3))
    gp = sc.Graph.from_edges(src[perm], dst[perm], n)
    gp.edge_ids = perm.clone()  # edge i of gp is edge perm[i] of g
    x = torch.randn(n, 4, dtype=DT)
    go = torch.randn(n, 12, dtype=DT)
    ref = dropout_layer()
    expected = [run_with_grads(lambda x: ref(g, x), ref, x, go) for _ in range(2)]
    for make in (lambda m: m, sc.distribute):
        layer = dropout_layer()
        model = make(layer)
        for exp in expected:
            assert_same(run_with_grads(lambda x, model=model: model(gp, x), layer, x, go), exp)


def test_edge_dropout_mask_is_the_same_on_any_split():
    """edge_dropout on the shards of a 3-way split (with_self_loops) draws, for every
    edge id, what the whole graph draws."""
    src, dst, n = hub_graph(60)
    g = sc.Graph.from_edges(src, dst, n)
    gs = g.with_self_loops()
    salt = torch.tensor(987654)
    full = edge_dropout(gs, torch.ones(gs.num_edges, 3, dtype=DT), 0.5, salt)
    assert 0 < int((full == 0).sum()) < full.numel()
    by_id = dict(zip(gs.edge_ids.tolist(), full))
    assignment = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(0))
    seen = 0
    for r, part in enumerate(split_graph(g, assignment, 3)):
        shard = ShardGraph.from_part(part, r, 3, n, g.num_edges).with_self_loops()
        mask = edge_dropout(shard, torch.ones(shard.num_edges, 3, dtype=DT), 0.5, salt)
        for eid, row in zip(shard.edge_ids.tolist(), mask):
            torch.testing.assert_close(row, by_id[eid])
            seen += 1
    assert seen == gs.num_edges


# -- sc.ops.attention vs the unfused chain ------------------------------------------------------


def chain(g, h, a_src, a_dst, slope, p, salt, a_edge=None):
    score = sddmm(g, a_src, a_dst, "add")
    score = F.leaky_relu(score if a_edge is None else score + a_edge, slope)
    return spmm(g, h, "sum", edge_weight=edge_dropout(g, edge_softmax(g, score), p, salt))


SHAPES = {"heads": ((3,), (3, 4)), "single": ((), (5,)), "shared_score": ((1,), (4, 2))}


def attention_inputs(n, shape, seed):
    a_tail, h_tail = SHAPES[shape]
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, *h_tail, generator=gen, dtype=DT)
    a_src = 2 * torch.randn(n, *a_tail, generator=gen, dtype=DT)
    a_dst = 2 * torch.randn(n, *a_tail, generator=gen, dtype=DT)
    go = torch.randn(n, *h_tail, generator=gen, dtype=DT)
    return h, a_src, a_dst, go


def attention_and_grads(fn, g, h, a_src, a_dst, go, a_edge=None):
    ins = [t.clone().requires_grad_() for t in (h, a_src, a_dst, a_edge) if t is not None]
    out = fn(g, *ins)
    return out, torch.autograd.grad(out, ins, go, allow_unused=True, materialize_grads=True)


def compare_attention(g, h, a_src, a_dst, go, slope, p, salt, a_edge=None):
    """The fused op against the chain of IR ops: output, gradients of h, a_src, a_dst
    (and a_edge)."""
    fused = attention_and_grads(
        lambda g, h, s, d, *e: sc.ops.attention(g, h, s, d, slope, p, salt, *e), g, h, a_src, a_dst, go, a_edge
    )
    ref = attention_and_grads(lambda g, h, s, d, *e: chain(g, h, s, d, slope, p, salt, *e), g, h, a_src, a_dst, go, a_edge)
    torch.testing.assert_close(fused[0], ref[0])
    for name, a, b in zip(("h", "a_src", "a_dst", "a_edge"), fused[1], ref[1]):
        torch.testing.assert_close(a, b, msg=lambda m, name=name: f"gradient of {name}: {m}")
    return fused


@pytest.mark.parametrize("shape", sorted(SHAPES))
@given(graphs(), st.floats(-1.0, 2.0, allow_subnormal=False), st.sampled_from([0.0, 0.3, 0.5]), st.integers(0, 2**31 - 1))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_attention_op_equals_chain(shape, data, slope, p, salt):
    src, dst, n, seed = data
    g = sc.Graph.from_edges(src, dst, n)
    h, a_src, a_dst, go = attention_inputs(n, shape, seed)
    compare_attention(g, h, a_src, a_dst, go, slope, p, torch.tensor(salt))
    # and on the graph with one self-loop per node
    compare_attention(g.with_self_loops(), h, a_src, a_dst, go, slope, p, torch.tensor(salt))


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("edge_shape", ["per_edge", "broadcast"])
@given(graphs(), st.floats(-1.0, 2.0, allow_subnormal=False), st.sampled_from([0.0, 0.5]), st.integers(0, 2**31 - 1))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_attention_op_with_edge_scores_equals_chain(shape, edge_shape, data, slope, p, salt):
    """A per-edge score added before the leaky ReLU (edges in the order given, not CSR);
    one that broadcasts (a score per head for all edges) runs as the chain itself."""
    src, dst, n, seed = data
    g = sc.Graph.from_edges(src, dst, n)
    h, a_src, a_dst, go = attention_inputs(n, shape, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    for graph in (g, g.with_self_loops()):
        rows = (graph.num_edges,) if edge_shape == "per_edge" else ()
        a_edge = 3 * torch.randn((*rows, *a_src.shape[1:]), generator=gen, dtype=DT)
        compare_attention(graph, h, a_src, a_dst, go, slope, p, torch.tensor(salt), a_edge)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("p", [0.0, 0.5])
def test_attention_op_nodes_without_in_edges(shape, p):
    """No self-loops; nodes 7..9 have no in-edges (8, 9 are isolated): output 0, and the
    gradients of h, a_src (nodes without out-edges) and a_dst there are 0."""
    gen = torch.Generator().manual_seed(1)
    src = torch.cat([torch.randint(0, 8, (40,), generator=gen), torch.arange(7)])
    dst = torch.cat([torch.randint(0, 7, (40,), generator=gen), (torch.arange(7) + 1) % 7])
    g = sc.Graph.from_edges(src, dst, 10).remove_self_loops()
    n = 10
    h, a_src, a_dst, go = attention_inputs(n, shape, 2)
    out, (gh, gs, gd) = compare_attention(g, h, a_src, a_dst, go, 0.2, p, torch.tensor(5))
    no_in = torch.bincount(g.dst, minlength=n) == 0
    no_out = torch.bincount(g.src, minlength=n) == 0
    assert no_in.tolist() == [False] * 7 + [True] * 3
    assert no_out[8:].all() and not no_out[:7].any()
    assert torch.equal(out[no_in], torch.zeros_like(out[no_in]))
    assert torch.equal(gd[no_in], torch.zeros_like(gd[no_in]))
    assert torch.equal(gh[no_out], torch.zeros_like(gh[no_out]))
    assert torch.equal(gs[no_out], torch.zeros_like(gs[no_out]))
    assert out[~no_in].abs().sum() > 0


def test_attention_op_on_a_graph_without_edges():
    g = sc.Graph.from_edges(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long), 4)
    h, a_src, a_dst, go = attention_inputs(4, "heads", 0)
    out, grads = compare_attention(g, h, a_src, a_dst, go, 0.2, 0.5, torch.tensor(1))
    assert torch.equal(out, torch.zeros_like(out))
    for t in grads:
        assert torch.equal(t, torch.zeros_like(t))


def test_attention_op_with_large_scores_is_stable():
    """Scores in the hundreds overflow a naive exp; the op subtracts the running max."""
    src, dst, n = hub_graph(80)
    g = sc.Graph.from_edges(src, dst, n).with_self_loops()
    h, a_src, a_dst, go = attention_inputs(n, "heads", 4)
    out, grads = compare_attention(g, h, 400 * a_src, 400 * a_dst, go, 0.2, 0.0, None)
    assert torch.isfinite(out).all() and all(torch.isfinite(t).all() for t in grads)


def test_attention_op_on_a_shard_with_permuted_rows():
    """A one-worker shard whose row i is node perm[i] (edge ids carried along): the fused
    op and the chain equal the whole graph's result, permuted, dropout included."""
    src, dst, n = hub_graph(60)
    g = sc.Graph.from_edges(src, dst, n).with_self_loops()
    h, a_src, a_dst, go = attention_inputs(n, "heads", 6)
    salt = torch.tensor(31337)
    full, full_grads = compare_attention(g, h, a_src, a_dst, go, 0.2, 0.5, salt)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    inv = torch.argsort(perm)
    gp = sc.Graph.from_edges(inv[g.src], inv[g.dst], n)
    block = gp.block
    block.src_gids = perm
    shard = ShardGraph(0, 1, perm, [block], [torch.empty(0, dtype=torch.long)], g.edge_ids[gp.csr_perm], n,
                       g.edge_id_space)
    out, grads = compare_attention(shard, h[perm], a_src[perm], a_dst[perm], go[perm], 0.2, 0.5, salt)
    torch.testing.assert_close(out, full[perm])
    for a, b in zip(grads, full_grads):
        torch.testing.assert_close(a, b[perm])


def test_attention_dropout_without_salt_is_the_same_for_every_shape():
    src, dst, n = hub_graph(30)
    g = sc.Graph.from_edges(src, dst, n)
    for shape in ("heads", "shared_score"):
        h, a_src, a_dst, _ = attention_inputs(n, shape, 0)
        expected = sc.ops.attention(g, h, a_src, a_dst, 0.2, 0.5, torch.tensor(0))
        torch.testing.assert_close(sc.ops.attention(g, h, a_src, a_dst, 0.2, 0.5), expected)


# -- the online softmax over several blocks -----------------------------------------------------

H, C = 2, 3


def three_blocks(big: float):
    """Three blocks into 3 destination rows. Row 0 has edges in every block: tiny scores
    in block 0, middling in block 1, the largest (``big``) only in block 2. Row 1 has
    edges in block 1 only; row 2 none at all."""
    gen = torch.Generator().manual_seed(0)
    # (indptr, col, num_src) per block; sources of block q are its own rows
    specs = [
        (torch.tensor([0, 4, 4, 4]), torch.tensor([0, 1, 2, 0]), 3),
        (torch.tensor([0, 3, 5, 5]), torch.tensor([1, 0, 1, 2, 0]), 3),
        (torch.tensor([0, 3, 3, 3]), torch.tensor([1, 0, 1]), 2),
    ]
    blocks, offset = [], 0
    for indptr, col, num_src in specs:
        blocks.append(Block(indptr, col, num_src, torch.arange(offset, offset + num_src)))
        offset += num_src
    h = [torch.randn(b.num_src, H, C, generator=gen, dtype=DT) for b in blocks]
    # source scores per block: block 0 tiny, block 1 around 0, block 2 holds the max
    a_src = [
        -3.0 - torch.rand(blocks[0].num_src, H, generator=gen, dtype=DT),
        torch.randn(blocks[1].num_src, H, generator=gen, dtype=DT),
        big - torch.rand(blocks[2].num_src, H, generator=gen, dtype=DT),
    ]
    a_src[2][1] = big  # the largest score arrives last
    return blocks, h, a_src


def edge_scores(blocks, a_src, a_dst, slope, a_edge=None):
    a_edge = a_edge or [0.0] * len(blocks)
    return [F.leaky_relu(s[b.col] + a_dst[b.row] + e, slope) for b, s, e in zip(blocks, a_src, a_edge)]


def dense_attention(blocks, h, scores, keep):
    """softmax over each row's in-edges of all blocks, weighting the (kept) h rows."""
    num_dst = blocks[0].num_dst
    out = torch.zeros(num_dst, H, C, dtype=DT)
    for v in range(num_dst):
        s = torch.cat([sc_[b.row == v] for b, sc_ in zip(blocks, scores)])
        if s.numel() == 0:
            continue
        hv = torch.cat([hb[b.col[b.row == v]] for b, hb in zip(blocks, h)])
        k = torch.ones_like(s) if keep is None else torch.cat([kb[b.row == v] for b, kb in zip(blocks, keep)])
        out[v] = (torch.softmax(s, 0).unsqueeze(-1) * k.unsqueeze(-1) * hv).sum(0)
    return out


def random_keep(blocks, seed):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.rand(b.num_edges, H, generator=gen) > 0.4).to(DT) / 0.6 for b in blocks]


@pytest.mark.parametrize("big", [2.5, 800.0])
@pytest.mark.parametrize("dropout", [False, True])
def test_attention_state_rescales_across_blocks(big, dropout):
    blocks, h, a_src = three_blocks(big)
    a_dst = torch.zeros(3, H, dtype=DT)
    scores = edge_scores(blocks, a_src, a_dst, 0.2)
    keep = random_keep(blocks, 1) if dropout else None
    state = AttentionState(3, H, C, DT)
    for q, b in enumerate(blocks):
        state.update(b, h[q], a_src[q], a_dst, 0.2, None if keep is None else keep[q])
    out, lse = state.result()
    expected = dense_attention(blocks, h, scores, keep)
    torch.testing.assert_close(out, expected)
    assert torch.equal(out[2], torch.zeros(H, C, dtype=DT))
    # lse is the log-sum-exp of each row's scores (0 for a row without edges)
    for v in range(2):
        s = torch.cat([sc_[b.row == v] for b, sc_ in zip(blocks, scores)])
        torch.testing.assert_close(lse[v], torch.logsumexp(s, 0))
    assert torch.equal(lse[2], torch.zeros(H, dtype=DT))
    if big == 2.5:
        # the first block matters: leaving it out changes row 0
        state2 = AttentionState(3, H, C, DT)
        for q in (1, 2):
            state2.update(blocks[q], h[q], a_src[q], a_dst, 0.2, None if keep is None else keep[q])
        assert not torch.allclose(state2.result()[0][0], out[0])
    # any block order gives the same result
    state3 = AttentionState(3, H, C, DT)
    for q in (2, 0, 1):
        state3.update(blocks[q], h[q], a_src[q], a_dst, 0.2, None if keep is None else keep[q])
    torch.testing.assert_close(state3.result()[0], out)


@pytest.mark.parametrize("slope", [0.2, 1.0])
@pytest.mark.parametrize("dropout", [False, True])
@pytest.mark.parametrize("edge_score", [False, True])
def test_attention_grads_over_blocks_equal_autograd(slope, dropout, edge_score):
    blocks, h, _ = three_blocks(2.5)
    gen = torch.Generator().manual_seed(2)
    # pre-activation scores from a_src (per block) + a_dst: block 0's sources tiny, block 2's large
    a_src = [
        -6.0 - torch.rand(blocks[0].num_src, H, generator=gen, dtype=DT),
        torch.randn(blocks[1].num_src, H, generator=gen, dtype=DT),
        3.0 + torch.rand(blocks[2].num_src, H, generator=gen, dtype=DT),
    ]
    a_dst = torch.randn(3, H, generator=gen, dtype=DT)
    keep = random_keep(blocks, 3) if dropout else None
    a_edge = [2 * torch.randn(b.num_edges, H, generator=gen, dtype=DT) for b in blocks] if edge_score else None
    d_out = torch.randn(3, H, C, generator=gen, dtype=DT)

    # autograd of the dense formula
    hs = [t.clone().requires_grad_() for t in h]
    ss = [t.clone().requires_grad_() for t in a_src]
    ad = a_dst.clone().requires_grad_()
    es = [t.clone().requires_grad_() for t in a_edge] if edge_score else []
    dense = dense_attention(blocks, hs, edge_scores(blocks, ss, ad, slope, es), keep)
    exp_grads = torch.autograd.grad(dense, [*hs, *ss, ad, *es], d_out)

    # forward with the online state, then backward block by block
    state = AttentionState(3, H, C, DT)
    for q, b in enumerate(blocks):
        state.update(b, h[q], a_src[q], a_dst, slope, None if keep is None else keep[q], es[q] if es else None)
    out, lse = state.result()
    torch.testing.assert_close(out, dense.detach())
    delta = (d_out * out).sum(-1)
    d_a_dst = torch.zeros_like(a_dst)
    for q, b in enumerate(blocks):
        d_h, d_src, d_dst, d_edge = attention_grads(
            b, h[q], a_src[q], a_dst, slope, None if keep is None else keep[q], lse, d_out, delta,
            a_edge[q] if edge_score else None,
        )
        torch.testing.assert_close(d_h, exp_grads[q], msg=lambda m, q=q: f"d_h of block {q}: {m}")
        torch.testing.assert_close(d_src, exp_grads[3 + q], msg=lambda m, q=q: f"d_a_src of block {q}: {m}")
        if edge_score:
            torch.testing.assert_close(d_edge, exp_grads[7 + q], msg=lambda m, q=q: f"d_a_edge of block {q}: {m}")
        else:
            assert d_edge is None
        d_a_dst += d_dst
    torch.testing.assert_close(d_a_dst, exp_grads[6])
    assert torch.equal(d_a_dst[2], torch.zeros(H, dtype=DT))


def _attention_inputs():
    g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2, 3]), torch.tensor([1, 2, 0, 3, 3]), 4)
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(4, 2, 3, generator=gen, requires_grad=True)
    a_src, a_dst = (torch.randn(4, 2, generator=gen, requires_grad=True) for _ in range(2))
    return g, h, a_src, a_dst


def test_attention_lets_its_output_go_so_a_second_backward_is_refused_clearly():
    g, h, a_src, a_dst = _attention_inputs()
    out = sc.ops.attention(g, h, a_src, a_dst)
    (out * 2).sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        out.sum().backward()


def test_attention_output_changed_in_place_is_refused_in_backward():
    g, h, a_src, a_dst = _attention_inputs()
    out = sc.ops.attention(g, h, a_src, a_dst)
    with torch.no_grad():
        out.mul_(2)  # hidden from autograd: what save_for_backward's version check would catch
    with pytest.raises(RuntimeError, match="modified in place"):
        out.sum().backward()
