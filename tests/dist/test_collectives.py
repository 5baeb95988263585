"""dist/collectives.py on real gloo workers: sums and maxima over them, gradients summed,
and the offline mode in which a worker goes on alone without waiting for the others."""

from __future__ import annotations

import torch

from sarcompile.dist.collectives import global_max, global_sum, is_offline, offline, sync_gradients


def _collectives(rank: int, world_size: int, payload) -> dict:
    from sarcompile.dist.traffic import stats

    stats.reset()
    t = torch.tensor([float(rank), 10.0 - rank])
    out = {"sum": global_sum(t, phase="test"), "max": global_max(t), "untouched": t.clone(),
           "counted": dict(stats.sent)}
    if rank == 0:  # alone: were these collectives, they would wait for rank 1 until the timeout
        with offline():
            with offline():
                nested = is_offline()
            out["offline"] = (is_offline(), nested, global_sum(t), global_max(t))
        out["after"] = is_offline()
    out["aligned"] = global_sum(torch.tensor([1.0]))  # both workers' next all-reduce is the same one
    return out


def test_sum_and_max_over_workers_and_offline_is_the_identity_on_one(pool):
    got = pool(2).run(_collectives, [None, None])
    for rank, r in enumerate(got):
        assert torch.equal(r["sum"], torch.tensor([1.0, 19.0])) and torch.equal(r["max"], torch.tensor([1.0, 10.0]))
        assert torch.equal(r["untouched"], torch.tensor([float(rank), 10.0 - rank]))
        assert r["counted"] == {"test": 8}  # the phase named: 2 float32 values
        assert torch.equal(r["aligned"], torch.tensor([2.0]))
    inside, nested, total, biggest = got[0]["offline"]
    assert inside and nested and not got[0]["after"]
    assert torch.equal(total, torch.tensor([0.0, 10.0])) and torch.equal(biggest, torch.tensor([0.0, 10.0]))


def _gradients(rank: int, world_size: int, payload) -> list[torch.Tensor | None]:
    lin = torch.nn.Linear(2, 1)
    with torch.no_grad():
        lin.weight.fill_(1.0)
        lin.bias.fill_(0.0)
    unused = torch.nn.Parameter(torch.zeros(3))
    model = torch.nn.ParameterList([lin.weight, lin.bias, unused])
    lin(torch.tensor([[1.0 + rank, 2.0]])).sum().backward()
    if rank == 1:  # a gradient only one worker has: the other's counts as zero
        unused.grad = torch.tensor([1.0, 2.0, 3.0])
    sync_gradients(model)
    return [p.grad for p in model]


def test_sync_gradients_sums_every_gradient_a_missing_one_as_zero(pool):
    for weight, bias, unused in pool(2).run(_gradients, [None, None]):
        assert torch.equal(weight, torch.tensor([[3.0, 4.0]])) and torch.equal(bias, torch.tensor([2.0]))
        assert torch.equal(unused, torch.tensor([1.0, 2.0, 3.0]))
