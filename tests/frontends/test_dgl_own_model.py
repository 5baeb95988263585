"""``sarcompile.train --model examples/own_model_dgl.py:build``: a plain DGL model of the
user's own trains to the same per-epoch numbers on 1 and 3 workers, and its first loss is the
eager DGL model's on the whole graph. Runs where DGL is installed (the DGL environment)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

dgl = pytest.importorskip("dgl")

import torch
import torch.nn.functional as F
from train_jobs import metric_keys, run_train

import sarcompile as sc

ROOT = Path(__file__).resolve().parents[2]
OWN = str(ROOT / "examples" / "own_model_dgl.py")
N = 200


def test_own_dgl_model_same_curve_on_1_and_3_workers_and_first_loss_is_eager(pool, tmp_path):
    gen = torch.Generator().manual_seed(4)
    src, dst = torch.randint(0, N, (5 * N,), generator=gen), torch.randint(0, N, (5 * N,), generator=gen)
    src, dst = torch.cat([src, torch.arange(N)]), torch.cat([dst, torch.arange(N)])  # in-edges for GATConv
    x = torch.randn(N, 8, generator=gen)
    split = torch.rand(N, generator=gen)
    data = {"x": x, "y": x[:, :3].argmax(1), "train_mask": split < 0.6, "val_mask": (split >= 0.6) & (split < 0.8),
            "test_mask": split >= 0.8}
    g = sc.Graph.from_edges(src, dst, N)
    curves = {}
    for n in (1, 3):
        sc.partition(g, n, tmp_path / f"parts{n}", node_data=data)
        argv = ["--parts", str(tmp_path / f"parts{n}"), "--out", str(tmp_path / f"run{n}"), "--model", f"{OWN}:build",
                "--model-args", json.dumps({"hidden": 16, "dropout": 0.0}), "--epochs", "3", "--no-progress"]
        curves[n] = run_train(pool, n, argv)
        assert isinstance(curves[n], list), curves[n]
    for a, b in zip(curves[3], curves[1]):
        for k in metric_keys(a):
            assert a[k] is None and b[k] is None or math.isclose(a[k], b[k], rel_tol=1e-5, abs_tol=1e-6), (k, a, b)
    spec = importlib.util.spec_from_file_location("own_model_dgl_oracle", OWN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)  # the trainer's --seed
    model = mod.build(in_features=8, num_classes=3, hidden=16, dropout=0.0)
    out = model(dgl.graph((src, dst), num_nodes=N), x)
    m = data["train_mask"]
    assert math.isclose(curves[1][0]["loss"], float(F.cross_entropy(out[m], data["y"][m]).detach()), rel_tol=1e-5)


def test_own_dgl_model_with_dropout_resumes_to_the_same_curve(pool, tmp_path):
    """feat_drop and dropout masks keyed by node id: a run stopped after epoch 2 and resumed on
    3 workers logs the uninterrupted run's numbers."""
    from train_jobs import curve

    gen = torch.Generator().manual_seed(5)
    src = torch.cat([torch.randint(0, N, (5 * N,), generator=gen), torch.arange(N)])
    dst = torch.cat([torch.randint(0, N, (5 * N,), generator=gen), torch.arange(N)])
    x = torch.randn(N, 8, generator=gen)
    split = torch.rand(N, generator=gen)
    data = {"x": x, "y": x[:, :3].argmax(1), "train_mask": split < 0.6, "val_mask": (split >= 0.6) & (split < 0.8),
            "test_mask": split >= 0.8}
    sc.partition(sc.Graph.from_edges(src, dst, N), 3, tmp_path / "parts", node_data=data)
    argv = lambda out, *extra: ["--parts", str(tmp_path / "parts"), "--out", str(out), "--model",  # noqa: E731
                                f"{OWN}:build", "--model-args", json.dumps({"hidden": 16, "dropout": 0.5}),
                                "--epochs", "4", "--no-progress", "--checkpoint-every", "1", *extra]
    whole = run_train(pool, 3, argv(tmp_path / "whole"))
    first = run_train(pool, 3, argv(tmp_path / "cut", "--stop-after", "2"))
    rest = run_train(pool, 3, argv(tmp_path / "cut", "--resume"))
    assert isinstance(whole, list) and isinstance(rest, list), (whole, rest)
    assert curve(first + rest) == curve(whole)
