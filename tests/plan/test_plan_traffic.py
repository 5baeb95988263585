"""The bytes an exchanging op moves, by its definition (sarcompile.plan.traffic), worked out by
hand from one halo matrix on 3 workers: per worker what it receives forward, what backward
pushes and fetches again by strategy, the blocks of each round, and a push op's reverse.
(That the plan's figures equal the runtime's byte counters is tests/plan/test_plan.py's.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.fx as fx

from sarcompile.ir.vocab import Residency, Strategy
from sarcompile.plan.plan import OpPlan
from sarcompile.plan.traffic import _round_bytes, halo_traffic, push_traffic

# HALO[r][q]: the rows of worker q's nodes that worker r receives (the diagonal is 0)
HALO = [[0, 2, 1],
        [3, 0, 0],
        [4, 5, 0]]
WORKERS = [SimpleNamespace(halo=row) for row in HALO]
WIDTH = 16  # a row of 4 float32
RECEIVED = [(2 + 1) * WIDTH, 3 * WIDTH, (4 + 5) * WIDTH]  # row sums
SENT = [(3 + 4) * WIDTH, (2 + 5) * WIDTH, 1 * WIDTH]  # column sums: rows of r its peers receive


def test_rounds_receive_from_r_minus_k_and_send_to_r_plus_k():
    blocks, sends = _round_bytes(WORKERS, WIDTH)
    # worker 0: round 1 from worker 2 (1 row), round 2 from worker 1 (2 rows); and so on
    assert blocks == [[1 * WIDTH, 2 * WIDTH], [3 * WIDTH, 0], [5 * WIDTH, 4 * WIDTH]]
    assert sends == [[3 * WIDTH, 4 * WIDTH], [5 * WIDTH, 2 * WIDTH], [1 * WIDTH, 0]]
    # what r sends in round k is what r + k receives in round k
    assert all(sends[r][k - 1] == blocks[(r + k) % 3][k - 1] for r in range(3) for k in (1, 2))


def _op(pushes: bool, reads: bool):
    exchange = SimpleNamespace(sends=("x",), row_bytes=lambda a: WIDTH, grads_over_block=False,
                               pushes_gradients=lambda a, wants: pushes and "x" in wants,
                               reads_remote_in_backward=lambda a, wants: reads)
    return SimpleNamespace(exchange=exchange, inputs={"x": Residency.NODE}, temporaries=lambda a, width: None)


def _node(**kwargs) -> fx.Node:
    return fx.Graph().create_node("call_function", torch.relu, (), kwargs)


def _row(strategy: Strategy) -> OpPlan:
    return OpPlan(name="spmm", layer="conv1", op="spmm(sum)", strategy=strategy, reason="", row_bytes=0)


@pytest.mark.parametrize("strategy, pushes, reads, backward", [
    (Strategy.REMAT, True, True, [s + r for s, r in zip(SENT, RECEIVED)]),  # gradients out, rows fetched again
    (Strategy.REMAT, True, False, SENT),  # backward reads no remote row: nothing fetched again
    (Strategy.STASH, True, True, SENT),  # the blocks kept from forward: nothing fetched again
    (Strategy.DIRECT, False, False, [0, 0, 0]),
])
def test_a_halo_op_receives_its_halo_forward_and_backward_by_strategy(strategy, pushes, reads, backward):
    row = _row(strategy)
    x = torch.zeros(5, 4, requires_grad=True)
    exchange = halo_traffic(row, _node(in_flight=2), _op(pushes, reads), {"x": x}, WORKERS, [0, 0, 0])
    assert row.forward_bytes == RECEIVED and row.backward_bytes == backward
    assert row.row_bytes == WIDTH and row.round_bytes == [2 * WIDTH, 3 * WIDTH, 5 * WIDTH] and not row.reused
    assert exchange.keeps == strategy.keeps_blocks and exchange.in_flight == 2
    assert exchange.backward == (strategy.refetches and reads, pushes)


def test_a_reused_input_is_received_in_the_first_step_only():
    row = _row(Strategy.REMAT)
    x = torch.zeros(5, 4)  # the call's input, needing no gradient
    halo_traffic(row, _node(reuse=True), _op(True, True), {"x": x}, WORKERS, [0, 0, 0])
    assert row.reused and row.forward_bytes == [0, 0, 0] and row.backward_bytes == RECEIVED
    assert "received in the first step only, then reused" in row.reason


def test_a_push_op_sends_partial_results_to_their_owners_and_fetches_backward():
    row = _row(Strategy.PUSH)
    exchange = push_traffic(row, _op(False, False), {}, WORKERS)
    assert row.forward_bytes == SENT and row.backward_bytes == RECEIVED
    assert exchange.forward == (False, True) and exchange.backward == (True, False)
