"""Kept aggregations of the input on N real gloo workers: the single-machine values and
gradients step after step; no forward exchange while the input stays; and when one
worker's rows change in place, every worker computes (and exchanges) again -- none waits
on a peer that skipped it."""

from __future__ import annotations

import pytest
import torch
from cases import ReusedInputs, make_model, run_reused_steps
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import graphs

import sarcompile as sc
from sarcompile.graph.shard import split_graph

TOL = 1e-9
CHANGES = ["first", "same", "double", "same", "new", "same"]


def eager(g: sc.Graph, x: torch.Tensor, w: torch.Tensor, seed: int) -> tuple[torch.Tensor, dict]:
    """The oracle: the model run eagerly on the whole graph (no compiler, nothing kept)."""
    model = make_model("reused", seed)
    out = model(g, x)
    (out * w).sum().backward()
    return out.detach(), {k: p.grad for k, p in model.named_parameters()}


@given(data=st.data())
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
def test_workers_reuse_together_and_stay_exact(pool, data):
    """Also with 1-bit compression asked for: a kept result is made once, exactly (the
    bytes of the first step are the exact ones)."""
    world_size = data.draw(st.sampled_from([2, 3]))
    options = data.draw(st.sampled_from([{}, {"compress": "1bit"}]))
    src, dst, n, seed = data.draw(graphs(max_nodes=24, max_edges=80))
    gen = torch.Generator().manual_seed(seed % 2**16)
    g = sc.Graph.from_edges(src, dst, n)
    x = torch.randn(n, 6, generator=gen, dtype=torch.float64)
    w = torch.randn(n, 1, generator=gen, dtype=torch.float64)
    assignment = torch.tensor(data.draw(st.lists(st.integers(0, world_size - 1), min_size=n, max_size=n)))
    changed = torch.nonzero(assignment == world_size - 1).flatten()  # the last worker's rows: maybe none
    parts = split_graph(g, assignment, world_size, {"x": x, "w": w})
    jobs = [{"part": p, "model": "reused", "seed": seed % 2**16, "changes": CHANGES, "changed": changed,
             "num_nodes": n, "num_edges": g.num_edges, "options": options} for p in parts]
    results = pool(world_size).run(run_reused_steps, jobs)
    first_bytes = None
    for t, change in enumerate(CHANGES):
        if change == "double":
            x[changed] *= 2
        want_out, want_grads = eager(g, x, w, seed % 2**16)
        for p, r in zip(parts, results):
            step = r[t]
            scale = max(1.0, float(want_out.abs().max()) if n else 1.0)
            torch.testing.assert_close(step["out"], want_out[p.global_ids], atol=TOL * scale, rtol=0)
            for k, grad in want_grads.items():
                torch.testing.assert_close(step["grads"][k], grad, atol=TOL * scale, rtol=0, msg=k)
        received = [r[t]["bytes"]["received"].get("forward", 0) for r in results]
        if change == "first":
            first_bytes = received
            # every halo row of x (6 float64) for each of the three aggregations: exact, not packed
            halo = [sum(len(q.send_index[r]) for i, q in enumerate(parts) if i != r) for r in range(world_size)]
            assert received == [3 * 6 * 8 * h for h in halo], (received, halo)
        # Kept while nobody's input changed; else every worker receives its halo again.
        computed = change in ("first", "new") or (change == "double" and changed.numel() > 0)
        assert received == (first_bytes if computed else [0] * world_size), (change, received)


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_plan_counts_the_first_steps_exchange_only(world_size):
    g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 3, 4, 5]), torch.tensor([1, 2, 3, 4, 5, 0]), 6)
    x = torch.randn(6, 6, dtype=torch.float64)
    plan = sc.distribute(ReusedInputs().double()).plan(g, world_size, x=x, method=torch.arange(6) % world_size)
    assert [(op.op, op.reused) for op in plan.ops] == [("spmm(mean)", True), ("spmm(sum)", True), ("spmm(max)", True)]
    assert "direct, reused" in str(plan)
    assert plan.forward_bytes(0) == 0 and plan.backward_bytes(0) == 0
    assert all("received in the first step only" in op.reason for op in plan.ops)
    grad = sc.distribute(ReusedInputs().double()).plan(g, world_size, x=x.requires_grad_(),
                                                       method=torch.arange(6) % world_size)
    assert not any(op.reused for op in grad.ops) and "reused" not in str(grad)
    packed = sc.distribute(ReusedInputs().double(), compress="1bit").plan(g, world_size, x=x.detach(),
                                                                         method=torch.arange(6) % world_size)
    assert all(op.reused and not op.comm for op in packed.ops)  # made exactly, once
    assert grad.forward_bytes(0) == (3 * 6 * 8 * 3 if world_size == 2 else 0)  # per op, 3 halo rows of 6 float64
