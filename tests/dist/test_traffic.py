"""dist/traffic.py: the time ledger of a step, and the count of remote blocks alive."""

from __future__ import annotations

import gc

import torch

from sarcompile.dist.traffic import TIME_LEDGER, CommStats, LiveBlocks


def test_the_time_ledger_splits_the_step_and_adds_up_to_it():
    s = CommStats()
    s.waited["exchange"] += 0.25
    s.waited["allreduce"] += 0.125
    s.sent["forward"] += 10
    ledger = s.time_ledger(step_s=2.0, optimizer_s=0.5)
    assert tuple(ledger) == TIME_LEDGER
    assert ledger == {"compute": 1.125, "exchange_wait": 0.25, "allreduce": 0.125, "optimizer": 0.5}
    assert sum(ledger.values()) == 2.0
    assert s.as_dict() == {"sent": {"forward": 10}, "received": {}}
    s.reset()
    assert s.as_dict() == {"sent": {}, "received": {}} and not s.waited


def test_live_blocks_count_what_is_still_referenced_and_the_most_at_once():
    live = LiveBlocks()
    a = live.track(torch.zeros(10, 4))  # 160 bytes
    b = live.track(torch.zeros(5, 2, dtype=torch.float64))  # 80 bytes
    assert (live.count, live.bytes, live.peak, live.peak_bytes) == (2, 240, 2, 240)
    del a
    gc.collect()
    assert (live.count, live.bytes, live.peak, live.peak_bytes) == (1, 80, 2, 240)
    live.reset_peak()
    assert (live.peak, live.peak_bytes) == (1, 80)
    del b
    gc.collect()
    assert (live.count, live.bytes) == (0, 0)
