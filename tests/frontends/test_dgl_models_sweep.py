"""benchmarks/dgl_models_sweep.py runs DGL's example models through the models sweep's harness:
a model with dropout exact against eager in eval and against the compiled one-machine run in
train, and a typed model with per-edge inputs, on one machine and 2 gloo workers. Runs only
where DGL is installed (``scripts/test.sh`` runs it in the torch 2.2 environment of
``scripts/dgl_env.sh``); tests/benchmarks/test_models_sweep.py checks the harness itself."""

from __future__ import annotations

import pytest
from commands import ROOT, import_script

pytest.importorskip("dgl")

SWEEP_PATH = ROOT / "benchmarks" / "dgl_models_sweep.py"


def test_dgl_example_models_are_exact_in_eval_and_train():
    ms = import_script(SWEEP_PATH)
    names = ["GCN (gcn/train.py) [eval]", "GCN (gcn/train.py) [train]", "HGTConv (to_homogeneous) [train]"]
    records = {r.name: r for r in ms.SWEEP.sweep(names, world_sizes=(2,), log=lambda s: None)}
    assert all(r.outcome == ms.EXACT for r in records.values()), [(r.name, r.outcome, r.detail)
                                                                  for r in records.values()]
    assert records["GCN (gcn/train.py) [eval]"].oracle == "eager"
    assert records["GCN (gcn/train.py) [train]"].oracle == "compiled"
    assert records["HGTConv (to_homogeneous) [train]"].oracle == "compiled"
