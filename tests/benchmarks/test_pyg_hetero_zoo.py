"""benchmarks/pyg_hetero_zoo.py judges cases as it says: one exact, one refused, one not
applicable, one where eager PyG fails, on one machine and on 2 gloo workers; it sees a wrong
gradient; and every case the saved sweep calls exact is exact on this tree (one machine and
3 workers, one of them without rows of a type)."""

from __future__ import annotations

import json

import pytest
from commands import ROOT, import_script

pytest.importorskip("torch_geometric")

ZOO_PATH = ROOT / "benchmarks" / "pyg_hetero_zoo.py"


def _zoo():
    return import_script(ZOO_PATH)


def test_sweep_judges_exact_refused_and_not_applicable():
    zoo = _zoo()
    names = ["HGTConv", "to_hetero_with_bases(GraphSAGE)", "MetaPath2Vec", "to_hetero(GCN)"]
    records = {r.name: r for r in zoo.sweep(names, world_sizes=(2,), log=lambda s: None)}

    hgt = records["HGTConv"]
    assert hgt.outcome == zoo.EXACT, hgt
    assert set(hgt.diffs) == {"local", "2w"} and all(d <= 1e-9 for d in hgt.diffs.values()), hgt.diffs

    bases = records["to_hetero_with_bases(GraphSAGE)"]
    assert bases.outcome == zoo.REFUSED, bases
    assert bases.detail.startswith("CompileError:") and "to_hetero(model, metadata)" in bases.detail, bases.detail

    assert records["MetaPath2Vec"].outcome == zoo.NA and "walks" in records["MetaPath2Vec"].detail
    gcn = records["to_hetero(GCN)"]  # PyG refuses GCNConv's self-loops across two types itself
    assert gcn.outcome == zoo.NA and gcn.detail.startswith("eager PyG fails here"), gcn


def test_compare_sees_a_wrong_gradient_of_one_type():
    import torch

    zoo = _zoo()
    want = {"out": {"paper": torch.ones(3, 2)}, "x_grad": {"paper": torch.ones(3, 2), "field": torch.ones(1, 2)},
            "edge_grad": {}, "grads": {"w": torch.ones(2)}}
    got = {**want, "x_grad": {"paper": torch.ones(3, 2), "field": torch.tensor([[1.0, 1.25]])}}
    m, r, what = zoo.compare(got, want)
    assert what == "x_grad of field" and m == pytest.approx(0.25)
    assert zoo.compare(want, want)[1] == 0.0
    assert zoo.compare({**want, "out": {}}, want)[0] == float("inf")  # a type missing from the output


def test_every_case_the_saved_sweep_calls_exact_is_exact():
    """What the saved results claim (the committed full sweep) holds on this tree: every case
    saved as exact is exact on one machine and on 3 workers."""
    zoo = _zoo()
    saved = json.loads((ZOO_PATH.parent / "results" / "pyg_hetero_zoo.json").read_text())
    assert saved["meta"]["counts"][zoo.WRONG] == 0 and saved["meta"]["counts"][zoo.CRASH] == 0
    names = [r["name"] for r in saved["records"] if r["outcome"] == zoo.EXACT]
    assert len(names) >= 40, names
    wrong = [r for r in zoo.sweep(names, world_sizes=(3,), log=lambda s: None) if r.outcome != zoo.EXACT]
    assert not wrong, [(r.name, r.outcome, r.detail) for r in wrong]
