"""Bad node data is refused where it enters, naming the tensor, the node and the column:
at partition time (sc.partition, `sarcompile partition`) and at load time (load_partition,
for partitions written before the checks or edited since)."""

from __future__ import annotations

import pytest
import torch

import sarcompile as sc
from sarcompile.cli.main import main
from sarcompile.errors import GraphError, PartitionError
from sarcompile.data.loading import load_partition
from sarcompile.data.manifest import read_manifest
from sarcompile.data.rundir import _sha256
from sarcompile.graph.shard import PartData

N = 30


def graph_and_data() -> tuple[sc.Graph, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(N, (90,), generator=gen), torch.randint(N, (90,), generator=gen)
    data = {
        "x": torch.randn(N, 4, generator=gen),
        "y": torch.arange(N) % 3,
        "train_mask": torch.arange(N) % 2 == 0,
        "val_mask": torch.arange(N) % 4 == 1,
        "test_mask": torch.arange(N) % 4 == 3,
    }
    return sc.Graph.from_edges(src, dst, N), data


def with_nan() -> dict[str, torch.Tensor]:
    _, data = graph_and_data()
    x = data["x"].clone()
    x[17, 2] = float("nan")
    x[21, 0] = float("inf")
    return {**data, "x": x}


BAD = {
    "nan features": (with_nan, r"node_data\['x'\] holds a non-finite value: nan at node 17, column 2 "
                     r"\(2 non-finite values in all\).*allow_nonfinite=True \(--allow-nonfinite\)"),
    "nan labels": (lambda: {**graph_and_data()[1], "y": torch.full((N,), float("nan"))},
                   r"node_data\['y'\] holds a non-finite value: nan at node 0"),
    "boolean labels": (lambda: {**graph_and_data()[1], "y": torch.arange(N) % 2 == 0},
                       r"node_data\['y'\] has dtype bool: labels must be integer class ids"),
    "float mask": (lambda: {**graph_and_data()[1], "train_mask": torch.rand(N)},
                   r"node_data\['train_mask'\] has dtype float32: a mask must be boolean \(e.g. torch.rand\(n\) < 0.6"),
    "index mask": (lambda: {**graph_and_data()[1], "val_mask": torch.arange(N) % 5},
                   r"node_data\['val_mask'\] has dtype int64 with values other than 0 and 1 \(node 2 has 2\)"),
    "1-D features": (lambda: {**graph_and_data()[1], "x": torch.randn(N)},
                     r"node_data\['x'\] has shape \(30,\): features need two dimensions.*x.unsqueeze\(1\)"),
    "integer features": (lambda: {**graph_and_data()[1], "x": torch.ones(N, 4, dtype=torch.long)},
                         r"node_data\['x'\] has dtype int64: features must be floating point \(e.g. x.float\(\)\)"),
    "2-D mask": (lambda: {**graph_and_data()[1], "test_mask": torch.ones(N, 1, dtype=torch.bool)},
                 r"node_data\['test_mask'\] has shape \(30, 1\): a mask needs one boolean per node"),
    "other nan tensor": (lambda: {**graph_and_data()[1], "w": torch.tensor([float("-inf")] * N).reshape(N, 1, 1)},
                         r"node_data\['w'\] holds a non-finite value: -inf at node 0, column \(0, 0\)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_partition_refuses_bad_node_data_before_writing(tmp_path, case):
    make, match = BAD[case]
    g, _ = graph_and_data()
    with pytest.raises(GraphError, match=match):
        sc.partition(g, 2, tmp_path, node_data=make())
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing written, not even the lock


def test_accepted_node_data(tmp_path):
    g, data = graph_and_data()
    ok = {**data, "train_mask": data["train_mask"].to(torch.uint8), "y": data["y"].int(), "ids": torch.arange(N)}
    sc.partition(g, 2, tmp_path / "a", node_data=ok)  # DGL-style 0/1 uint8 masks, int32 labels, other keys
    sc.partition(g, 2, tmp_path / "b", node_data=with_nan(), allow_nonfinite=True)
    parts = [load_partition(tmp_path / "b", r, 2, allow_nonfinite=True) for r in range(2)]
    assert sum(int(p.node_data["x"].isnan().sum()) for p in parts) == 1
    assert sum(int(p.node_data["x"].isinf().sum()) for p in parts) == 1


def _rewrite_part(out, rank: int, **node_data: torch.Tensor) -> None:
    """Replace node tensors inside a written part and fix up the manifest's checksum, as an
    older sarcompile (or a hand edit) could have left it."""
    path = out / f"part-{rank}.pt"
    part = PartData(**torch.load(path, weights_only=True))
    for key, value in node_data.items():
        part.node_data[key] = value(part)
    torch.save(part.to_dict(), path)
    m = read_manifest(out)
    m.parts[rank].sha256 = _sha256(path)
    (out / "manifest.json").write_text(m.to_json())


def test_load_refuses_bad_node_data_naming_the_original_node(tmp_path):
    g, data = graph_and_data()
    sc.partition(g, 2, tmp_path, node_data=data, method="contiguous")  # part 1: nodes 15..29

    def nan_at_node_22(part):
        x = part.node_data["x"].clone()
        x[(part.global_ids == 22).nonzero()[0, 0], 3] = float("nan")
        return x

    _rewrite_part(tmp_path, 1, x=nan_at_node_22)
    load_partition(tmp_path, 0, 2)  # part 0 is clean
    with pytest.raises(PartitionError, match=r"part file '.*part-1.pt': node_data\['x'\] holds a non-finite value: "
                       r"nan at node 22, column 3.*re-run partition"):
        load_partition(tmp_path, 1, 2)
    assert load_partition(tmp_path, 1, 2, allow_nonfinite=True).node_data["x"].isnan().sum() == 1

    _rewrite_part(tmp_path, 1, x=lambda p: torch.ones(len(p.global_ids), 4),
                  train_mask=lambda p: (p.global_ids == 22).long() * 2)
    with pytest.raises(PartitionError, match=r"node_data\['train_mask'\] has dtype int64 with values other than 0 "
                       r"and 1 \(node 22 has 2\)"):
        load_partition(tmp_path, 1, 2)


def test_cli_refuses_nan_features_in_one_line_and_allows_them_on_request(tmp_path, capsys):
    g, _ = graph_and_data()
    edges = tmp_path / "g.pt"
    torch.save({"src": g.src, "dst": g.dst, "num_nodes": N, **with_nan()}, edges)
    argv = ["partition", "--edges", str(edges), "--parts", "2", "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sarcompile partition: error: node_data['x'] holds a non-finite value: nan at node 17")
    assert err.count("\n") == 1 and "--allow-nonfinite" in err
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert main([*argv, "--allow-nonfinite"]) == 0
    with pytest.raises(PartitionError, match="nan at node 17"):
        [load_partition(tmp_path / "out", r, 2) for r in range(2)]
