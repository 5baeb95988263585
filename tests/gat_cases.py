"""GAT layers made alike in sarcompile and PyG, and their comparison: the GAT tests and the
CPU attention kernels' tests."""

from __future__ import annotations

import torch
import torch_geometric.nn as pyg_nn

import sarcompile as sc

DT = torch.float64


def make_gat(f_in, out, heads, concat, slope, residual, seed, dropout=0.0, bias=True):
    """(ours, theirs) with the same weights; the bias is random so its gradient shows."""
    torch.manual_seed(seed)
    ours = sc.nn.GATConv(
        f_in, out, heads=heads, concat=concat, negative_slope=slope, dropout=dropout,
        add_self_loops=True, bias=bias, residual=residual, seed=seed,
    ).double()
    theirs = pyg_nn.GATConv(
        f_in, out, heads=heads, concat=concat, negative_slope=slope, dropout=dropout, bias=bias, residual=residual
    ).double()
    ours_p, theirs_p = dict(ours.named_parameters()), dict(theirs.named_parameters())
    assert set(ours_p) == set(theirs_p), (sorted(ours_p), sorted(theirs_p))
    with torch.no_grad():
        if bias:
            ours.bias.normal_()
        for name, p in ours_p.items():
            assert theirs_p[name].shape == p.shape, name
            theirs_p[name].copy_(p)
    assert {k for k, _ in ours.named_buffers()} == {"attn_drop.seed", "attn_drop.step"}
    return ours, theirs


def compare_gat_with_pyg(ours, theirs, src, dst, n, f_in, seed):
    """Eager sc, compiled sc (fused) and PyG: same outputs and gradients."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f_in, generator=gen, dtype=DT)
    g = sc.Graph.from_edges(src, dst, n)
    edge_index = torch.stack([src, dst])
    width = ours.heads * ours.out_dim if ours.concat else ours.out_dim
    go = torch.randn(n, width, generator=gen, dtype=DT)

    expected = run_with_grads(lambda x: theirs(x, edge_index), theirs, x, go)
    assert_same(run_with_grads(lambda x: ours(g, x), ours, x, go), expected)
    dm = sc.distribute(ours)
    assert_same(run_with_grads(lambda x: dm(g, x), ours, x, go), expected)
    # the compiled program really is the fused one
    targets = [nd.target for nd in dm.program(False).module.graph.nodes if nd.op == "call_function"]
    assert targets.count(sc.ops.attention) == 1
    assert not {sc.sddmm, sc.edge_softmax, sc.spmm} & set(targets)



def run_with_grads(fn, module, x, go):
    """Output and gradients (of x and of every parameter of ``module``) of ``fn(x)``."""
    x = x.clone().requires_grad_()
    out = fn(x)
    names = [k for k, _ in module.named_parameters()]
    params = [p for _, p in module.named_parameters()]
    grads = torch.autograd.grad(out, [x, *params], go, allow_unused=True, materialize_grads=True)
    return out, dict(zip(["x", *names], grads))


def assert_same(res1, res2):
    out1, g1 = res1
    out2, g2 = res2
    torch.testing.assert_close(out1, out2)
    assert g1.keys() == g2.keys()
    for k in g1:
        torch.testing.assert_close(g1[k], g2[k], msg=lambda m, k=k: f"gradient of {k}: {m}")
