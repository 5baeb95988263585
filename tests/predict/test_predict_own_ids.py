"""Predictions mapped back to the user's own node ids: an edge CSV of sparse 64-bit integers
or of strings, partitioned with ``--own-ids`` into 1 and 3 parts, trained, predicted on 1
and 3 workers; ``sc.read_predictions(DIR, ids=True)`` gives every user id the eager model's
output for that node. The oracle builds the graph from the CSV itself, numbering the nodes
its own way (by first appearance), so it shares nothing with the partitioner's numbering.
A damaged or missing id file is refused, at predict time and at read time."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from test_predict import run_predict
from train_jobs import run_train

import sarcompile as sc
from sarcompile.errors import PredictionError
from sarcompile.train import load_trained

# Own ids are always read out of core; the limit is not what these tests are about, and the
# test process may already hold well over 1 GiB from earlier tests (pytest-xdist workers).
OOC_LIMIT = "8GiB"
N = 90


def _user_ids(kind: str, gen: np.random.Generator) -> list:
    if kind == "sparse":  # negatives, both ends of int64, gaps of any size
        return [int(v) for v in gen.choice(2**62, N - 2, replace=False) * gen.choice([-2, 2], N - 2)] + \
            [2**63 - 1, -(2**63)]
    return [f"n{v}, «{chr(0x3b1 + v % 20)}»" for v in gen.choice(10**6, N, replace=False)]  # commas, quotes, Greek


@pytest.fixture(scope="module", params=["sparse", "string"])
def own(request, tmp_path_factory, pool) -> dict:
    """The CSV (self-loops, repeated edges, a skewed hub), its node data in the ids' sorted
    order, partitions into 1 and 3 parts, and a run trained on the 1-part one."""
    kind, tmp = request.param, tmp_path_factory.mktemp(f"own-{request.param}")
    gen = np.random.default_rng(5)
    uid = _user_ids(kind, gen)
    src = np.concatenate([gen.integers(0, N, 400), np.zeros(40, dtype=np.int64), np.arange(4)])
    dst = np.concatenate([gen.integers(0, N, 400), gen.integers(0, N, 40), np.arange(4)])
    with open(tmp / "edges.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("src", "dst"), *((uid[s], uid[d]) for s, d in zip(src, dst))])
    x = gen.standard_normal((N, 5)).astype(np.float32)
    y = gen.integers(0, 3, N)
    split = gen.random(N)
    data = {"x": x, "y": y, "train_mask": split < 0.6, "val_mask": (split >= 0.6) & (split < 0.8),
            "test_mask": split >= 0.8}
    order = sorted(range(N), key=lambda k: uid[k])  # the documented numbering: the ids' sorted order
    for key, values in data.items():
        np.save(tmp / f"{key}.npy", values[order])
    out = {"kind": kind, "csv": tmp / "edges.csv", "x": x}
    for parts in (1, 3):
        out[parts] = str(tmp / f"parts{parts}")
        sc.partition_files(tmp / "edges.csv", parts, out[parts], {k: tmp / f"{k}.npy" for k in data}, own_ids=True,
                           memory_limit=OOC_LIMIT)
    out["run"] = tmp / "run"
    records = run_train(pool, 1, ["--parts", out[1], "--out", str(out["run"]), "--epochs", "2", "--hidden", "8",
                                  "--layers", "2", "--no-progress"])
    assert isinstance(records, list), records
    return out


def _eager_by_user_id(own: dict) -> dict:
    """The eager model's output of every node, keyed by its user id, on the graph read from
    the CSV here (nodes numbered by first appearance in the file)."""
    index, src, dst = {}, [], []
    with open(own["csv"], newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))[1:]
    cast = int if own["kind"] == "sparse" else str
    for s, d in rows:
        src.append(index.setdefault(cast(s), len(index)))
        dst.append(index.setdefault(cast(d), len(index)))
    _, uid_order = zip(*sorted((k, u) for u, k in index.items()))
    # the fixture's x is by its own node order; map it through the user ids
    x_of = dict(zip(_user_ids(own["kind"], np.random.default_rng(5)), own["x"]))
    x = torch.from_numpy(np.stack([x_of[u] for u in uid_order]))
    g = sc.Graph.from_edges(torch.tensor(src), torch.tensor(dst), len(index))
    model, _ = load_trained(own["run"])
    with torch.no_grad():
        out = model(g, x)
    return {u: out[k] for u, k in index.items()}


@pytest.mark.parametrize("n", [1, 3])
def test_every_user_id_maps_to_the_eager_models_output_for_that_node(pool, own, tmp_path, n):
    pred = tmp_path / "pred"
    manifest = run_predict(pool, n, ["--run-dir", str(own["run"]), "--parts", own[n], "--out", str(pred)])
    assert not isinstance(manifest, str), manifest
    record = manifest["outputs"][0]["user_ids"]
    assert record["kind"] == ("integer" if own["kind"] == "sparse" else "string") and record["num_nodes"] == N
    ids, rows = sc.read_predictions(pred, ids=True)
    assert torch.equal(rows, sc.read_predictions(pred))  # the plain call: the same rows, global order
    want = _eager_by_user_id(own)
    assert sorted(ids.tolist()) == sorted(want) and len(set(ids.tolist())) == N
    got = torch.stack([rows[i] for i in range(N)])
    expected = torch.stack([want[u] for u in ids.tolist()])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_a_damaged_or_missing_id_file_is_refused(pool, own, tmp_path):
    if own["kind"] != "sparse":
        pytest.skip("the same checks whatever the ids' kind")
    pred = tmp_path / "pred"
    run_predict(pool, 1, ["--run-dir", str(own["run"]), "--parts", own[1], "--out", str(pred)])
    copy = pred / "node_ids.npy"
    copy.write_bytes(copy.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(PredictionError, match="does not match its checksum.*run sarcompile.predict again"):
        sc.read_predictions(pred, ids=True)
    sc.read_predictions(pred)  # the rows alone do not need the ids
    copy.unlink()
    with pytest.raises(PredictionError, match="node_ids.npy' is missing"):
        sc.read_predictions(pred, ids=True)
    # the partition's own file damaged: predict refuses, naming it, on every rank
    parts = tmp_path / "parts"
    sc.partition_files(own["csv"], 1, parts, {k: Path(own[1]).parent / f"{k}.npy" for k in
                                               ("x", "y", "train_mask", "val_mask", "test_mask")}, own_ids=True)
    (parts / "node_ids.npy").write_bytes((parts / "node_ids.npy").read_bytes()[:-1] + b"\1")
    got = run_predict(pool, 1, ["--run-dir", str(own["run"]), "--parts", str(parts), "--out", str(tmp_path / "p2")])
    assert isinstance(got, str) and "node_ids.npy' does not match its checksum" in got, got


def test_predictions_of_a_partition_without_own_ids_say_row_i_is_node_i(pool, own, tmp_path):
    if own["kind"] != "sparse":
        pytest.skip("one check")
    g, data = sc.load_whole_graph(own[1])
    sc.partition(g, 1, tmp_path / "plain", node_data=data)  # the same graph, no ids kept
    pred = tmp_path / "pred"
    run_predict(pool, 1, ["--run-dir", str(own["run"]), "--parts", str(tmp_path / "plain"), "--out", str(pred)])
    with pytest.raises(PredictionError, match="keeps no node ids of yours .* row i is node i"):
        sc.read_predictions(pred, ids=True)
