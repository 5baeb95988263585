"""``sarcompile.train --model MODULE:FACTORY``: a user's own PyG models (examples/own_model.py)
trained to the same per-epoch numbers on 1 and 3 workers, against an eager oracle for the
first step, resumed exactly; the ready-made GraphSAGE with dropout; a typed ``to_hetero``
model with a node table; the multilabel and regression tasks; and the refusals."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from ogb_files import write_mag
from train_jobs import curve, metric_keys, run_train

import sarcompile as sc
from sarcompile.cli.main import main as cli
from sarcompile.data.synthetic import mag_like
from sarcompile.train import load_trained
from sarcompile.train.model import call_model
from sarcompile.train.tasks import _rocauc

ROOT = Path(__file__).resolve().parents[2]
OWN = str(ROOT / "examples" / "own_model.py")
N = 240


def _graph_data(seed: int = 0) -> tuple[sc.Graph, dict]:
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, N, (6 * N,), generator=gen)
    dst = torch.randint(0, N, (6 * N,), generator=gen)
    keep = src != dst
    x = torch.randn(N, 12, generator=gen)
    y = (x[:, :4].argmax(1) + (torch.rand(N, generator=gen) < 0.2).long()) % 4
    split = torch.rand(N, generator=gen)
    data = {"x": x, "y": y, "train_mask": split < 0.6, "val_mask": (split >= 0.6) & (split < 0.8),
            "test_mask": split >= 0.8}
    return sc.Graph.from_edges(src[keep], dst[keep], N), data


def _partitions(root: Path, data: dict, g: sc.Graph) -> dict[int, str]:
    out = {}
    for n in (1, 3):
        out[n] = str(root / f"parts{n}")
        sc.partition(g, n, out[n], node_data=data)
    return out


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    g, data = _graph_data()
    return g, data, _partitions(tmp_path_factory.mktemp("own"), data, g)


def _args(parts: str, out: Path, model: str, model_args: dict, *extra) -> list[str]:
    return ["--parts", parts, "--out", str(out), "--model", model, "--model-args", json.dumps(model_args),
            "--no-progress", "--lr", "0.02", *map(str, extra)]


def _assert_close(a: list[dict], b: list[dict], rel: float = 1e-5) -> None:
    assert [r["epoch"] for r in a] == [r["epoch"] for r in b]
    for x, y in zip(a, b):
        for k in metric_keys(x):
            assert (x[k] is None) == (y[k] is None), k
            if x[k] is not None:
                assert math.isclose(x[k], y[k], rel_tol=rel, abs_tol=rel), (k, x[k], y[k])


def _same_on_1_and_3(pool, parts: dict[int, str], tmp_path: Path, factory: str, model_args: dict,
                     *extra) -> dict[int, list[dict]]:
    """The curves of one run on 1 worker and on 3, checked equal (rel 1e-5)."""
    curves = {n: run_train(pool, n, _args(parts[n], tmp_path / f"n{n}", f"{OWN}:{factory}", model_args, *extra))
              for n in (1, 3)}
    assert isinstance(curves[1], list) and isinstance(curves[3], list), (curves[1], curves[3])
    _assert_close(curves[3], curves[1])
    return curves


def _eager_loss(model_args: dict, data: dict, g: sc.Graph, factory: str = "build", task: str = "classification"):
    """The oracle of the first epoch's loss: the factory's model built with the trainer's seed,
    run eagerly by PyG on the whole graph's edge_index."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("own_model_oracle", OWN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    classes = int(data["y"].max()) + 1 if task == "classification" else data["y"].shape[1]
    model = getattr(mod, factory)(in_features=data["x"].shape[1], num_classes=classes, **model_args)
    out = model(data["x"], torch.stack([g.src, g.dst]))
    m = data["train_mask"]
    if task == "classification":
        return float(F.cross_entropy(out[m], data["y"][m]).detach())
    return float(F.binary_cross_entropy_with_logits(out[m], data["y"][m].float()).detach())


# -- one-type models of one's own ------------------------------------------------------------------
def test_own_pyg_model_same_curve_on_1_and_3_workers_and_first_loss_is_eager(pool, graph, tmp_path):
    g, data, parts = graph
    exact = {"hidden": 24, "dropout": 0.0}
    curves = _same_on_1_and_3(pool, parts, tmp_path, "build", exact, "--epochs", 4)
    assert math.isclose(curves[1][0]["loss"], _eager_loss(exact, data, g), rel_tol=1e-5)
    assert curves[1][-1]["loss"] < curves[1][0]["loss"]
    # the run records how to rebuild the model; load_trained gives the eager one
    model, config = load_trained(tmp_path / "n3")
    assert config["model"] == f"{OWN}:build" and config["model_args"] == exact
    assert type(model).__name__ == "SageThenGat" and not model.training


def test_own_model_with_dropout_resumes_to_the_same_curve(pool, graph, tmp_path):
    _, _, parts = graph
    argv = lambda out, *extra: _args(parts[3], out, f"{OWN}:build", {"hidden": 24}, "--epochs", 5,  # noqa: E731
                                     "--checkpoint-every", 1, *extra)
    whole = run_train(pool, 3, argv(tmp_path / "whole"))
    first = run_train(pool, 3, argv(tmp_path / "cut", "--stop-after", 2))
    rest = run_train(pool, 3, argv(tmp_path / "cut", "--resume"))
    assert curve(first + rest) == curve(whole)
    one = run_train(pool, 1, _args(parts[1], tmp_path / "one", f"{OWN}:build", {"hidden": 24}, "--epochs", 5))
    _assert_close(whole, one)  # dropout masks keyed by node id: the same on 1 and 3 workers


def test_ready_made_graphsage_with_dropout_same_curve(pool, graph, tmp_path):
    _, _, parts = graph
    _same_on_1_and_3(pool, parts, tmp_path, "graphsage", {"hidden": 16, "dropout": 0.5}, "--epochs", 4)


# -- tasks -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def multilabel(tmp_path_factory):
    g, data = _graph_data(1)
    data = {**data, "y": (data["x"][:, :5] + 0.3 * torch.randn(N, 5) > 0).long()}
    return g, data, _partitions(tmp_path_factory.mktemp("multilabel"), data, g)


def test_multilabel_task_rocauc_and_loss_match_one_machine(pool, multilabel, tmp_path):
    g, data, parts = multilabel
    exact = {"hidden": 16, "dropout": 0.0}
    curves = _same_on_1_and_3(pool, parts, tmp_path, "build", exact, "--epochs", 3, "--task", "multilabel")
    assert math.isclose(curves[1][0]["loss"], _eager_loss(exact, data, g, task="multilabel"), rel_tol=1e-5)
    # the logged ROC-AUC is the trained model's, as OGB computes it on the whole graph
    model, _ = load_trained(tmp_path / "n3")
    with torch.no_grad():
        out = model(data["x"], torch.stack([g.src, g.dst]))
    m = data["val_mask"]
    assert math.isclose(curves[3][-1]["val_rocauc"], _rocauc(out[m], data["y"][m]), rel_tol=1e-6)


def test_regression_task_rmse_matches_one_machine(pool, tmp_path):
    g, data = _graph_data(2)
    data = {**data, "y": data["x"][:, :2].sum(1) + 0.1 * torch.randn(N)}  # one float target per node
    parts = _partitions(tmp_path, data, g)
    curves = _same_on_1_and_3(pool, parts, tmp_path, "build", {"hidden": 16}, "--epochs", 3, "--task", "regression")
    model, config = load_trained(tmp_path / "n1")
    with torch.no_grad():
        out = model(data["x"], torch.stack([g.src, g.dst])).reshape(-1)
    m = data["test_mask"]
    rmse = float(((out[m] - data["y"][m]) ** 2).mean().sqrt())
    assert config["num_classes"] == 1 and math.isclose(curves[1][-1]["test_rmse"], rmse, rel_tol=1e-5)
    # a float y read as class ids is refused by the classification task, not by the partitioner
    msg = run_train(pool, 1, _args(parts[1], tmp_path / "cls", f"{OWN}:build", {}, "--epochs", 1))
    assert "labels must be integer class ids" in msg and "--task regression" in msg


# -- typed -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mag(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mag")
    root = write_mag(tmp / "ogb", mag_like(150, 120, 6, 24, features=6, num_classes=4, seed=2, add_reverse=False))
    out = {}
    for n in (1, 3):
        out[n] = str(tmp / f"parts{n}")
        assert cli(["partition", "--dataset", "ogbn-mag", "--root", str(root), "--parts", str(n), "--out", out[n]]) == 0
    return out


def test_own_typed_to_hetero_model_with_node_tables_same_curve_and_resume(pool, mag, tmp_path):
    argv = lambda n, out, *extra: _args(mag[n], out, f"{OWN}:typed", {"hidden": 8}, "--epochs", 4,  # noqa: E731
                                        "--checkpoint-every", 1, *extra)
    one = run_train(pool, 1, argv(1, tmp_path / "one"))
    three = run_train(pool, 3, argv(3, tmp_path / "three"))
    assert isinstance(three, list), three
    _assert_close(three, one)
    first = run_train(pool, 3, argv(3, tmp_path / "cut", "--stop-after", 2))
    rest = run_train(pool, 3, argv(3, tmp_path / "cut", "--resume"))
    assert curve(first + rest) == curve(three)
    model, config = load_trained(tmp_path / "three")  # node tables gathered whole
    assert set(model.tables) and all(t.shape[0] == config["node_counts"][k] for k, t in model.tables.items())


# -- refusals ------------------------------------------------------------------------------------------
def test_own_model_refusals(pool, graph, tmp_path):
    _, _, parts = graph
    run = lambda *extra, model=f"{OWN}:build", args=None: run_train(  # noqa: E731
        pool, 1, _args(parts[1], tmp_path / f"r{len(list(tmp_path.iterdir()))}", model, args or {}, "--epochs", 1,
                       *extra))
    assert "options of the built-in models" in run("--hidden", 64) and "--model-args" in run("--hidden", 64)
    assert "sets in_features, which the trainer gives" in run(args={"in_features": 3})
    assert "unexpected keyword argument 'width'" in run(args={"width": 3})
    assert "has no 'nope'" in run(model=f"{OWN}:nope")
    assert "cannot import" in run(model="no_such_module_xyz:build")
    # a resume whose factory cannot be imported any more
    moved = tmp_path / "mine.py"
    shutil.copy(OWN, moved)
    out = tmp_path / "gone"
    assert isinstance(run_train(pool, 1, _args(parts[1], out, f"{moved}:build", {}, "--epochs", 1)), list)
    moved.unlink()
    msg = run_train(pool, 1, _args(parts[1], out, f"{moved}:build", {}, "--epochs", 2, "--resume"))
    assert "cannot build the model" in msg and "mine.py" in msg


def test_call_convention_is_read_from_forward():
    class Odd(torch.nn.Module):
        def forward(self, a, b):
            return a

    with pytest.raises(sc.errors.GraphError, match=r"Odd.forward\(a, b\): the trainer cannot tell where the graph"):
        call_model(Odd(), None, None)
