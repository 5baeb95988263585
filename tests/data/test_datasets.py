"""OGB datasets from local files: tiny datasets written in OGB's real on-disk formats are
read back through ogb and compared with the values written, recomputed here by brute force."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sarcompile.data.datasets import load_ogb, symmetrize_edges
from sarcompile.errors import DatasetError
from ogb_files import NUM_NODES, Written, write_csv_gz, write_ogbn_arxiv, write_ogbn_papers100m, write_ogbn_products


@pytest.fixture
def arxiv(tmp_path: Path) -> Written:
    return write_ogbn_arxiv(tmp_path / "ogb")


def edge_set(src: torch.Tensor, dst: torch.Tensor) -> set[tuple[int, int]]:
    return set(zip(src.tolist(), dst.tolist()))


def check_dataset(ds, written: Written, num_classes: int) -> None:
    """Graph = the written edges in both directions, each pair once; node data as written."""
    assert ds.graph.num_nodes == NUM_NODES and ds.num_classes == num_classes and ds.symmetrized
    expected = written.symmetric_edge_set()
    assert edge_set(ds.graph.src, ds.graph.dst) == expected and ds.graph.num_edges == len(expected)
    nd = ds.node_data
    assert sorted(nd) == ["test_mask", "train_mask", "val_mask", "x", "y"]
    assert nd["x"].dtype == torch.float32 and torch.equal(nd["x"], torch.tensor(written.x, dtype=torch.float32))
    assert nd["y"].dtype == torch.int64 and nd["y"].tolist() == written.y.tolist()
    for key, part in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
        assert nd[key].dtype == torch.bool and sorted(torch.nonzero(nd[key]).flatten().tolist()) == sorted(
            written.split[part].tolist()
        )


def test_arxiv_is_symmetrized_and_matches_the_files(arxiv):
    ds = load_ogb("ogbn-arxiv", arxiv.root)
    check_dataset(ds, arxiv, num_classes=40)


def test_second_load_reads_ogbs_cache(arxiv):
    first = load_ogb("ogbn-arxiv", arxiv.root)
    assert (arxiv.root / "ogbn_arxiv" / "processed" / "data_processed").is_file()
    # Without the raw edges only the cache (a torch.save of numpy arrays) can answer.
    (arxiv.root / "ogbn_arxiv" / "raw" / "edge.csv.gz").unlink()
    second = load_ogb("ogbn-arxiv", arxiv.root)
    check_dataset(second, arxiv, num_classes=40)
    assert torch.equal(first.graph.src, second.graph.src) and torch.equal(first.graph.dst, second.graph.dst)


def test_no_symmetrize_keeps_the_stored_edges_in_order(arxiv):
    ds = load_ogb("ogbn-arxiv", arxiv.root, symmetrize=False)
    assert not ds.symmetrized
    assert ds.graph.src.tolist() == arxiv.edges[:, 0].tolist()
    assert ds.graph.dst.tolist() == arxiv.edges[:, 1].tolist()


def test_products_keeps_the_reverse_edges_ogb_adds(tmp_path):
    written = write_ogbn_products(tmp_path)
    ds = load_ogb("ogbn-products", tmp_path)
    assert not ds.symmetrized and ds.num_classes == 47
    # ogb gives every stored edge followed by its reverse; nothing is de-duplicated.
    expected = [pair for u, v in written.edges.tolist() for pair in ((u, v), (v, u))]
    assert list(zip(ds.graph.src.tolist(), ds.graph.dst.tolist())) == expected
    assert edge_set(*symmetrize_edges(ds.graph.src, ds.graph.dst, NUM_NODES)) == written.symmetric_edge_set()


def test_papers100m_binary_format_nan_labels_and_split_dict(tmp_path):
    written = write_ogbn_papers100m(tmp_path)
    ds = load_ogb("ogbn-papers100M", tmp_path)
    check_dataset(ds, written, num_classes=172)
    assert (ds.node_data["y"] == -1).sum() == NUM_NODES // 3


def test_symmetrize_edges_matches_brute_force():
    rng = np.random.default_rng(3)
    src, dst = (torch.from_numpy(a) for a in rng.integers(0, 9, size=(2, 40)))
    s, d = symmetrize_edges(src, dst, 9)
    pairs = list(zip(s.tolist(), d.tolist()))
    assert pairs == sorted(edge_set(src, dst) | edge_set(dst, src))


@pytest.mark.parametrize("name", ["ogbn-mag", "ogbn-proteins", "cora"])
def test_unsupported_names_list_the_supported_ones(tmp_path, name):
    with pytest.raises(DatasetError, match="ogbn-arxiv, ogbn-products, ogbn-papers100M"):
        load_ogb(name, tmp_path)


def test_missing_dataset_folder_says_where_to_put_the_zip(tmp_path):
    with pytest.raises(DatasetError) as e:
        load_ogb("ogbn-products", tmp_path)
    message = str(e.value)
    assert f"'{tmp_path / 'ogbn_products'}' does not exist" in message
    assert "http://snap.stanford.edu/ogb/data/nodeproppred/products.zip" in message
    assert "folder 'products'" in message


@pytest.mark.parametrize("missing", ["raw/edge.csv.gz", "raw/node_year.csv.gz", "split/time/valid.csv.gz"])
def test_missing_file_is_named(arxiv, missing, monkeypatch):
    (arxiv.root / "ogbn_arxiv" / missing).unlink()
    monkeypatch.setattr("builtins.input", _no_prompt)
    with pytest.raises(DatasetError) as e:
        load_ogb("ogbn-arxiv", arxiv.root)
    assert repr(str(arxiv.root / "ogbn_arxiv" / missing)) in str(e.value)
    assert "arxiv.zip" in str(e.value)


def test_missing_release_file_is_named_instead_of_prompting(arxiv, monkeypatch):
    (arxiv.root / "ogbn_arxiv" / "RELEASE_v1.txt").unlink()
    monkeypatch.setattr("builtins.input", _no_prompt)
    with pytest.raises(DatasetError, match="RELEASE_v1.txt' is missing"):
        load_ogb("ogbn-arxiv", arxiv.root)


def test_corrupt_cache_says_to_delete_it(arxiv):
    cache = arxiv.root / "ogbn_arxiv" / "processed" / "data_processed"
    cache.parent.mkdir()
    cache.write_bytes(b"half a pickle")
    with pytest.raises(DatasetError, match="delete it to rebuild"):
        load_ogb("ogbn-arxiv", arxiv.root)


def test_malformed_raw_file_is_a_dataset_error(arxiv):
    write_csv_gz(arxiv.root / "ogbn_arxiv" / "raw" / "node-label.csv.gz", np.zeros(NUM_NODES - 1, dtype=np.int64))
    with pytest.raises(DatasetError, match="one label per node"):
        load_ogb("ogbn-arxiv", arxiv.root)


def _no_prompt(*args: object) -> str:
    raise AssertionError("ogb must not prompt")


def test_fractional_labels_are_refused_not_truncated():
    from sarcompile.data.datasets import _labels

    with pytest.raises(DatasetError, match=r"node 2 has label 1.5, not a class id \(2 such labels\)"):
        _labels(np.array([0.0, np.nan, 1.5, np.inf], dtype=np.float32), 4, "ogbn-x")
    assert _labels(np.array([[0.0], [np.nan], [3.0]]), 3, "ogbn-x").tolist() == [0, -1, 3]  # NaN: unlabelled
