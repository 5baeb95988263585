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


def test_own_model_tutorial_trains_on_3_workers_and_predicts_every_node(graph_file, tmp_path):
    """docs/tutorials.md, "Your own model": examples/own_model.py trained by the trainer on 3
    torchrun workers to one process's losses, its predictions exported on 3 workers and read
    back equal to the eager model's output on the whole graph."""
    import json

    import torch

    import sarcompile as sc
    from sarcompile.train import load_trained

    for n in (1, 3):
        run([sys.executable, "-m", "sarcompile", "partition", "--edges", str(graph_file), "--parts", str(n),
             "--out", str(tmp_path / f"parts{n}")])
    train = ["-m", "sarcompile.train", "--model", "examples/own_model.py:build", "--model-args", '{"hidden": 24}',
             "--epochs", "3", "--no-progress"]
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3", *train,
         "--parts", str(tmp_path / "parts3"), "--out", str(tmp_path / "run")])
    run([sys.executable, *train, "--parts", str(tmp_path / "parts1"), "--out", str(tmp_path / "run1")])
    losses = [[json.loads(line)["loss"] for line in (tmp_path / r / "log.jsonl").read_text().splitlines()]
              for r in ("run", "run1")]
    assert len(losses[0]) == 3 and all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(*losses)), losses
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
         "-m", "sarcompile.predict", "--run-dir", str(tmp_path / "run"), "--parts", str(tmp_path / "parts3"),
         "--out", str(tmp_path / "pred"), "--no-progress"])
    predicted = sc.read_predictions(tmp_path / "pred")
    model, _ = load_trained(tmp_path / "run")
    g, data = sc.load_whole_graph(tmp_path / "parts3")
    with torch.no_grad():
        expected = model(data["x"], torch.stack([g.src, g.dst]))
    torch.testing.assert_close(torch.as_tensor(predicted), expected, rtol=1e-5, atol=1e-5)
