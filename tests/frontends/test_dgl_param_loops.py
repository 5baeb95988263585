"""DGL's rgcn-hetero example builds its per-relation weights by a Python loop over a
parameter's rows (``enumerate(torch.split(self.basis(), 1, dim=0))``, passed as HeteroGraphConv's
``mod_kwargs``): traced with the loop's known length, it is exact against DGL in eval and
against the compiled one-machine run in train (its dropout) on 2 gloo workers, through the
models sweep's harness. Runs only where DGL is installed (the DGL environment)."""

from __future__ import annotations

import pytest
from commands import ROOT, import_script

pytest.importorskip("dgl")


def test_a_loop_over_a_parameters_rows_in_dgls_rgcn_hetero_is_exact():
    ms = import_script(ROOT / "benchmarks" / "dgl_models_sweep.py")
    names = ["RGCN hetero (rgcn-hetero) [eval]", "RGCN hetero (rgcn-hetero) [train]"]
    records = ms.SWEEP.sweep(names, world_sizes=(2,), log=lambda s: None)
    assert [r.outcome for r in records] == [ms.EXACT] * 2, [(r.name, r.outcome, r.detail) for r in records]
    assert records[0].oracle == "eager"
