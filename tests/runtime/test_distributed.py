"""N real gloo workers reproduce the single-machine outputs and gradients exactly."""

from __future__ import annotations

import torch
from cases import Case, case_on_edges, gather_rows, payloads, run_worker, single_machine
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from strategies import graphs

import sarcompile as sc

TOL = 1e-9  # float64 everywhere: the only differences are summation order


@st.composite
def cases(draw, world_size: int, models=("mix", "edge"), modes=("sar",)):
    src, dst, n, seed = draw(graphs(max_nodes=24, max_edges=80))
    kind = draw(st.sampled_from(["random", "contiguous", "one-part"]))
    if kind == "random":
        assignment = torch.tensor(draw(st.lists(st.integers(0, world_size - 1), min_size=n, max_size=n)))
    elif kind == "contiguous":
        assignment = torch.arange(n) * world_size // n
    else:  # every node on one worker: the others are empty
        assignment = torch.full((n,), draw(st.integers(0, world_size - 1)))
    seed %= 2**16
    model, mode = draw(st.sampled_from(models)), draw(st.sampled_from(modes))
    gen = torch.Generator().manual_seed(seed)
    return case_on_edges(src, dst, n, model, seed, gen, assignment=assignment, mode=mode)


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
        for k, b in want.buffers.items():  # and the same running statistics and counters
            torch.testing.assert_close(r.buffers[k], b, atol=TOL * scale, rtol=0, msg=k)
    return results


SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))


@given(data=st.data())
@SETTINGS
def test_two_workers_all_modes(pool, data):
    check(data.draw(cases(2, modes=("sar", "stash", "oneshot"))), 2, pool)


@given(data=st.data())
@SETTINGS
def test_one_to_four_workers_all_models(pool, data):
    world_size = data.draw(st.sampled_from([1, 3, 4]))
    check(data.draw(cases(world_size, models=("mix", "edge", "drop", "gat2"), modes=("sar", "stash", "oneshot"))), world_size, pool)


@given(data=st.data())
@SETTINGS
def test_gat_models_one_to_four_workers(pool, data):
    world_size = data.draw(st.sampled_from([1, 2, 3, 4]))
    check(data.draw(cases(world_size, models=("gat2", "gat3"), modes=("sar", "stash", "oneshot"))), world_size, pool)


@given(data=st.data())
@settings(SETTINGS, max_examples=6)
def test_values_without_rows_gather_every_workers_gradient(pool, data):
    """edge_max and node_mean: one value for all workers, whose gradient is the sum of every
    worker's loss reaching it (a worker's own share alone was wrong for edge_max)."""
    world_size = data.draw(st.sampled_from([2, 3]))
    case = data.draw(cases(world_size, models=("rowless",)))
    assume(case.graph.num_edges >= 1)  # the largest of no edge scores is not defined on one machine
    check(case, world_size, pool)


@given(data=st.data())
@SETTINGS
def test_batch_norm_statistics_span_all_workers(pool, data):
    world_size = data.draw(st.sampled_from([1, 2, 3]))
    case = data.draw(cases(world_size, models=("norm",), modes=("sar", "oneshot")))
    assume(case.graph.num_nodes >= 2)  # batch statistics need two nodes in all
    case.train = data.draw(st.booleans())
    check(case, world_size, pool)


@given(data=st.data())
@SETTINGS
def test_general_message_passing_on_one_to_three_workers(pool, data):
    world_size = data.draw(st.sampled_from([1, 2, 3]))
    check(data.draw(cases(world_size, models=("msg",), modes=("sar", "stash", "oneshot"))), world_size, pool)


@given(data=st.data())
@settings(SETTINGS, max_examples=12)
def test_gathers_and_edge_reductions_on_one_to_three_workers(pool, data):
    world_size = data.draw(st.sampled_from([1, 2, 3]))
    check(data.draw(cases(world_size, models=("gathers",), modes=("sar", "stash", "oneshot"))), world_size, pool)


def test_message_passing_max_ties_across_workers(pool):
    # Node 0 receives equal messages from nodes 1, 2 and 3, which live on three workers:
    # the winner (the smallest edge id) and so every gradient must not depend on the split.
    # (The message is elementwise: a matmul's last bit can depend on the batch shape, and
    # then messages equal in exact arithmetic are not tied in floating point.)
    src = torch.tensor([2, 1, 3, 4, 5, 0, 6, 7])
    dst = torch.tensor([0, 0, 0, 1, 2, 3, 5, 6])
    case = _case(sc.Graph.from_edges(src, dst, 8), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]), model="msgmax")
    case.x[[2, 3]] = case.x[1].clone()
    for world_size, assignment in ((3, case.assignment), (1, torch.zeros(8, dtype=torch.long))):
        case.assignment = assignment
        check(case, world_size, pool)


def _random_graph(n: int, e: int, gen: torch.Generator) -> sc.Graph:
    return sc.Graph.from_edges(torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen), n)


def _case(g: sc.Graph, assignment: torch.Tensor, model: str = "mix", mode: str = "sar", seed: int = 0) -> Case:
    gen = torch.Generator().manual_seed(seed)
    n = g.num_nodes
    return Case(g, assignment, model, seed, torch.randn(n, 6, generator=gen, dtype=torch.float64),
                torch.randn(n, 1, generator=gen, dtype=torch.float64), mode)


def test_every_edge_crosses_partitions(pool):
    # Even nodes on worker 0, odd on worker 1, edges only between even and odd nodes.
    n = 30
    src = torch.arange(n).repeat(3)
    dst = (src + torch.tensor([1, 3, 5]).repeat_interleave(n)) % n
    case = _case(sc.Graph.from_edges(src, dst, n), torch.arange(n) % 2)
    assert bool((case.assignment[src] != case.assignment[dst]).all())
    for model in ("mix", "edge"):
        case.model = model
        check(case, 2, pool)


def test_partition_without_remote_in_edges(pool):
    # Worker 1's nodes have in-edges only from worker 1; worker 0 reads from worker 1.
    n = 20
    src = torch.tensor([10, 11, 12, 13, 3, 14, 15, 16])
    dst = torch.tensor([1, 2, 3, 0, 4, 15, 16, 14])
    case = _case(sc.Graph.from_edges(src, dst, n), (torch.arange(n) >= 10).long())
    parts = payloads(case, 2)
    assert parts[1]["part"].edge_src_part.eq(1).all()
    for mode in ("sar", "stash", "oneshot"):
        case.mode = mode
        check(case, 2, pool)


def test_metis_partitions(pool):
    from sarcompile.data.assign import assign

    gen = torch.Generator().manual_seed(3)
    n = 60
    src = torch.randint(0, n, (300,), generator=gen)
    dst = (src + torch.randint(-4, 5, (300,), generator=gen)).clamp(0, n - 1)  # local structure
    g = sc.Graph.from_edges(src, dst, n)
    for world_size in (2, 3, 4):
        check(_case(g, assign(g, world_size, "metis", seed=0), model="mix", seed=world_size), world_size, pool)


def test_blocks_in_flight_change_neither_values_nor_traffic(pool):
    """blocks_in_flight 0 (no overlap), 1 (the default) and 2 give the single machine's
    values, the same bytes, and as many remote blocks alive at once as the plan says."""
    from cases import make_model

    gen = torch.Generator().manual_seed(8)
    n = 48
    g = _random_graph(n, 260, gen)
    assignment = torch.randint(0, 4, (n,), generator=gen)
    peaks = {}
    for model, mode in (("mix", "sar"), ("edge", "sar"), ("gat3", "sar"), ("msg", "stash"), ("gathers", "sar")):
        for in_flight in (0, 1, 2):
            case = _case(g, assignment, model, mode)
            case.blocks_in_flight = in_flight
            results = check(case, 4, pool)
            plan = sc.distribute(make_model(model, case.seed), mode=mode, blocks_in_flight=in_flight).plan(
                g, 4, x=case.x.clone().requires_grad_(), method=assignment
            )
            assert f"blocks_in_flight={in_flight}" in str(plan)
            for rank, r in enumerate(results):
                assert plan.forward_bytes(rank) == r.stats["received"].get("forward", 0), (model, in_flight, rank)
                assert plan.backward_bytes(rank) == r.stats["received"].get("backward", 0), (model, in_flight, rank)
                assert plan.memory_estimate()[rank].breakdown["remote_blocks"] == r.stats["peak_block_bytes"]
            peaks[model, in_flight] = max(r.stats["peak_blocks"] for r in results)
    # More in flight holds more blocks at once: one being visited and `in_flight` arriving
    assert [peaks["mix", k] for k in (0, 1, 2)] == [1, 2, 3]


def test_sar_sum_mean_never_refetches_and_frees_blocks(pool):
    """Direct strategies: backward traffic is exactly the gradients of what forward fetched."""
    gen = torch.Generator().manual_seed(0)
    n = 40
    g = _random_graph(n, 200, gen)
    assignment = torch.randint(0, 4, (n,), generator=gen)
    sar = check(_case(g, assignment, "mix", "sar"), 4, pool)
    for r in sar:
        s = r.stats
        assert s["sent"]["backward"] == s["received"]["forward"]  # one gradient per fetched row
        assert s["received"]["backward"] == s["sent"]["forward"]  # ... and nothing else
        assert s["peak_blocks"] <= 2  # the block being reduced and the one prefetched
    # The baselines are real: 3 remote halos per aggregation, 5 aggregations, all kept
    # until backward (every worker reads from all 3 others on this graph).
    for mode in ("stash", "oneshot"):
        assert [r.stats["forward_peak_blocks"] for r in check(_case(g, assignment, "mix", mode), 4, pool)] == [15] * 4


def test_remat_refetches_only_what_backward_reads(pool):
    gen = torch.Generator().manual_seed(1)
    n = 40
    g = _random_graph(n, 200, gen)
    assignment = torch.randint(0, 3, (n,), generator=gen)
    sar = check(_case(g, assignment, "edge", "sar"), 3, pool)
    stash = check(_case(g, assignment, "edge", "stash"), 3, pool)
    for a, b in zip(sar, stash):
        assert a.stats["sent"]["forward"] == b.stats["sent"]["forward"]
        # remat fetches the inputs of edge-weighted spmm and sddmm(mul/dot) again; stash does not.
        assert a.stats["received"]["backward"] > b.stats["received"]["backward"]
        assert a.stats["peak_blocks"] <= 2


def test_node_dropout_same_on_every_worker_count(pool):
    gen = torch.Generator().manual_seed(5)
    n = 50
    g = _random_graph(n, 250, gen)
    for world_size in (2, 3, 4):
        case = _case(g, torch.randint(0, world_size, (n,), generator=gen), model="drop", seed=7)
        check(case, world_size, pool)


def test_gat_keeps_no_per_edge_tensor_for_backward(pool):
    """Fused attention saves per-node statistics only: nothing with one row per edge."""
    gen = torch.Generator().manual_seed(2)
    n = 40
    g = _random_graph(n, 300, gen)
    assignment = torch.randint(0, 3, (n,), generator=gen)
    for r in check(_case(g, assignment, "gat3", "sar"), 3, pool):
        edge_rows = {r.stats["edges_with_loops"], r.stats["edges"]}
        assert r.stats["edges_with_loops"] > n  # distinct from any node count on this graph
        assert not [s for s in r.stats["saved_shapes"] if s and s[0] in edge_rows], r.stats["saved_shapes"]
        assert r.stats["peak_blocks"] <= 2
    # The probe sees per-edge tensors when they are kept: the unfused edge ops keep them.
    for r in check(_case(g, assignment, "edge", "sar"), 3, pool):
        assert [s for s in r.stats["saved_shapes"] if s and s[0] == r.stats["edges"]]


def test_attention_reads_each_remote_block_once_per_pass(pool):
    """Forward fetches h and a_src together once; backward fetches them once more (remat)
    and sends one gradient per fetched row; stash and oneshot never fetch in backward."""
    gen = torch.Generator().manual_seed(4)
    n = 40
    g = _random_graph(n, 200, gen)
    assignment = torch.randint(0, 4, (n,), generator=gen)
    for r in check(_case(g, assignment, "gat2", "sar"), 4, pool):
        s = r.stats
        assert s["received"]["backward"] == s["received"]["forward"] + s["sent"]["forward"]
    for mode in ("stash", "oneshot"):
        for r in check(_case(g, assignment, "gat2", mode), 4, pool):
            assert r.stats["received"]["backward"] == r.stats["sent"]["forward"]


def test_plan_traffic_and_memory_equal_runtime_counters(pool):
    """The plan's bytes per worker and phase, saved activations and remote blocks are
    exactly what the runtime counts."""
    from cases import make_model

    gen = torch.Generator().manual_seed(6)
    n = 45
    g = _random_graph(n, 220, gen)
    for world_size, model, mode in [(3, "mix", "sar"), (3, "edge", "sar"), (3, "edge", "stash"),
                                    (4, "gat3", "sar"), (4, "gat2", "oneshot"), (2, "drop", "sar")]:
        case = _case(g, torch.randint(0, world_size, (n,), generator=gen), model=model, mode=mode)
        results = check(case, world_size, pool)
        plan = sc.distribute(make_model(model, case.seed), mode=mode).plan(
            g, world_size, x=case.x.clone().requires_grad_(), method=case.assignment
        )
        for rank, r in enumerate(results):
            assert plan.forward_bytes(rank) == r.stats["received"].get("forward", 0), (model, mode, rank)
            assert plan.backward_bytes(rank) == r.stats["received"].get("backward", 0), (model, mode, rank)
            # The exact parts of the memory estimate: what autograd keeps, and the remote
            # blocks alive at once, as the runtime itself counts them.
            memory = plan.memory_estimate()[rank].breakdown
            assert memory["saved_activations"] == r.stats["saved_bytes"], (model, mode, rank)
            assert memory["remote_blocks"] == r.stats["peak_block_bytes"], (model, mode, rank)
