"""The README's workflow end to end: generate, partition with the CLI, train with torchrun."""

from __future__ import annotations

import sys

import pytest
from commands import run


@pytest.mark.parametrize("workers", [2, 4])
def test_train_sage_matches_single_machine_every_epoch(graph_file, tmp_path, workers):
    parts = tmp_path / "parts"
    run([sys.executable, "-m", "sarcompile", "partition", "--edges", str(graph_file),
          "--parts", str(workers), "--out", str(parts)])
    out = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(workers),
                "examples/train_sage.py", "--parts", str(parts), "--epochs", "4", "--hidden", "16", "--reference"])
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit() and "workers" not in line]
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4], out
    for epoch, loss_n, loss_1, diff, _ in rows:
        assert abs(float(loss_n) - float(loss_1)) <= 1e-5 * max(1.0, abs(float(loss_1))), out
    assert float(rows[-1][1]) < float(rows[0][1])  # it trains


def test_train_pyg_matches_eager_pyg_every_epoch(graph_file, tmp_path):
    """A plain PyG model (SAGEConv + BatchNorm + GATConv) on 2 workers logs the losses the
    eager PyG model logs on the whole graph."""
    parts = tmp_path / "parts"
    run([sys.executable, "-m", "sarcompile", "partition", "--edges", str(graph_file),
          "--parts", "2", "--out", str(parts)])
    out = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "examples/train_pyg.py", "--parts", str(parts), "--epochs", "4", "--hidden", "16", "--heads", "2",
                "--reference"])
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit() and "workers" not in line]
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4], out
    for epoch, loss_n, loss_1, diff, _ in rows:
        assert abs(float(loss_n) - float(loss_1)) <= 1e-5 * max(1.0, abs(float(loss_1))), out
    assert float(rows[-1][1]) < float(rows[0][1])  # it trains
