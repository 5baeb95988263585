"""``sarcompile.predict``: every node's prediction and a layer's embedding written on 1, 3 and 4
workers, each worker its own rows, read back by ``sc.read_predictions`` equal to the eager
model on the whole graph (one-type and typed); the refusals of bad input; damaged files
named on reading; the command line under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from commands import import_script
from train_jobs import run_train

import sarcompile as sc
from sarcompile.errors import PredictionError
from sarcompile.predict import LayerOutput, predict
from sarcompile.predict.run import _rows
from sarcompile.data.synthetic import mag_like
from sarcompile.train import load_trained

ROOT = Path(__file__).resolve().parents[2]
OWN = str(ROOT / "examples" / "own_model.py")
bench = import_script(ROOT / "benchmarks" / "predict_ooc.py")


def predict_job(rank: int, world_size: int, argv: list[str]):
    """Runs on a pool worker: the manifest predict returns, or its error's message."""
    try:
        return predict([*argv, "--no-progress"])
    except (sc.SarcompileError, ValueError) as e:
        return f"{type(e).__name__}: {e}"


def run_predict(pool, n: int, argv: list[str]):
    results = pool(n).run(predict_job, [argv] * n)
    assert all(r == results[0] for r in results), "ranks disagree"
    return results[0]


def _node_data(n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    masks = torch.rand(n, generator=gen)
    return {"x": torch.randn(n, 6, generator=gen), "y": torch.randint(3, (n,), generator=gen),
            "train_mask": masks < 0.6, "val_mask": (masks >= 0.6) & (masks < 0.8), "test_mask": masks >= 0.8}


@pytest.fixture(scope="module")
def graph(tmp_path_factory, pool) -> dict:
    """A random graph (isolated nodes, self-loops) of 300 nodes cut into 1, 3 and 4 parts,
    and a run trained on it (SAGE, batch norm: eval mode uses its running statistics)."""
    tmp = tmp_path_factory.mktemp("predict")
    gen = torch.Generator().manual_seed(0)
    n = 300
    src, dst = torch.randint(n - 10, (1500,), generator=gen), torch.randint(n - 10, (1500,), generator=gen)
    g = sc.Graph.from_edges(torch.cat([src, torch.arange(5)]), torch.cat([dst, torch.arange(5)]), n)
    out = {"root": tmp}
    for parts in (1, 3, 4):
        out[parts] = str(tmp / f"parts{parts}")
        sc.partition(g, parts, out[parts], node_data=_node_data(n, gen.manual_seed(1)))
    out["run"] = tmp / "run"
    run_train(pool, 1, ["--parts", out[1], "--out", str(out["run"]), "--epochs", "3", "--hidden", "12",
                        "--layers", "3", "--batch-norm", "--dropout", "0.5", "--no-progress"])
    return out


def _eager(run: Path, parts: str, layer: str | None = None):
    """The eager model's output (or layer ``layer``'s) on the whole graph."""
    model, config = load_trained(run)
    whole, data = sc.load_whole_graph(parts)
    x = data["x"] if config.get("target") is None else {t: d["x"] for t, d in data.items() if "x" in d}
    seen = []
    if layer is not None:
        model.get_submodule(layer).register_forward_hook(lambda m, a, o: seen.append(o))
    with torch.no_grad():
        out = model(whole, x)
    return seen[0] if layer is not None else out


def _assert_rows_are_the_workers(pred: Path, parts: str, n: int, ntype: str | None = None) -> None:
    """Worker r's ids file holds exactly its part's nodes: each node written once, by its owner."""
    prefix = f"{ntype}." if ntype else ""
    for r in range(n):
        part = sc.load_partition(parts, rank=r, world_size=n)
        ids = np.load(pred / f"{prefix}part-{r}.ids.npy")
        owned = part.global_ids if ntype is None else part.global_ids[ntype]
        assert torch.equal(torch.from_numpy(ids), owned)


def _mapped_from(t: torch.Tensor, path: Path) -> bool:
    """Whether ``t``'s memory is a mapping of the file ``path`` (Linux's /proc/self/maps)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return True
    for line in maps.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5] == str(path.resolve()):
            start, end = (int(v, 16) for v in fields[0].split("-"))
            if start <= t.data_ptr() < end:
                return True
    return False


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# -- every node once, equal to the eager model on the whole graph ----------------------------------
@pytest.mark.parametrize("n", [1, 3, 4])
@pytest.mark.parametrize("layer", [None, "convs.1"], ids=["predictions", "layer"])
def test_every_nodes_output_once_on_1_3_4_workers_equals_the_eager_model(pool, graph, tmp_path, layer, n):
    want = _eager(graph["run"], graph[1], layer)
    pred = tmp_path / "pred"
    manifest = run_predict(pool, n, ["--run-dir", str(graph["run"]), "--parts", graph[n], "--out", str(pred),
                                     *(["--layer", layer] if layer else [])])
    assert isinstance(manifest, dict), manifest
    assert manifest["world_size"] == n and manifest["layer"] == layer and not manifest["typed"]
    [output] = manifest["outputs"]
    assert output["num_nodes"] == 300 and output["shape"] == list(want.shape)
    assert sum(p["rows"] for p in output["parts"]) == 300
    _assert_rows_are_the_workers(pred, graph[n], n)
    got = sc.read_predictions(pred)
    _close(got, want)
    assert _mapped_from(got, pred / "global.npy")
    checkpoint = json.loads((graph["run"] / "run.json").read_text())["run"]
    assert manifest["model"]["run"] == checkpoint and manifest["model"]["epoch"] == 3
    assert manifest["model"]["config"]["model"] == "sage"


@pytest.fixture(scope="module")
def mag(tmp_path_factory, pool) -> dict:
    """A small MAG-like typed graph (featureless authors, institutions and fields: node
    tables) in 1 and 3 parts, and an RGCN run trained on it."""
    tmp = tmp_path_factory.mktemp("mag")
    ds = mag_like(90, 70, 5, 16, features=6, num_classes=4, seed=3)
    out = {}
    for n in (1, 3):
        out[n] = str(tmp / f"parts{n}")
        sc.partition(ds.graph, n, out[n], node_data=ds.node_data)
    out["run"] = tmp / "run"
    run_train(pool, 1, ["--parts", out[1], "--out", str(out["run"]), "--model", "rgcn", "--epochs", "2",
                        "--hidden", "8", "--embed-dim", "5", "--no-progress"])
    return out


def test_a_typed_models_predictions_and_layer_on_3_workers_equal_the_eager_model(pool, mag, tmp_path):
    pred = tmp_path / "pred"
    manifest = run_predict(pool, 3, ["--run-dir", str(mag["run"]), "--parts", mag[3], "--out", str(pred)])
    assert manifest["typed"] and [o["type"] for o in manifest["outputs"]] == ["paper"]
    got = sc.read_predictions(pred)
    assert list(got) == ["paper"]
    _close(got["paper"], _eager(mag["run"], mag[1]))
    _assert_rows_are_the_workers(pred, mag[3], 3, "paper")

    emb = tmp_path / "emb"
    manifest = run_predict(pool, 3, ["--run-dir", str(mag["run"]), "--parts", mag[3], "--out", str(emb), "--layer",
                                     "layers.0"])
    want = _eager(mag["run"], mag[1], "layers.0")  # a dict per node type the layer computes
    got = sc.read_predictions(emb)
    assert set(got) == set(want) and len(want) > 1
    for t in want:
        _close(got[t], want[t])
        _assert_rows_are_the_workers(emb, mag[3], 3, t)


# -- a model of one's own (--model MODULE:FACTORY), called in PyG's convention --------------------
@pytest.fixture(scope="module")
def own_run(pool, graph, tmp_path_factory) -> Path:
    """examples/own_model.py's SAGE-then-GAT PyG model, trained on the one-type graph."""
    run = tmp_path_factory.mktemp("own") / "run"
    run_train(pool, 1, ["--parts", graph[1], "--out", str(run), "--model", f"{OWN}:build", "--model-args",
                        json.dumps({"hidden": 10}), "--epochs", "2", "--no-progress"])
    return run


@pytest.mark.parametrize("layer", [None, "encoder"], ids=["predictions", "layer"])
def test_an_own_pyg_models_predictions_on_3_workers_equal_eager_pyg(pool, graph, own_run, tmp_path, layer):
    pred = tmp_path / "pred"
    manifest = run_predict(pool, 3, ["--run-dir", str(own_run), "--parts", graph[3], "--out", str(pred),
                                     *(["--layer", layer] if layer else [])])
    assert isinstance(manifest, dict), manifest
    model, _ = load_trained(own_run)
    whole, data = sc.load_whole_graph(graph[1])
    seen = []
    if layer is not None:
        model.get_submodule(layer).register_forward_hook(lambda m, a, o: seen.append(o))
    with torch.no_grad():  # PyG itself, on the whole graph's edge_index
        out = model(data["x"], torch.stack([whole.src, whole.dst]))
    _close(sc.read_predictions(pred), seen[0] if layer else out)
    _assert_rows_are_the_workers(pred, graph[3], 3)


def test_an_own_typed_models_predictions_on_3_workers_equal_one_workers(pool, mag, tmp_path):
    """to_hetero with a node table of each featureless type (found by use): each worker
    keeps its rows of the tables, and the predictions are one machine's."""
    run = tmp_path / "run"
    run_train(pool, 1, ["--parts", mag[1], "--out", str(run), "--model", f"{OWN}:typed", "--model-args",
                        json.dumps({"hidden": 8}), "--epochs", "2", "--no-progress"])
    preds = {}
    for n in (1, 3):
        manifest = run_predict(pool, n, ["--run-dir", str(run), "--parts", mag[n], "--out", str(tmp_path / f"p{n}")])
        assert isinstance(manifest, dict), manifest
        preds[n] = sc.read_predictions(tmp_path / f"p{n}")["paper"]
    _close(preds[3], preds[1])
    _assert_rows_are_the_workers(tmp_path / "p3", mag[3], 3, "paper")


# -- memory: the plan's inference estimate, and each worker's own rows only --------------------------
@pytest.fixture(scope="module")
def sized(tmp_path_factory, pool) -> dict:
    """A random graph whose data outweighs the processes' noise (40k nodes, 400k edges, 64
    features: 10 MiB of x), cut into 1 and 3 parts, and a SAGE run trained on it."""
    tmp = tmp_path_factory.mktemp("sized")
    gen = torch.Generator().manual_seed(0)
    n = 40_000
    g = sc.Graph.from_edges(torch.randint(n, (10 * n,), generator=gen), torch.randint(n, (10 * n,), generator=gen), n)
    data = {**_node_data(n, gen), "x": torch.randn(n, 64, generator=gen)}
    out = {n: str(tmp / f"parts{n}") for n in (1, 3)}
    for parts in (1, 3):
        sc.partition(g, parts, out[parts], node_data=data)
    out["run"] = tmp / "run"
    run_train(pool, 1, ["--parts", out[1], "--out", str(out["run"]), "--epochs", "1", "--hidden", "16",
                        "--no-progress"])
    return out


def _fresh_predict(sized: dict, n: int, out: Path) -> list[dict]:
    """Predict on ``n`` fresh torchrun workers (a pool worker's resident size holds what its
    earlier jobs freed), each recording what it touched (benchmarks/predict_ooc_worker.py)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SARCOMPILE_TIMEOUT": "60", "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
            str(ROOT / "benchmarks" / "predict_ooc_worker.py"), str(out / "records"), "--run-dir", str(sized["run"]),
            "--parts", sized[n], "--out", str(out / "pred")]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return [json.loads((out / "records" / f"rank-{r}.json").read_text()) for r in range(n)]


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads pages and peaks from Linux's /proc")
@pytest.mark.parametrize("n", [1, 3])
def test_each_worker_touches_its_own_rows_and_peaks_within_the_inference_estimate(sized, tmp_path, n):
    """Every worker's measured peak (resident, above its imports) is at most the plan's
    inference estimate + 15%, which is below the training estimate. Each opens the manifest
    and its own part file only, and no other worker's prediction files; its part file's
    pages resident after the forward are its node rows, not the edge lists
    (benchmarks/predict_ooc.py checks the same at 4M nodes on 8 workers)."""
    records = _fresh_predict(sized, n, tmp_path)
    model, _ = load_trained(sized["run"])
    plan = sc.distribute(model.eval()).plan(sized[n], optimizer="adam")
    predicting, training = plan.memory_estimate(inference=True), plan.memory_estimate()
    manifest = json.loads((Path(sized[n]) / "manifest.json").read_text())
    for rec in records:
        r, mem = rec["rank"], rec["memory"]
        assert mem["estimate_bytes"] == predicting[r].peak_bytes < training[r].peak_bytes
        # + 2 MiB: at a 25 MiB peak, the allocator's and gloo's threads' page-granular growth is
        # within a few percent of it (the 4M-node benchmark holds the bare 15%)
        assert 0 < mem["peak_above_floor_bytes"] <= 1.15 * mem["estimate_bytes"] + 2 * 2**20, records
        assert all(bench.only_own_rows(rec, manifest).values()), (bench.only_own_rows(rec, manifest), rec)
        assert rec["opened"]["out"], rec  # (the hook saw its writes)


# -- bad input, refused before anything is written -------------------------------------------------
def test_bad_input_is_refused_with_what_to_do(pool, graph, mag, tmp_path):
    run, parts = str(graph["run"]), graph[1]

    def refused(n: int, *argv: str) -> str:
        got = run_predict(pool, n, list(argv))
        assert isinstance(got, str), "not refused"
        return got

    assert "has no checkpoint: give the --out of a training run" in refused(
        1, "--run-dir", str(tmp_path), "--parts", parts, "--out", str(tmp_path / "a"))
    assert "is of another graph than run" in refused(1, "--run-dir", str(mag["run"]), "--parts", parts, "--out",
                                                     str(tmp_path / "a"))
    assert "has 3 parts but this run has 1 workers" in refused(1, "--run-dir", run, "--parts", graph[3], "--out",
                                                                str(tmp_path / "a"))
    message = refused(1, "--run-dir", run, "--parts", parts, "--out", str(tmp_path / "a"), "--layer", "conv.1")
    assert message.startswith("PredictionError: --layer conv.1: the model has no such layer; its layers are: convs,")
    assert "convs.1" in message
    assert not (tmp_path / "a").exists()  # nothing written for any of them

    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert "holds files that are not predictions (notes.txt)" in refused(1, "--run-dir", run, "--parts", parts, "--out",
                                                                           str(tmp_path / "busy"))
    # predictions of another layer (or checkpoint) are kept unless --overwrite
    out = str(tmp_path / "pred")
    run_predict(pool, 1, ["--run-dir", run, "--parts", parts, "--out", out, "--layer", "convs.0"])
    message = refused(1, "--run-dir", run, "--parts", parts, "--out", out)
    assert "holds predictions of run" in message and "layer convs.0" in message and "--overwrite" in message
    assert sc.read_predictions(out).shape == (300, 12)
    run_predict(pool, 3, ["--run-dir", run, "--parts", graph[3], "--out", out, "--overwrite"])
    assert sc.read_predictions(out).shape == (300, 3)
    assert sorted(p.name for p in Path(out).glob("part-*")) == [f"part-{r}.{k}.npy" for r in range(3)
                                                                 for k in ("ids", "values")]


def test_a_layer_output_that_is_not_one_row_per_node_is_refused(graph):
    part = sc.load_partition(graph[3], rank=1, world_size=3)
    n = part.graph.num_nodes
    _, error = _rows(torch.zeros(1, 4), part, None, "pool")
    assert error == (f"--layer pool gives (1, 4) on worker 1, which holds {n} nodes: not one row per node, so it "
                     "has no per-node values to write; name a layer whose output has a row per node")
    _, error = _rows((torch.zeros(n, 4), torch.zeros(3)), part, None, "att")
    assert error == "--layer att returns a tuple, not a tensor of one row per node"
    rows, error = _rows(torch.zeros(n, 4), part, None, None)
    assert error is None and list(rows) == [None]


class _Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = sc.nn.SAGEConv(2, 2)
        self.unused = nn.Linear(2, 2)

    def forward(self, g, x):
        return self.conv(g, self.conv(g, x))


@pytest.mark.parametrize("layer, times", [("conv", 2), ("unused", 0)])
def test_a_layer_called_other_than_once_is_refused(layer, times):
    g = sc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    with pytest.raises(PredictionError, match=f"--layer {layer}: the layer is called {times} times by one forward"):
        sc.distribute(LayerOutput(_Twice(), layer))(g, torch.ones(3, 2))


# -- reading back ----------------------------------------------------------------------------------
def test_read_predictions_names_a_missing_or_damaged_file(pool, graph, tmp_path):
    out = tmp_path / "pred"
    run_predict(pool, 3, ["--run-dir", str(graph["run"]), "--parts", graph[3], "--out", str(out)])
    want = sc.read_predictions(out).clone()
    # a damaged assembled file is assembled again from the parts
    (out / "global.npy").write_bytes((out / "global.npy").read_bytes()[:-4] + b"\0\0\0\1")
    assert torch.equal(sc.read_predictions(out), want)

    values = out / "part-1.values.npy"
    data = bytearray(values.read_bytes())
    data[-1] ^= 1
    values.write_bytes(bytes(data))
    (out / "global.npy").unlink()
    with pytest.raises(PredictionError, match=r"part-1.values.npy' does not match the checksum in predictions.json"):
        sc.read_predictions(out)
    values.unlink()
    with pytest.raises(PredictionError, match=r"part-1.values.npy' is missing"):
        sc.read_predictions(out)
    (out / "predictions.json").unlink()
    with pytest.raises(PredictionError, match="has no predictions.json"):
        sc.read_predictions(out)


def test_read_predictions_of_a_read_only_directory_assembles_in_memory(pool, graph, tmp_path):
    out = tmp_path / "pred"
    run_predict(pool, 3, ["--run-dir", str(graph["run"]), "--parts", graph[3], "--out", str(out)])
    os.chmod(out, 0o555)
    try:
        if os.access(out, os.W_OK):  # (root writes anyway)
            pytest.skip("the directory stays writable for this user")
        got = sc.read_predictions(out)
    finally:
        os.chmod(out, 0o755)
    _close(got, _eager(graph["run"], graph[1]))
    assert not (out / "global.npy").exists()


# -- the command line ------------------------------------------------------------------------------
def test_cli_under_torchrun(graph, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SARCOMPILE_TIMEOUT": "60"}
    out = tmp_path / "pred"
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
            "-m", "sarcompile.predict", "--run-dir", str(graph["run"]), "--parts", graph[3], "--out", str(out)]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    wrote, *peaks = done.stdout.splitlines()
    assert wrote == f"3 workers wrote the predictions of the checkpoint of epoch 3 ([300, 3]) to {out}"
    assert [int(bench.PEAK.match(line).group(1)) for line in peaks] == [0, 1, 2], peaks  # each worker's peak
    assert "forward" in done.stderr and "writing" in done.stderr  # the progress bar
    _close(sc.read_predictions(out), _eager(graph["run"], graph[1]))

    bad = [sys.executable, "-m", "sarcompile.predict", "--run-dir", str(graph["run"]), "--parts", graph[1], "--out",
           str(tmp_path / "emb"), "--layer", "nope"]
    done = subprocess.run(bad, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("error: --layer nope: the model has no such layer")


def test_run_dir_flag_and_its_one_process_spelling():
    """--run-dir works under torchrun (whose parser would take a bare --run for its --run-path);
    API.md's --run still works in one process."""
    from sarcompile.predict import parse_args

    for flag in ("--run-dir", "--run"):
        assert parse_args([flag, "RUN", "--parts", "P", "--out", "O"]).run == "RUN"
