"""N real gloo workers reproduce the single-machine outputs and gradients exactly."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sarcompile as sc
from cases import Case, gather_rows, payloads, run_worker, single_machine

TOL = 1e-9  # float64 everywhere: the only differences are summation order


@st.composite
def cases(draw, world_size: int, models=("mix", "edge"), modes=("sar",)):
    n = draw(st.integers(1, 24))
    e = draw(st.integers(0, 80))
    src = draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e))
    dst = draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e))
    if draw(st.booleans()) and n > 1:  # a hub: skewed degrees
        src += list(range(n)) * 2
        dst += [0] * (2 * n)
    kind = draw(st.sampled_from(["random", "contiguous", "one-part"]))
    if kind == "random":
        assignment = torch.tensor(draw(st.lists(st.integers(0, world_size - 1), min_size=n, max_size=n)))
    elif kind == "contiguous":
        assignment = torch.arange(n) * world_size // n
    else:  # every node on one worker: the others are empty
        assignment = torch.full((n,), draw(st.integers(0, world_size - 1)))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    g = sc.Graph.from_edges(torch.tensor(src, dtype=torch.long), torch.tensor(dst, dtype=torch.long), n)
    return Case(
        graph=g,
        assignment=assignment,
        model=draw(st.sampled_from(models)),
        seed=seed,
        x=torch.randn(n, 6, generator=gen, dtype=torch.float64),
        loss_weight=torch.randn(n, 1, generator=gen, dtype=torch.float64),
        mode=draw(st.sampled_from(modes)),
    )


def check(case: Case, world_size: int, pool) -> list:
    want = single_machine(case)
    results = pool(world_size).run(run_worker, payloads(case, world_size))
    out = gather_rows(case, world_size, results, "out")
    x_grad = gather_rows(case, world_size, results, "x_grad")
    scale = max(1.0, float(want.out.abs().max()) if want.out.numel() else 1.0)
    torch.testing.assert_close(out, want.out, atol=TOL * scale, rtol=0)
    torch.testing.assert_close(x_grad, want.x_grad, atol=TOL * scale, rtol=0)
    for r in results:  # every worker holds the same, global, parameter gradient
        assert r.param_grads.keys() == want.param_grads.keys()
        for k, g in want.param_grads.items():
            torch.testing.assert_close(r.param_grads[k], g, atol=TOL * scale, rtol=0, msg=k)
    return results


SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))


@given(data=st.data())
@SETTINGS
def test_two_workers_all_modes(pool, data):
    check(data.draw(cases(2, modes=("sar", "stash", "oneshot"))), 2, pool)
