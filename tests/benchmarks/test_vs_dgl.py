"""benchmarks/vs_dgl.py's ``--repeat``: the runs of one engine merge into one row of medians."""

from __future__ import annotations

import pytest

from commands import ROOT, import_script

vs_dgl = import_script(ROOT / "benchmarks" / "vs_dgl.py")


def _row(engine: str, workers: int, epochs: list[float], peaks: list[int]) -> dict:
    per_worker = [{"rank": r, "epoch_s": e, "peak_above_floor_bytes": p, "ledger": {"rank": r},
                   "time_ledger": {"compute": e - 0.5, "exchange_wait": 0.5 * p / 1000}}
                  for r, (e, p) in enumerate(zip(epochs, peaks))]
    return {"engine": engine, "model": "sage", "allocator": "default", "workers": workers, "per_worker": per_worker}


def test_repeats_merge_into_the_medians_of_each_worker_in_run_order():
    rows = [
        _row("dgl", 1, [2.0], [800]), _row("sarcompile", 2, [1.0, 1.2], [300, 310]),
        _row("dgl", 1, [1.0], [700]), _row("sarcompile", 2, [3.0, 0.9], [200, 330]),
        _row("dgl", 1, [1.5], [900]), _row("sarcompile", 2, [2.0, 1.1], [250, 320]),
    ]
    merged = vs_dgl.merge_repeats(rows)
    assert [(r["engine"], r["workers"]) for r in merged] == [("dgl", 1), ("sarcompile", 2)]
    dgl, ours = merged
    assert dgl["per_worker"][0]["epoch_s"] == 1.5 and dgl["per_worker"][0]["peak_above_floor_bytes"] == 800
    assert [w["epoch_s"] for w in ours["per_worker"]] == [2.0, 1.1]
    assert [w["peak_above_floor_bytes"] for w in ours["per_worker"]] == [250, 320]
    assert [run["epoch_s"] for run in ours["per_worker"][1]["runs"]] == [1.2, 0.9, 1.1]
    assert ours["per_worker"][1]["ledger"] == {"rank": 1}  # the other fields: the first run's
    # each part of the time ledger is its own median: compute 0.7 / 0.4 / 0.6, wait 0.155 / 0.165 / 0.16
    assert ours["per_worker"][1]["time_ledger"] == pytest.approx({"compute": 0.6, "exchange_wait": 0.16})
    assert vs_dgl.epoch(ours) == 2.0 and vs_dgl.peak(ours) == 320


def test_one_run_is_its_own_median():
    (row,) = vs_dgl.merge_repeats([_row("dgl", 1, [1.25], [640])])
    assert row["per_worker"][0]["epoch_s"] == 1.25 and len(row["per_worker"][0]["runs"]) == 1
