"""benchmarks/models_sweep.py judges whole models as it says: in eval against eager, in train
against the compiled one-machine run where dropout makes eager differ (against eager where
nothing random is left), on one machine and 2 gloo workers; and its comparison can fail: a
model wrong on the workers, one that leaves dropout out when compiled and one that is not
row-local are reported WRONG, WRONG and refused."""

from __future__ import annotations

import pytest
from commands import ROOT, import_script

pytest.importorskip("torch_geometric")

SWEEP_PATH = ROOT / "benchmarks" / "models_sweep.py"


@pytest.fixture(scope="module")
def records():
    ms = import_script(SWEEP_PATH)
    names = ["GCN (edge_weight) [eval]", "GCN (edge_weight) [train]", "SGC (sgc.py) [train]",
             f"{ms.WRONG_ON_WORKERS} [eval]", f"{ms.WRONG_ON_WORKERS} [train]", f"{ms.DROPOUT_ONLY_EAGER} [train]",
             f"{ms.NOT_ROW_LOCAL} [eval]"]
    return ms, {r.name: r for r in ms.SWEEP.sweep(names, world_sizes=(2,), log=lambda s: None)}


def test_a_model_with_dropout_is_compared_with_eager_in_eval_and_with_the_compiled_run_in_train(records):
    ms, by_name = records
    ev, tr = by_name["GCN (edge_weight) [eval]"], by_name["GCN (edge_weight) [train]"]
    assert ev.outcome == ms.EXACT and ev.oracle == "eager", ev
    assert set(ev.diffs) == {"local", "2w"} and all(d <= ms.TOL for d in ev.diffs.values()), ev.diffs
    assert tr.outcome == ms.EXACT and tr.oracle == "compiled", tr
    assert set(tr.diffs) == {"local", "2w"} and all(d <= ms.TOL for d in tr.diffs.values()), tr.diffs
    sgc = by_name["SGC (sgc.py) [train]"]  # nothing random in training: against eager
    assert sgc.outcome == ms.EXACT and sgc.oracle == "eager" and "local" in sgc.diffs, sgc


def test_the_comparison_fails_where_the_model_is_wrong(records):
    ms, by_name = records
    for mode in ("eval", "train"):
        wrong = by_name[f"{ms.WRONG_ON_WORKERS} [{mode}]"]
        assert wrong.outcome == ms.WRONG, wrong
        assert "2 workers: WRONG" in wrong.detail and "local" not in wrong.errors, wrong.detail
    left_out = by_name[f"{ms.DROPOUT_ONLY_EAGER} [train]"]
    assert left_out.outcome == ms.WRONG and "dropout left out" in left_out.detail, left_out


def test_a_refusal_is_quoted_and_grouped_by_its_cause(records):
    ms, by_name = records
    refused = by_name[f"{ms.NOT_ROW_LOCAL} [eval]"]
    assert refused.outcome == ms.REFUSED and refused.detail.startswith("CompileError: ") and "flip" in refused.detail
    assert "2w" not in refused.errors, refused.errors  # decided on one machine: the workers are not run
    groups = ms.refusals_by_cause(list(by_name.values()))
    assert [r.name for rs in groups.values() for r in rs] == [refused.name], groups


def test_the_table_has_a_row_per_model_with_both_modes(records):
    ms, by_name = records
    meta = {"date": "today", "command": "python benchmarks/models_sweep.py", "seconds": 1.0, "sarcompile": "x",
            "torch": "2", "torch_geometric": "2", "world_sizes": [2], "graphs": ["citation"]}
    table = ms.SWEEP.table(list(by_name.values()), meta)
    row = next(line for line in table.splitlines() if line.startswith("| `GCN (edge_weight)`"))
    assert "| exact | exact (vs compiled) |" in row, row
    assert "5 models, 7 cases" in table


def test_the_ogb_gcn_models_on_a_normalised_adjacency_are_exact():
    ms = import_script(SWEEP_PATH)
    names = [f"{m} [{mode}]" for m in ("GCN on a normalised adj_t (ogbn-arxiv)",
                                       "GCN(normalize=False) on adj_t (ogbn-products)") for mode in ms.MODES]
    for r in ms.SWEEP.sweep(names, world_sizes=(2,), log=lambda s: None):
        assert r.outcome == ms.EXACT and set(r.diffs) == {"local", "2w"}, r
