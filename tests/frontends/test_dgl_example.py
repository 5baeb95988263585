"""examples/train_dgl.py end to end: generate a graph, partition it (with the CLI, or with
DGL's partition_graph and --dgl-partition), train a plain DGL model with torchrun on 2
workers, and check every epoch's loss equals the eager DGL model's on the whole graph.

Runs only where DGL is installed (``scripts/test.sh`` runs it in the DGL environment).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

dgl = pytest.importorskip("dgl")

import torch
from commands import run

EPOCHS = 3


def _run(args: list[str]) -> str:
    return run(args, DGLBACKEND="pytorch")




def _train_and_check(parts: Path) -> None:
    out = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "examples/train_dgl.py", "--parts", str(parts), "--epochs", str(EPOCHS), "--hidden", "16",
                "--heads", "2", "--reference"])
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit() and "workers" not in line]
    assert [int(r[0]) for r in rows] == list(range(1, EPOCHS + 1)), out
    for epoch, loss_n, loss_1, diff, _ in rows:
        assert abs(float(loss_n) - float(loss_1)) <= 1e-5 * max(1.0, abs(float(loss_1))), out
    assert float(rows[-1][1]) < float(rows[0][1])  # it trains


def test_train_dgl_matches_eager_dgl_every_epoch(graph_file, tmp_path):
    """SAGEConv + user update_all code + GATConv on 2 workers logs the losses the eager DGL
    model logs on the whole graph."""
    parts = tmp_path / "parts"
    _run([sys.executable, "-m", "sarcompile", "partition", "--edges", str(graph_file),
          "--parts", "2", "--out", str(parts)])
    _train_and_check(parts)


def test_train_dgl_on_a_converted_dgl_partition(graph_file, tmp_path):
    """The same, on a partition DGL's partition_graph made, converted with --dgl-partition."""
    data = torch.load(graph_file, weights_only=True)
    g = dgl.graph((data["src"], data["dst"]), num_nodes=data["num_nodes"])
    for key in ("x", "y", "train_mask"):
        g.ndata[key] = data[key]
    dgl.distributed.partition_graph(g, "sbm", 2, str(tmp_path / "dgl"), part_method="metis")
    parts = tmp_path / "parts"
    out = _run([sys.executable, "-m", "sarcompile", "partition", "--dgl-partition", str(tmp_path / "dgl" / "sbm.json"),
                "--out", str(parts)])
    assert "DGL's reshuffled node ids" in out
    _train_and_check(parts)
