"""sarcompile.data.outofcore.ogb: OGB datasets read from their raw files in chunks give the very
partition directory that load_ogb + sc.partition give (tiny datasets in OGB's formats)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ogb_files import write_ogbn_arxiv, write_ogbn_papers100m, write_ogbn_products
from test_ooc_partition import assert_same_directory

import sarcompile as sc
from sarcompile.cli.main import main
from sarcompile.errors import DatasetError
from sarcompile.data.outofcore.ogb import partition_ogb

WRITERS = {"ogbn-arxiv": write_ogbn_arxiv, "ogbn-products": write_ogbn_products,
           "ogbn-papers100M": write_ogbn_papers100m}


@pytest.mark.parametrize("symmetrize", [None, True, False], ids=["as-ogb", "symmetrize", "stored"])
@pytest.mark.parametrize("name", list(WRITERS))
def test_same_directory_as_load_ogb(tmp_path, name, symmetrize):
    WRITERS[name](tmp_path / "ogb")
    ds = sc.load_ogb(name, tmp_path / "ogb", symmetrize=symmetrize)
    sc.partition(ds.graph, 3, tmp_path / "mem", node_data=ds.node_data, name=name)
    _, streamed = partition_ogb(name, tmp_path / "ogb", 3, tmp_path / "ooc", symmetrize=symmetrize,
                                       memory_limit="4GiB")
    assert (streamed.num_classes, streamed.symmetrized) == (ds.num_classes, ds.symmetrized)
    assert_same_directory(tmp_path / "ooc", tmp_path / "mem")


def test_a_compressed_npz_is_read_as_a_stream(tmp_path):
    written = write_ogbn_papers100m(tmp_path / "ogb")
    raw = tmp_path / "ogb" / "ogbn_papers100M" / "raw"
    with np.load(raw / "data.npz") as z:
        arrays = dict(z)
    np.savez_compressed(raw / "data.npz", **arrays)
    partition_ogb("ogbn-papers100M", tmp_path / "ogb", 2, tmp_path / "ooc", memory_limit="4GiB")
    _, node_data = sc.load_whole_graph(tmp_path / "ooc")
    assert torch.equal(node_data["x"], torch.tensor(written.x, dtype=torch.float32))
    assert node_data["y"].tolist() == written.y.tolist()


def test_missing_and_damaged_files_are_named(tmp_path):
    WRITERS["ogbn-arxiv"](tmp_path / "ogb")
    raw = tmp_path / "ogb" / "ogbn_arxiv" / "raw"
    (raw / "node-feat.csv.gz").rename(tmp_path / "feat.csv.gz")
    with pytest.raises(DatasetError, match="node-feat.csv.gz"):
        partition_ogb("ogbn-arxiv", tmp_path / "ogb", 2, tmp_path / "ooc")
    (raw / "node-feat.csv.gz").write_bytes(b"not gzip")
    with pytest.raises(DatasetError, match="cannot read .*node-feat.csv.gz"):
        partition_ogb("ogbn-arxiv", tmp_path / "ogb", 2, tmp_path / "ooc")
    assert not (tmp_path / "ooc" / "manifest.json").exists()


def test_cli_dataset_with_memory_limit(tmp_path, capsys):
    WRITERS["ogbn-arxiv"](tmp_path / "ogb")
    argv = ["partition", "--dataset", "ogbn-arxiv", "--root", str(tmp_path / "ogb"), "--parts", "2",
            "--memory-limit", "4GiB", "--out", str(tmp_path / "parts")]
    assert main(argv) == 0
    assert "dataset ogbn-arxiv: symmetrized" in capsys.readouterr().out
    ds = sc.load_ogb("ogbn-arxiv", tmp_path / "ogb")
    sc.partition(ds.graph, 2, tmp_path / "mem", node_data=ds.node_data, name="ogbn-arxiv")
    assert_same_directory(tmp_path / "parts", tmp_path / "mem")
