"""``sarcompile.train`` on typed partitions: RGCN and HGT with embedding tables, exact on 1-3
workers (outputs and every gradient, and whole training curves with dropout); checkpoints
that hold the node tables whole and resume on another number of workers or after a
SIGKILL; the eager model serving a checkpoint; ``sarcompile partition`` of ogbn-mag-format
files and of a synthetic MAG-like graph; and the refusals."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hetero_cases import typed_graphs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ogb_files import write_mag
from train_jobs import ACC_KEYS, curve, run_train

import sarcompile as sc
from sarcompile.data.checkpoint import latest_checkpoint, read_state
from sarcompile.cli.main import main as cli
from sarcompile.graph.hetero import parse_relation_key
from sarcompile.train.typed_models import HGT, RGCN
from sarcompile.data.manifest import read_manifest
from sarcompile.data.synthetic import mag_like
from sarcompile.train import build_model, evaluate, load_trained

ROOT = Path(__file__).resolve().parents[2]
MODELS = {"rgcn": RGCN, "hgt": HGT}


@pytest.fixture(scope="module")
def mag(tmp_path_factory) -> dict:
    """A small MAG-like graph written as ogbn-mag's files and partitioned from them by the
    command line into 1, 2 and 3 parts: ``{"root": ..., "dataset": ..., 1: dir, 2: dir, 3: dir}``."""
    tmp = tmp_path_factory.mktemp("mag")
    ds = mag_like(150, 120, 6, 24, features=6, num_classes=4, seed=2, add_reverse=False)
    root = write_mag(tmp / "ogb", ds)
    out = {"root": root, "dataset": ds}
    for n in (1, 2, 3):
        out[n] = str(tmp / f"parts{n}")
        assert cli(["partition", "--dataset", "ogbn-mag", "--root", str(root), "--parts", str(n), "--out", out[n]]) == 0
    return out


def _args(parts: str, out: Path, *extra) -> list[str]:
    return ["--parts", parts, "--out", str(out), "--hidden", "8", "--heads", "2", "--no-progress", *map(str, extra)]


def _assert_close(a: list[dict], b: list[dict], rel: float = 1e-5) -> None:
    assert [r["epoch"] for r in a] == [r["epoch"] for r in b]
    for x, y in zip(a, b):
        for k in ACC_KEYS:
            assert math.isclose(x[k], y[k], rel_tol=rel, abs_tol=rel), f"epoch {x['epoch']} {k}: {x[k]} vs {y[k]}"


# -- the models: outputs and every gradient equal one machine's ------------------------------------
def _model(kind: str, g: sc.HeteroGraph, featured: dict[str, int], seed: int, dropout: float = 0.5):
    torch.manual_seed(seed)
    counts = {t: g.num_nodes(t) for t in g.node_types}
    options = {"heads": 2} if kind == "hgt" else {}
    return MODELS[kind](counts, g.edge_types, featured, "paper", 3, hidden=4, layers=2, dropout=dropout,
                        embed_dim=3, **options).double()


def _step(model, g, x: dict, labels: torch.Tensor) -> dict:
    """A training-mode step (dropout on) of a loss weighted per row: outputs, input and
    parameter gradients (node tables: this worker's rows)."""
    x = {t: v.clone().requires_grad_() for t, v in x.items()}
    out = model(g, x)
    model.zero_grad()
    (out * labels).sum().backward()
    # (nothing reached a tensor without a gradient: zero, as on a worker without its rows)
    def grad(v: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(v) if v.grad is None else v.grad.clone()

    return {"out": out.detach(), "x_grad": {t: grad(v) for t, v in x.items()},
            "grads": {k: grad(p) for k, p in model.named_parameters()}}


def _model_worker(rank: int, world_size: int, payload: dict) -> dict:
    part = sc.load_partition(payload["dir"], rank=rank, world_size=world_size)
    model = _model(payload["kind"], payload["graph"], payload["featured"], 0)
    model.load_state_dict(payload["state"])
    ids = part.global_ids
    x = {t: v[ids[t]] for t, v in payload["x"].items()}
    result = _step(sc.distribute(model), part.graph, x, payload["labels"][ids["paper"]])
    result["grads"] = {k: v if k.startswith("embed.") else sc.global_sum(v) for k, v in result["grads"].items()}
    return {**result, "ids": ids}


@given(case=typed_graphs(max_nodes=10), data=st.data())
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
def test_rgcn_and_hgt_equal_the_eager_model_on_1_to_3_workers(pool, tmp_path_factory, case, data):
    """Dropout on, float64: the compiled models' outputs, input gradients, parameter
    gradients and embedding-row gradients on N workers equal the eager model's on the
    whole graph (graphs with empty types on some workers and relations missing from parts)."""
    g, seed = case
    if g.num_nodes("paper") == 0 or not any("paper" in (s, d) for s, _, d in g.edge_types):
        return  # no target to predict
    kind = data.draw(st.sampled_from(sorted(MODELS)))
    world = data.draw(st.integers(1, 3))
    featured = {t: 2 for t in g.node_types if t == "paper" or data.draw(st.booleans())}
    gen = torch.Generator().manual_seed(seed)
    x = {t: torch.randn(g.num_nodes(t), w, generator=gen, dtype=torch.float64) for t, w in featured.items()}
    labels = torch.randn(g.num_nodes("paper"), 3, generator=gen, dtype=torch.float64)
    out_dir = tmp_path_factory.mktemp("typed")
    sc.partition(g, world, out_dir, method=data.draw(st.sampled_from(["metis", "random"])), seed=seed)
    model = _model(kind, g, featured, 0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    want = _step(model, g, x, labels)
    payload = {"dir": str(out_dir), "graph": g, "state": state, "kind": kind, "featured": featured, "x": x,
               "labels": labels}
    results = pool(world).run(_model_worker, [payload] * world)
    tol = {"rtol": 1e-9, "atol": 1e-9}
    got = torch.zeros_like(want["out"])
    for r in results:
        got[r["ids"]["paper"]] = r["out"]
    torch.testing.assert_close(got, want["out"], **tol)
    for t, full in want["x_grad"].items():
        got = torch.zeros_like(full)
        for r in results:
            got[r["ids"][t]] = r["x_grad"][t]
        torch.testing.assert_close(got, full, **tol, msg=f"x_grad of {t}")
    for k, full in want["grads"].items():
        if not k.startswith("embed."):
            for r in results:
                torch.testing.assert_close(r["grads"][k], full, **tol, msg=k)
            continue
        t = k.split(".")[1]
        got = torch.zeros_like(full)
        for r in results:
            assert r["grads"][k].shape[0] == r["ids"][t].numel()  # a worker's own rows only
            got[r["ids"][t]] = r["grads"][k]
        torch.testing.assert_close(got, full, **tol, msg=k)


def test_node_tables_are_the_embeddings_not_per_type_linears_of_the_same_width():
    """RGCN's self-loop linear of 'author' has as many output rows as there are authors: it
    is still a weight, not a node table (which would be split by rows across workers)."""
    from sarcompile.graph.tables import find_node_tables

    counts = {"author": 4, "paper": 3}
    net = RGCN(counts, [("author", "writes", "paper"), ("paper", "rev_writes", "author")], {"paper": 2}, "paper",
               num_classes=3, hidden=4, embed_dim=2)
    assert net.layers[0].loop["author"].weight.shape[0] == counts["author"]
    assert find_node_tables(net, counts) == {"embed.author.weight": "author"}
    # a per-type scalar (PyG HGTConv's skip) of a one-node type is no table; a matrix is
    per_type = torch.nn.Module()
    per_type.skip = torch.nn.ParameterDict({"paper": torch.nn.Parameter(torch.ones(1))})
    per_type.embeds = torch.nn.ParameterDict({"paper": torch.nn.Parameter(torch.ones(1, 3))})
    assert find_node_tables(per_type, {"paper": 1}) == {"embeds.paper": "paper"}


def test_dropout_of_the_wrong_type_is_refused():
    class Wrong(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = sc.nn.NodeDropout(0.5)

        def forward(self, g, x):
            return self.drop(g["writes"], x["author"])

    g = sc.HeteroGraph.from_edges({("author", "writes", "paper"): (torch.tensor([0, 1]), torch.tensor([1, 2]))},
                                  {"author": 2, "paper": 3})
    with pytest.raises(sc.CompileError, match=r"NodeDropout keys its mask by the ids of relation .*destination type "
                                              r"'paper', but is given rows of 'author'.*source=True"):
        sc.distribute(Wrong())(g, {"author": torch.randn(2, 3)})


# -- training curves -------------------------------------------------------------------------------
@pytest.mark.parametrize("model", sorted(MODELS))
def test_same_curve_on_1_2_3_workers(pool, mag, tmp_path, model):
    extra = ["--model", model, "--epochs", 3, "--dropout", 0.5, "--seed", 3, "--embed-dim", 5]
    curves = {n: run_train(pool, n, _args(mag[n], tmp_path / f"n{n}", *extra)) for n in (1, 2, 3)}
    assert [r["world_size"] for r in curves[3]] == [3] * 3
    assert all(len(r["comm"]["sent"]["forward"]) == 3 and min(r["comm"]["sent"]["forward"]) > 0 for r in curves[3])
    for n in (2, 3):
        _assert_close(curves[n], curves[1])
    assert curves[1][-1]["loss"] < curves[1][0]["loss"]


@pytest.fixture(scope="module")
def full_run(pool, mag, tmp_path_factory):
    """An uninterrupted 4-epoch RGCN run on 2 workers: (out dir, records, argv extras)."""
    extra = ["--model", "rgcn", "--epochs", 4, "--dropout", 0.5, "--checkpoint-every", 2, "--seed", 1]
    out = tmp_path_factory.mktemp("full")
    return out, run_train(pool, 2, _args(mag[2], out, *extra)), extra


def test_a_checkpoint_of_2_workers_resumes_on_3(pool, mag, full_run, tmp_path):
    full_out, full, extra = full_run
    first = run_train(pool, 2, _args(mag[2], tmp_path, *extra, "--stop-after", 2))
    rest = run_train(pool, 3, _args(mag[3], tmp_path, *extra, "--resume"))
    assert [r["epoch"] for r in rest] == [3, 4]
    _assert_close(first + rest, full)
    a, b = read_state(latest_checkpoint(tmp_path)), read_state(latest_checkpoint(full_out))
    assert a["model"].keys() == b["model"].keys() and a["world_size"] == 3
    for k in b["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=1e-5, atol=1e-6, msg=k)
    # the node tables' Adam moments, whole and in global order, as the weights
    for (i, sa), sb in zip(a["optimizer"]["state"].items(), b["optimizer"]["state"].values()):
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(sa[key], sb[key], rtol=1e-4, atol=1e-8, msg=f"{i} {key}")


def test_a_killed_run_resumes_to_the_uninterrupted_curve(pool, mag, tmp_path):
    """SIGKILL the trainer between checkpoints, then --resume (on another number of
    workers): the epochs up to the checkpoint from the killed run's log, the rest resumed,
    equal a run that was never stopped."""
    extra = ["--model", "hgt", "--dropout", 0.5, "--checkpoint-every", 1, "--seed", 5]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = tmp_path / "killed" / "log.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "sarcompile.train", *_args(mag[1], tmp_path / "killed", *extra),
                             "--epochs", "100000"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        # 4 lines: epoch 2's checkpoint, written in the background, was complete before epoch
        # 3's began, which was before epoch 4 trained
        while not (log.is_file() and len(log.read_text().splitlines()) >= 4):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it was killed"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    saved = read_state(latest_checkpoint(tmp_path / "killed"))["epoch"]
    assert saved >= 2
    epochs = ["--epochs", saved + 2]
    rest = run_train(pool, 2, _args(mag[2], tmp_path / "killed", *extra, *epochs, "--resume"))
    assert [r["epoch"] for r in rest] == [saved + 1, saved + 2]
    full = run_train(pool, 1, _args(mag[1], tmp_path / "full", *extra, *epochs))
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    _assert_close(logged, full)
    assert curve(logged[:saved]) == curve(full[:saved])  # the same worker count: bit for bit


def test_the_checkpoint_serves_in_the_eager_model_with_the_logged_accuracy(mag, full_run):
    out, full, _ = full_run
    model, config = load_trained(out)
    assert config["target"] == "paper" and config["model"] == "rgcn"
    g, node_data = sc.load_whole_graph(mag[1])
    got = evaluate(model, g, node_data)
    for key in ("train_acc", "val_acc", "test_acc"):
        assert got[key] == pytest.approx(full[-1][key], abs=1e-9)
    # build_model + load_state_dict: the one-machine model, its tables whole
    state = read_state(latest_checkpoint(out))
    fresh = build_model(state["config"])
    fresh.load_state_dict(state["model"])
    assert fresh.embed["author"].weight.shape[0] == g.num_nodes("author")


# -- sharded checkpoints ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def three(pool, mag, tmp_path_factory):
    """RGCN with node tables on 3 workers: an uninterrupted 4-epoch run, and one stopped
    after epoch 2's checkpoint: (full records, the stopped run's directory, argv extras)."""
    extra = ["--model", "rgcn", "--epochs", 4, "--dropout", 0.5, "--checkpoint-every", 2, "--seed", 4]
    tmp = tmp_path_factory.mktemp("three")
    full = run_train(pool, 3, _args(mag[3], tmp / "full", *extra))
    run_train(pool, 3, _args(mag[3], tmp / "cut", *extra, "--stop-after", 2))
    return full, tmp / "cut", extra


@pytest.mark.parametrize("n", [2, 1])
def test_a_3_worker_checkpoint_resumes_on_2_and_1_and_serves_one_machine(pool, mag, three, tmp_path, n):
    full, cut, extra = three
    shutil.copytree(cut, tmp_path / "run")
    rest = run_train(pool, n, _args(mag[n], tmp_path / "run", *extra, "--resume"))
    _assert_close(rest, full[2:])
    # the one-machine model of the resumed run's last checkpoint gives its logged accuracies
    model, _ = load_trained(tmp_path / "run")
    g, node_data = sc.load_whole_graph(mag[1])
    got = evaluate(model, g, node_data)
    for key in ("train_acc", "val_acc", "test_acc"):
        assert got[key] == pytest.approx(rest[-1][key], abs=1e-9)


def test_each_worker_writes_only_its_own_rows_of_every_node_table(mag, three):
    _, cut, _ = three
    ckpt = latest_checkpoint(cut)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    whole = read_state(ckpt)
    assert manifest["world_size"] == 3 and manifest["epoch"] == 2 and set(manifest["tables"]) == {
        f"embed.{t}.weight" for t in ("author", "field_of_study", "institution")}
    assert "embed.author.weight" not in torch.load(ckpt / "replicated.pt", weights_only=True)["model"]
    for rank in range(3):
        ids = sc.load_partition(mag[3], rank, 3).global_ids
        for name, entry in manifest["tables"].items():
            mine = np.load(ckpt / f"rank-{rank:04d}" / f"{name}.ids.npy")
            assert np.array_equal(mine, np.sort(ids[entry["type"]].numpy()))
            for key in ("param", "exp_avg", "exp_avg_sq"):
                rows = torch.from_numpy(np.load(ckpt / f"rank-{rank:04d}" / f"{name}.{key}.npy"))
                held = whole["model"][name] if key == "param" else whole["optimizer"]["state"][entry["optimizer"]][key]
                assert torch.equal(rows, held[torch.from_numpy(mine)])


def test_damaged_or_missing_checkpoint_files_are_refused_naming_them(pool, mag, three, tmp_path):
    _, cut, extra = three
    run = tmp_path / "run"
    shutil.copytree(cut, run)
    shard = latest_checkpoint(run) / "rank-0001" / "embed.author.weight.exp_avg.npy"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(bytes(data))
    msg = run_train(pool, 2, _args(mag[2], run, *extra, "--resume"))
    assert msg == (f"CheckpointError: checkpoint file '{shard}' is corrupt: its contents do not match the sha256 "
                   "recorded when it was written; restore it, or resume from another checkpoint"), msg
    shard.unlink()
    msg = run_train(pool, 2, _args(mag[2], run, *extra, "--resume"))
    assert f"checkpoint file '{shard}' is missing" in msg, msg
    (shard.parent.parent / "manifest.json").unlink()
    with pytest.raises(sc.CheckpointError, match="has no manifest.json: not a complete checkpoint"):
        load_trained(shard.parent.parent)
    assert "no checkpoint at" in run_train(pool, 2, _args(mag[2], run, *extra, "--resume"))


# -- checkpoints written in the background --------------------------------------------------------
def test_background_checkpoints_hold_each_epochs_state_and_resume_bit_for_bit(pool, mag, tmp_path):
    """With a checkpoint every epoch, each written while the next steps run: the curve is a
    run's without checkpoints; every checkpoint holds the state of its epoch exactly as a run
    that ended there waited for it (its copy untouched by later steps); stopped after epoch 2
    and resumed, the run continues on the uninterrupted curve bit for bit."""
    extra = ["--model", "rgcn", "--dropout", 0.5, "--seed", 4, "--embed-dim", 5]
    every = run_train(pool, 2, _args(mag[2], tmp_path / "every", *extra, "--epochs", 4, "--checkpoint-every", 1,
                                     "--keep-checkpoints", 4))
    plain = run_train(pool, 2, _args(mag[2], tmp_path / "plain", *extra, "--epochs", 4, "--checkpoint-every", 0))
    assert curve(every) == curve(plain)
    kept = sorted(p.name for p in (tmp_path / "every" / "checkpoints").iterdir())
    assert kept == [f"epoch-00000{e}" for e in (1, 2, 3, 4)]
    for e in (1, 2, 3):
        run_train(pool, 2, _args(mag[2], tmp_path / f"end{e}", *extra, "--epochs", e, "--checkpoint-every", 0))
        a, b = read_state(tmp_path / "every" / "checkpoints" / kept[e - 1]), read_state(latest_checkpoint(tmp_path / f"end{e}"))
        assert a["epoch"] == b["epoch"] == e
        for k in b["model"]:
            assert torch.equal(a["model"][k], b["model"][k]), (e, k)
        for i, sb in b["optimizer"]["state"].items():
            for key, t in sb.items():
                assert torch.equal(a["optimizer"]["state"][i][key], t), (e, i, key)
        assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])
    first = run_train(pool, 2, _args(mag[2], tmp_path / "cut", *extra, "--epochs", 4, "--checkpoint-every", 1,
                                     "--stop-after", 2))
    rest = run_train(pool, 2, _args(mag[2], tmp_path / "cut", *extra, "--epochs", 4, "--checkpoint-every", 1,
                                    "--resume"))
    assert curve(first + rest) == curve(every)


def _failing_write_job(rank: int, world_size: int, payload):
    """The trainer, with rank ``bad``'s write of the checkpoint of epoch ``epoch`` failing
    as a full disk does: the trainer's records or error message."""
    import sarcompile.data.checkpoint as files  # where the trainer's writes go
    from train_jobs import train_job

    argv, bad, epoch = payload
    real = files.write_rank_files

    def full_disk(directory, rank_, tables, links=None):
        if rank_ == bad and directory.name == f".tmp-epoch-{epoch:06d}":
            raise OSError(28, "No space left on device", str(directory / f"rank-{rank_:04d}" / "embed.author.weight.ids.npy"))
        return real(directory, rank_, tables, links)

    files.write_rank_files = full_disk
    try:
        return train_job(rank, world_size, argv)
    finally:
        files.write_rank_files = real


def test_a_failed_background_write_stops_the_next_step_on_every_rank_and_keeps_the_previous(pool, mag, tmp_path):
    extra = ["--model", "rgcn", "--dropout", 0.5, "--seed", 4, "--embed-dim", 5, "--epochs", 6, "--checkpoint-every", 1]
    out = tmp_path / "run"
    results = pool(2).run(_failing_write_job, [(_args(mag[2], out, *extra), 1, 3)] * 2, timeout=120)
    final = out / "checkpoints" / "epoch-000003"
    shard = out / "checkpoints" / ".tmp-epoch-000003" / "rank-0001" / "embed.author.weight.ids.npy"
    assert results[0] == results[1] == (
        f"CheckpointError: writing checkpoint '{final}' failed (OSError: [Errno 28] No space left on device: "
        f"'{shard}'); the previous checkpoint is intact"), results
    assert latest_checkpoint(out).name == "epoch-000002"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["epoch-000001", "epoch-000002"]
    logged = [json.loads(line)["epoch"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert logged in ([1, 2, 3], [1, 2, 3, 4])  # stopped in epoch 4: before or after its line, on every rank alike
    rest = run_train(pool, 2, _args(mag[2], out, *extra, "--resume"))
    full = run_train(pool, 2, _args(mag[2], tmp_path / "full", *extra))
    assert [r["epoch"] for r in rest] == [3, 4, 5, 6]
    assert curve(rest) == curve(full[2:])


def _own_loop_job(rank: int, world_size: int, payload):
    """A loop of one's own with sc.save_checkpoint / sc.load_checkpoint: RGCN with node
    tables and dropout, 2 steps, a checkpoint, 2 more steps (``save``); or the checkpoint
    loaded into a fresh model, then 2 steps (``load``). The losses, on every rank."""
    from sarcompile.train.evaluation import _node_tensors
    from sarcompile.train.loop import _train_step

    parts, ckpt, phase = payload
    part = sc.load_partition(parts)
    x, y, masks = _node_tensors(part.node_data, "", target="paper")
    num_train = int(sc.global_sum(masks["train_mask"].sum()))
    torch.manual_seed(0)
    net = RGCN({t: info["num_nodes"] for t, info in part.manifest.node_types.items()},
               [tuple(parse_relation_key(k)) for k in part.manifest.edge_types],
               {t: v.shape[1] for t, v in x.items()}, "paper", 4, hidden=4, layers=2, dropout=0.5, embed_dim=3)
    model = sc.distribute(net)
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    losses = []

    def steps(k: int) -> None:
        for _ in range(k):
            loss, _ = _train_step(model, opt, part.graph, x, y, masks["train_mask"], num_train, "classification",
                                  "paper")
            losses.append(float(sc.global_sum(loss)))

    if phase == "save":
        steps(2)
        sc.save_checkpoint(ckpt, model, opt, extra={"losses": list(losses)})
    else:
        losses = sc.load_checkpoint(ckpt, model, opt)["losses"]
    steps(2)
    return losses


def test_own_loop_checkpoint_round_trip_on_1_and_3_workers(pool, mag, tmp_path):
    """Saved on 3 workers, loaded on 3 (bit for bit) and on 1; saved on 1, loaded on 3."""
    on3 = pool(3).run(_own_loop_job, [(mag[3], str(tmp_path / "c3"), "save")] * 3)[0]
    assert pool(3).run(_own_loop_job, [(mag[3], str(tmp_path / "c3"), "load")] * 3)[0] == on3
    again = pool(1).run(_own_loop_job, [(mag[1], str(tmp_path / "c3"), "load")])[0]
    assert again == pytest.approx(on3, rel=1e-5)
    on1 = pool(1).run(_own_loop_job, [(mag[1], str(tmp_path / "c1"), "save")])[0]
    assert pool(3).run(_own_loop_job, [(mag[3], str(tmp_path / "c1"), "load")] * 3)[0] == pytest.approx(on1, rel=1e-5)


def test_partition_writes_a_synthetic_mag_like_graph(tmp_path, capsys):
    assert cli(["partition", "--synthetic", "mag", "--scale", "0.001", "--parts", "2", "--out", str(tmp_path),
                "--seed", "4"]) == 0
    printed = capsys.readouterr().out
    assert "dataset mag-like (generated, seed 4): 100 paper, 100 author, 2 institution, 10 field_of_study nodes" \
        in printed
    manifest = read_manifest(tmp_path)
    want = mag_like(100, 100, 2, 10, seed=4)
    assert manifest.typed and manifest.num_nodes == want.graph.num_nodes()
    whole, data = sc.load_whole_graph(tmp_path)
    for rel, rg in want.graph.items():
        assert torch.equal(whole[rel].src, rg.src) and torch.equal(whole[rel].dst, rg.dst)
    assert torch.equal(data["paper"]["x"], want.node_data["paper"]["x"])


def test_the_ogb_files_round_trip(mag):
    """What the tests' writer writes, load_ogb_mag reads back (the reverse relations added)."""
    ds, back = mag["dataset"], sc.load_ogb_mag(mag["root"])
    for rel, rg in ds.graph.items():
        assert torch.equal(back.graph[rel].src, rg.src) and torch.equal(back.graph[rel].dst, rg.dst)
        assert torch.equal(back.graph[rel[2], f"rev_{rel[1]}", rel[0]].src, rg.dst) if rel[0] != rel[2] else True
    for key, value in ds.node_data["paper"].items():
        assert torch.equal(back.node_data["paper"][key], value), key


# -- refusals ----------------------------------------------------------------------------------------
def _typed_parts(tmp_path: Path, node_data: dict) -> str:
    g = sc.HeteroGraph.from_edges({("author", "writes", "paper"): (torch.tensor([0, 1, 1]), torch.tensor([0, 1, 2]))},
                                  {"author": 2, "paper": 3})
    sc.partition(g, 1, tmp_path / "parts", node_data=node_data)
    return str(tmp_path / "parts")


def _labels(n: int) -> dict:
    return {"y": torch.zeros(n, dtype=torch.long), **{m: torch.ones(n, dtype=torch.bool)
                                                     for m in ("train_mask", "val_mask", "test_mask")}}


@pytest.mark.parametrize("node_data, extra, message", [
    ({"paper": {"x": torch.randn(3, 2)}}, ["--model", "rgcn"],
     r"has no target type: none of its node types \['author', 'paper'\] has labels 'y'"),
    ({"paper": {"x": torch.randn(3, 2), **_labels(3)}}, ["--model", "sage"],
     r"heterogeneous graph \(node types \['author', 'paper'\]\); --model sage trains one-type graphs: use "
     r"--model rgcn or --model hgt"),
    ({"paper": _labels(3), "author": _labels(2)}, ["--model", "rgcn"],
     r"node types \['author', 'paper'\] all have labels 'y'; say which to predict with --target"),
    ({"paper": _labels(3)}, ["--model", "rgcn"], r"target type 'paper' has no features 'x' .* give --embed-dim"),
    ({"paper": {"x": torch.randn(3, 2), "y": torch.zeros(3, dtype=torch.long)}}, ["--model", "hgt"],
     r"no node data 'train_mask', 'val_mask', 'test_mask' of the target type 'paper'"),
    ({"paper": {"x": torch.randn(3, 2), **_labels(3)}}, ["--model", "rgcn", "--target", "venue"],
     r"--target venue: .* has no such node type"),
    ({"paper": {"x": torch.randn(3, 2), **_labels(3)}}, ["--model", "rgcn", "--batch-norm"],
     r"ValueError: --batch-norm and --residual are options of sage, gcn, gin, gat; --model rgcn has neither"),
])
def test_typed_partitions_without_what_the_trainer_needs_are_refused(pool, tmp_path, node_data, extra, message):
    got = run_train(pool, 1, _args(_typed_parts(tmp_path, node_data), tmp_path / "run", "--epochs", 1, *extra))
    assert isinstance(got, str)
    assert re.search(message, got), got


def test_a_typed_model_on_a_one_type_partition_is_refused(pool, tmp_path):
    g = sc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    sc.partition(g, 1, tmp_path / "parts", node_data={"x": torch.randn(3, 2), **_labels(3)})
    got = run_train(pool, 1, _args(str(tmp_path / "parts"), tmp_path / "run", "--model", "hgt"))
    assert got == (f"PartitionError: --model hgt trains heterogeneous graphs, but partition '{tmp_path / 'parts'}' "
                   "has one node type: use --model sage, gcn, gin, gat")
    got = run_train(pool, 1, _args(str(tmp_path / "parts"), tmp_path / "run", "--target", "paper"))
    assert got.startswith("ValueError: --target and --embed-dim are options of the typed models (rgcn, hgt)")


def test_resume_refuses_another_embedding_width(pool, mag, full_run, tmp_path):
    _, _, extra = full_run
    run_train(pool, 1, _args(mag[1], tmp_path, *extra, "--stop-after", 1))
    got = run_train(pool, 1, _args(mag[1], tmp_path, *extra, "--resume", "--embed-dim", 3))
    assert "embed_dim: checkpoint 6, this run 3" in got and "(--embed-dim 6)" in got


def test_the_trainer_cli_trains_a_typed_partition_and_reports_it(mag, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "sarcompile.train", *_args(mag[1], tmp_path / "run", "--model",
                                                                              "rgcn", "--epochs", 2)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("1 worker, ") and "training nodes of 'paper', rgcn x 2 layers" in lines[0]
    assert [line.split()[1] for line in lines if line.startswith("epoch ")] == ["1", "2"]
    assert any(line.startswith("worker 0: peak ") and "plan's estimate" in line for line in lines)
