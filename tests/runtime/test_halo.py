"""HaloRounds (sarcompile.runtime.ops.halo), the exchange every halo op makes, on one
process: the rounds engine is replaced by one that visits every block in order and records
what it was asked, so that what the helper decides -- link, re-fetch, lookahead, which blocks
it keeps and when it lets them go -- is checked without workers. That the ops give the
same values through it on 1-4 workers is tests/runtime/test_distributed.py's job."""

from __future__ import annotations

import pytest
import torch

import sarcompile as sc
from sarcompile.graph.shard import ShardGraph, split_graph
from sarcompile.ir import ops as ir
from sarcompile.ir.vocab import LinkPolicy, Strategy
from sarcompile.runtime.ops import halo
from sarcompile.runtime.ops.halo import HaloRounds


def _shard(rank: int = 1, world_size: int = 3) -> ShardGraph:
    gen = torch.Generator().manual_seed(0)
    n = 9
    g = sc.Graph.from_edges(torch.randint(0, n, (30,), generator=gen), torch.randint(0, n, (30,), generator=gen), n)
    parts = split_graph(g, torch.arange(n) % world_size, world_size)
    return ShardGraph.from_part(parts[rank], rank, world_size, n, g.num_edges)


@pytest.fixture
def engine(monkeypatch):
    """Records each call's keywords; visits q = 0, 1, ... with block ``("fetched", q)``
    (the local one: ``fetch`` itself), or None where nothing is fetched."""
    calls = []

    def run_rounds(shard, visit, *, fetch=None, **kw):
        calls.append({"fetch": fetch, **kw})
        for q in range(shard.world_size):
            visit(q, None if fetch is None else fetch if q == shard.rank else ("fetched", q))
        return kw.get("push_into")

    monkeypatch.setattr(halo, "run_rounds", run_rounds)
    return calls


def test_open_links_only_a_training_call_on_several_workers():
    shard, stale = _shard(), LinkPolicy(4, "spmm", staleness=3)
    first = HaloRounds.open(shard, "spmm(sum)", "stash", 2, stale)
    again = HaloRounds.open(shard, "spmm(sum)", Strategy.STASH, 2, stale)
    assert first.strategy is Strategy.STASH and first.link is again.link is shard.links[4]
    assert (first.iteration, again.iteration) == (0, 1)  # the site's state counts training iterations from 0
    other = HaloRounds.open(shard, "spmm(sum)", "remat", 1, stale._replace(bits=8))
    assert other.link is not first.link and other.iteration == 0  # a changed policy starts afresh
    with torch.no_grad():  # not training: exact
        assert HaloRounds.open(shard, "spmm(sum)", "remat", 1, stale).link is None
    for policy, s in ((None, shard), (LinkPolicy(4, "spmm"), shard), (stale, _shard(0, 1))):
        rounds = HaloRounds.open(s, "spmm(sum)", "remat", 1, policy)
        assert (rounds.link, rounds.iteration) == (None, 0)


@pytest.mark.parametrize("strategy", list(Strategy.halo()))
def test_rounds_keep_refetch_and_let_go_as_the_strategy_says(engine, strategy):
    shard = _shard()
    rounds = HaloRounds.open(shard, "spmm(sum)", strategy, 1, None)
    args, wants = {"reduce": "sum"}, {"x": True, "edge_weight": True}  # the weights' gradient reads remote x
    if strategy is Strategy.DIRECT:
        with pytest.raises(sc.CompileError, match="'direct'.*reads remote inputs"):
            rounds.forward(lambda q, b: None, "x", op=ir.spmm, args=args, wants=wants)
        assert engine == []  # refused before anything is exchanged
        rounds.forward(lambda q, b: None, "x", op=ir.spmm, args=args, wants={"x": True, "edge_weight": False})
        assert not rounds.refetch
        return
    seen = []
    rounds.forward(lambda q, b: seen.append(b), "x", op=ir.spmm, args=args, wants=wants)
    assert seen == [("fetched", 0), "x", ("fetched", 2)]
    keeps = strategy in (Strategy.STASH, Strategy.ONESHOT)
    assert rounds.kept == ({0: ("fetched", 0), 2: ("fetched", 2)} if keeps else {})  # never the local block
    assert engine[0]["lookahead"] == (2 if strategy is Strategy.ONESHOT else 1)
    assert engine[0]["what"] == "spmm(sum)"
    assert rounds.refetch is (strategy is Strategy.REMAT)

    read = []
    out = rounds.backward(lambda q, b: read.append(rounds.block(q, "local x", b)), fetch=lambda: "x again",
                          push_into="gx")
    assert out == "gx" and engine[1]["what"] == "spmm(sum) backward" and engine[1]["phase"] == "backward"
    assert engine[1]["fetch"] == ("x again" if strategy is Strategy.REMAT else None)
    assert read == [("fetched", 0), "local x", ("fetched", 2)]  # re-fetched (remat) or kept (stash, oneshot)
    assert rounds.kept == {}  # let go once backward's rounds are over
