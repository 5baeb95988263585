"""Opt-in communication reduction (runtime/link.py): the wire format, error feedback,
stale halos refreshed every K iterations, pipelined bounded staleness, compression."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from cases import (
    MODELS,
    Case,
    case_on_edges,
    gather_rows,
    make_model,
    payloads,
    run_iterations,
)

import sarcompile as sc
from sarcompile.runtime.link import Wire
from sarcompile.ir.vocab import LinkPolicy

TOL = 1e-9


# -- the wire ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("width", [1, 7, 64, 70])
def test_wire_round_trip_error_and_size(bits, width):
    rows = torch.randn(13, width, dtype=torch.float64) * torch.logspace(-3, 2, 13, dtype=torch.float64)[:, None]
    rows[3] = 0.5  # a constant row comes back exactly
    wire = Wire(LinkPolicy(0, "op", bits=bits), rank=0)
    sent = wire.encode(rows, "forward", 1, 0)
    assert sent.dtype == torch.uint8
    assert sent.numel() == 13 * (math.ceil(width * bits / 8) + 4)  # packed values + bf16 lo and scale
    assert sent.numel() == wire.wire_bytes(13, width, torch.float64)
    got = wire.decode(sent, 13, (width,), torch.float64)
    lo, hi = rows.min(1).values, rows.max(1).values
    step = (hi - lo) / (2**bits - 1)
    # half a step from rounding, plus bf16's relative error on lo and scale
    bound = step / 2 + 2**-8 * (lo.abs() + (2**bits - 1) * step) + 1e-12
    assert ((got - rows).abs() <= bound[:, None]).all()
    assert torch.equal(got[3], rows[3])


def test_uncompressed_wire_sends_the_rows():
    wire = Wire(LinkPolicy(0, "op", staleness=3), rank=0)
    rows = torch.randn(4, 5)
    assert torch.equal(wire.decode(wire.encode(rows, "forward", 1, 0), 4, (5,), rows.dtype), rows)


def test_exact_wire_is_the_identity():
    """Exact SAR's wire: what is sent is the rows themselves (of a tensor, or of columns);
    a block received is the block visited, counted alive from its post. An uncompressed
    link's wire sends and reads the same rows."""
    from sarcompile.dist.traffic import live
    from sarcompile.runtime.columns import Columns
    from sarcompile.runtime.link import EXACT

    src = torch.randn(1200, 300)
    rows = torch.randint(0, 1200, (1100,))
    sent = EXACT.gather(src, rows, "forward features", 1, 0)
    assert torch.equal(sent, src[rows])
    parts = Columns((src[:, :100], src[:, 100:]))
    assert torch.equal(EXACT.gather(parts, rows, "forward features", 1, 0), src[rows])
    assert EXACT.encode(sent, "backward gradients", 1, 0) is sent and EXACT.decode(sent, 1100, (300,), sent.dtype) is sent
    count = live.count
    block = EXACT.receive(1100, (300,), torch.float32, torch.device("cpu"))
    assert live.count == count + 1 and block.shape == (1100, 300)
    assert EXACT.block(block, 1100, (300,), block.dtype) is block
    plain = Wire(LinkPolicy(0, "op", staleness=3), rank=0)
    assert torch.equal(plain.gather(src, rows, "forward features", 1, 0), src[rows])
    got = plain.receive(7, (300,), torch.float32, torch.device("cpu"))
    assert live.count == count + 2 and plain.block(got, 7, (300,), got.dtype) is got


def test_error_feedback_makes_the_average_converge():
    """Sending the same rows again and again: with error feedback the receiver's running
    mean converges to the truth (error ~ 1/T); plain rounding repeats the same error, and
    the published stochastic rounding converges only like 1/sqrt(T)."""
    torch.manual_seed(0)
    rows = torch.randn(32, 48, dtype=torch.float64)

    def mean_error(policy: LinkPolicy, sends: int) -> float:
        wire = Wire(policy, rank=0)
        total = torch.zeros_like(rows)
        for t in range(sends):
            total += wire.decode(wire.encode(rows, "forward", 1, t), 32, (48,), rows.dtype)
        if policy.error_feedback:  # the residual stays within the rows' range: it never builds up
            span = (rows.max(1).values - rows.min(1).values)[:, None]
            assert (wire.residual[("forward", 1)].abs() <= span).all()
        return float((total / sends - rows).abs().max())

    ef = LinkPolicy(0, "op", bits=1, error_feedback=True)
    stochastic = LinkPolicy(0, "op", bits=1, error_feedback=False)
    once = mean_error(ef, 1)  # a single send: plain deterministic rounding, repeated forever
    assert mean_error(ef, 50) < once / 25
    assert mean_error(ef, 400) < once / 200  # ~ 1/T
    assert mean_error(ef, 400) < mean_error(stochastic, 400) / 20
    assert mean_error(stochastic, 400) < once / 4  # unbiased, but ~ 1/sqrt(T)


# -- on workers -------------------------------------------------------------------------------
def _case(model: str = "one_sage", seed: int = 0) -> Case:
    gen = torch.Generator().manual_seed(seed)
    n = 24
    src = torch.randint(0, n, (90,), generator=gen)
    dst = torch.randint(0, n, (90,), generator=gen)
    return case_on_edges(src, dst, n, model, seed, gen)


def _run(pool, case: Case, steps: int, **options) -> list[dict]:
    jobs = [dict(p, steps=steps, options=options) for p in payloads(case, 2)]
    return pool(2).run(run_iterations, jobs)


def _exact(case: Case, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The single-machine output and input gradient at step t (input x * (t + 1))."""
    model = sc.distribute(make_model(case.model, case.seed))
    x = (case.x * (t + 1)).requires_grad_(True)
    out = model(case.graph, x)
    (out * case.loss_weight).sum().backward()
    return out.detach(), x.grad


def _rows(case: Case, results: list[dict], t: int, key: str) -> torch.Tensor:
    class R:  # gather_rows reads an attribute per worker
        def __init__(self, d):
            self.__dict__.update(d)

    return gather_rows(case, 2, [R(r["steps"][t]) for r in results], key)


def test_default_options_compile_no_link_and_stay_exact(pool):
    case = _case()
    model = sc.distribute(make_model("one_sage", 0), staleness=1, compress=None)
    plan = model.plan(case.graph, 2, x=case.x, method="contiguous")
    assert "comm=" not in plan.stage("communication")
    results = _run(pool, case, 2, staleness=1, compress=None)
    for t in range(2):
        out, grad = _exact(case, t)
        torch.testing.assert_close(_rows(case, results, t, "out"), out, atol=TOL, rtol=0)
        torch.testing.assert_close(_rows(case, results, t, "x_grad"), grad, atol=TOL, rtol=0)


def test_staleness_fetches_only_on_refresh_iterations(pool):
    case = _case()
    k, steps = 3, 7
    results = _run(pool, case, steps, staleness=k)
    for t in range(steps):
        refresh = t % k == 0
        for r in results:
            sent = r["steps"][t]["bytes"]["sent"]
            assert (sent.get("forward", 0) > 0) == refresh, (t, sent)
            assert (sent.get("backward", 0) > 0) == refresh, (t, sent)
        out, grad = _exact(case, t)
        got = _rows(case, results, t, "out")
        if refresh:
            torch.testing.assert_close(got, out, atol=TOL, rtol=0)
            torch.testing.assert_close(_rows(case, results, t, "x_grad"), grad, atol=TOL, rtol=0)
        else:  # remote rows are those of the last refresh, x * (t0 + 1): not today's
            assert not torch.allclose(got, out)
    for r in results:
        (link,) = r["links"].values()
        assert link["exchanges"] == [0, 3, 6]
        assert link["ages"] == [0, 1, 2, 0, 1, 2, 0]


@pytest.mark.parametrize("bound", [1, 2, 3])
def test_bounded_staleness_never_exceeds_its_bound(pool, bound):
    case = _case()
    steps = 7
    results = _run(pool, case, steps, bounded_staleness=bound)
    for r in results:
        (link,) = r["links"].values()
        assert link["ages"] == [0 if t % bound == 0 else 1 for t in range(steps)]
        assert max(link["ages"]) <= bound
    for t in range(0, steps, bound):  # the synchronous iterations are exact
        out, grad = _exact(case, t)
        torch.testing.assert_close(_rows(case, results, t, "out"), out, atol=TOL, rtol=0)
        torch.testing.assert_close(_rows(case, results, t, "x_grad"), grad, atol=TOL, rtol=0)
    if bound > 1:  # in between, remote rows are one step old
        out, _ = _exact(case, 1)
        assert not torch.allclose(_rows(case, results, 1, "out"), out)


@pytest.mark.parametrize("compress, rel", [("int8", 2e-2), ("int4", 0.2)])
def test_compression_is_close_and_smaller(pool, compress, rel):
    case = _case()
    exact = _run(pool, case, 1)
    results = _run(pool, case, 1, compress=compress)
    out, grad = _exact(case, 0)
    got = _rows(case, results, 0, "out")
    assert float((got - out).norm() / out.norm()) < rel
    assert float((_rows(case, results, 0, "x_grad") - grad).norm() / grad.norm()) < rel
    bits = {"int8": 8, "int4": 4}[compress]
    for e, c in zip(exact, results):
        for phase in ("forward", "backward"):
            full, small = e["steps"][0]["bytes"]["sent"][phase], c["steps"][0]["bytes"]["sent"][phase]
            rows = full // (6 * 8)  # SAGE aggregates (and sends gradients of) x: 6 float64s a row
            assert small == rows * (math.ceil(6 * bits / 8) + 4)  # packed values, bf16 lo and scale


def test_attention_with_reduced_communication_warns_unless_excluded():
    g = _case().graph
    x = torch.zeros(1, 6, dtype=torch.float64)
    with pytest.warns(UserWarning, match="compress_layers"):
        plan = sc.distribute(make_model("gat3", 0), compress="1bit").plan(g, 2, x=x, method="contiguous")
    assert len(plan.warnings) == 3 and "warnings:" in str(plan)  # the three GAT layers
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = sc.distribute(make_model("gat3", 0), compress="1bit", compress_layers=["sage"]).plan(
            g, 2, x=x, method="contiguous"
        )
    code = plan.stage("communication")
    assert code.count("comm = sarcompile_ir_vocab_LinkPolicy(") == 1 and "sage" in code and not plan.warnings


def test_bad_options_are_refused_early():
    net = MODELS["one_sage"]()
    for kwargs, match in [
        ({"staleness": 0}, "staleness must be an integer >= 1"),
        ({"compress": "2bits"}, "compress must be None or one of"),
        ({"bounded_staleness": 0}, "bounded_staleness must be None"),
        ({"staleness": 2, "bounded_staleness": 2}, "pick one"),
        ({"compress_layers": "conv1"}, "compress_layers must be a list"),
    ]:
        with pytest.raises(sc.CompileError, match=match):
            sc.distribute(net, **kwargs)


def test_plan_counts_packed_bytes_and_the_stale_cache():
    # x needs its grad: an aggregation of a constant x is made once, exactly (passes/reuse)
    g, x = _case().graph, torch.zeros(1, 6, dtype=torch.float64, requires_grad=True)
    exact = sc.distribute(make_model("one_sage", 0)).plan(g, 2, x=x, method="contiguous")
    packed = sc.distribute(make_model("one_sage", 0), compress="1bit").plan(g, 2, x=x, method="contiguous")
    stale = sc.distribute(make_model("one_sage", 0), staleness=4).plan(g, 2, x=x, method="contiguous")
    (e,), (p,), (s,) = exact.ops, packed.ops, stale.ops
    assert e.row_bytes == 6 * 8 and p.row_bytes == 1 + 4 and p.comm == "1bit+ef"  # 6 bits, bf16 lo + scale
    assert p.forward_bytes == [b // 48 * 5 for b in e.forward_bytes]
    assert s.comm == "stale K=4" and s.forward_bytes == e.forward_bytes
    for est, w in zip(stale.memory_estimate(), stale.workers):
        assert est.breakdown["link_cache"] == sum(w.halo) * 6 * 8
    assert "link_cache" not in exact.memory_estimate()[0].breakdown
