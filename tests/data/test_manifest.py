"""manifest.json and the graph's digest (sarcompile.data.manifest): reading a partition
directory's manifest fails with an error naming the problem and the fix; graph_sha256 is
stable, the same however the graph is chunked, and changes with anything training reads."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

import sarcompile as sc
from sarcompile.data.manifest import (
    FORMAT_VERSION, MANIFEST, Manifest, PartInfo, chunked_graph_sha256, graph_sha256, read_manifest, summary,
)


def _manifest(**changes) -> Manifest:
    fields = dict(
        num_parts=2, num_nodes=5, num_edges=8, method="random", seed=0, name="g",
        parts=[PartInfo("part-0.pt", 3, 5, "ab" * 32, 3 * 2**20), PartInfo("part-1.pt", 2, 3, "cd" * 32, 2**19)],
        halo_sizes=[[0, 2], [1, 0]], edge_cut=3, node_data={"x": {"dtype": "float32", "shape": [4]}},
        created="2026-01-01T00:00:00+00:00",
    )
    return Manifest(**(fields | changes))


# -- read_manifest ---------------------------------------------------------------------------
def test_a_written_manifest_reads_back_equal(tmp_path):
    m = _manifest(graph_sha256="0" * 64)
    (tmp_path / MANIFEST).write_text(m.to_json())
    assert read_manifest(tmp_path) == m


@pytest.mark.parametrize("where, words", [
    ("missing", "does not exist: run `sarcompile partition`"),
    ("file", "is a file, not a partition directory"),
    ("empty", "has no manifest.json (never partitioned, or a partition run did not finish)"),
])
def test_reading_no_partition_directory_says_what_to_run(tmp_path, where, words):
    path = tmp_path / "out"
    if where == "file":
        path.write_text("x")
    elif where == "empty":
        path.mkdir()
    with pytest.raises(sc.PartitionError) as e:
        read_manifest(path)
    assert words in str(e.value) and str(path) in str(e.value)


def _written(tmp_path, text: str):
    (tmp_path / MANIFEST).write_text(text)
    return tmp_path


@pytest.mark.parametrize("text, words", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "is not a JSON object"),
    (json.dumps({"format_version": FORMAT_VERSION + 1}), f"format_version {FORMAT_VERSION + 1}, this sarcompile reads"),
    (json.dumps({"num_parts": 2}), "format_version None"),  # a manifest of no known format
])
def test_an_unreadable_manifest_says_re_run_partition(tmp_path, text, words):
    with pytest.raises(sc.PartitionError) as e:
        read_manifest(_written(tmp_path, text))
    assert words in str(e.value) and "re-run partition" in str(e.value)


@pytest.mark.parametrize("change", ["drop", "extra", "part"])
def test_missing_or_unexpected_fields_are_a_partition_error_not_a_type_error(tmp_path, change):
    d = json.loads(_manifest().to_json())
    if change == "drop":
        del d["halo_sizes"]
    elif change == "extra":
        d["surprise"] = 1
    else:
        del d["parts"][1]["sha256"]
    with pytest.raises(sc.PartitionError, match="missing or has unexpected fields.*re-run partition"):
        read_manifest(_written(tmp_path, json.dumps(d)))


# -- graph_sha256 ------------------------------------------------------------------------------
SRC, DST = torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1])


def _g(src=SRC, dst=DST, n=3) -> sc.Graph:
    return sc.Graph.from_edges(src, dst, n)


def test_the_digest_of_a_graph_is_its_documented_bytes():
    """Pinned, since checkpoints keep it to recognise their graph: the header, [nodes, edges]
    as JSON, then src and dst as int64, written here from the format, not from the code."""
    h = hashlib.sha256(b"sarcompile-graph 1\n" + b"[3, 4]")
    h.update(SRC.to(torch.int64).numpy().tobytes())
    h.update(DST.to(torch.int64).numpy().tobytes())
    assert graph_sha256(_g()) == h.hexdigest()


def test_the_digest_is_stable_and_does_not_depend_on_how_tensors_are_held_or_chunked():
    x = torch.randn(3, 4)
    first = graph_sha256(_g(), {"x": x, "y": torch.arange(3)})
    assert graph_sha256(_g(SRC.clone(), DST.clone()), {"y": torch.arange(3), "x": x.clone()}) == first  # dict order
    assert graph_sha256(_g(SRC.to(torch.int32), DST.to(torch.int32)), {"x": x, "y": torch.arange(3)}) == first
    assert graph_sha256(_g(), {"x": x.t().contiguous().t(), "y": torch.arange(3)}) == first  # a strided view
    assert graph_sha256(_g(), None) == graph_sha256(_g(), {})
    chunked = chunked_graph_sha256(
        3, 4, SRC.split(3), DST.split(1), {"x": (x.dtype, tuple(x.shape), x.split(2)),
                                          "y": (torch.int64, (3,), [torch.arange(3)])})
    assert chunked == first


@pytest.mark.parametrize("change", [
    "edge endpoint", "edge order", "isolated node", "feature value", "feature dtype", "feature name",
    "feature shape", "adjacency values",
])
def test_the_digest_changes_with_anything_training_reads(change):
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    base = graph_sha256(_g(), {"x": x})
    g, data = _g(), {"x": x}
    if change == "edge endpoint":
        g = _g(dst=torch.tensor([1, 2, 0, 0]))
    elif change == "edge order":
        g = _g(SRC.flip(0), DST.flip(0))  # the same edge set, another order: another edge numbering
    elif change == "isolated node":
        g = _g(n=4)  # one more node, no edge to it
    elif change == "feature value":
        data = {"x": x.index_put((torch.tensor([2]), torch.tensor([3])), torch.tensor(0.5))}
    elif change == "feature dtype":
        data = {"x": x.view(torch.int32)}  # the same bytes
    elif change == "feature name":
        data = {"h": x}
    elif change == "feature shape":
        data = {"x": x.reshape(3, 2, 2)}  # the same bytes
    else:
        g.adj_values = torch.ones(4)  # values of 1 still make another graph than no values
    assert graph_sha256(g, data) != base


# -- summary -------------------------------------------------------------------------------------
def test_the_summary_counts_halos_both_ways_and_the_cut():
    text = summary(_manifest())
    lines = text.splitlines()
    assert lines[0] == "partition 'g': 5 nodes, 8 edges, 2 parts (random, seed 0)"
    # part 0 receives 2 rows (row 0 of halo_sizes) and sends 1 (column 0); part 1 the other way
    assert lines[2].split() == ["0", "3", "5", "2", "1", "3.00"]
    assert lines[3].split() == ["1", "2", "3", "1", "2", "0.50"]
    assert "edge cut: 3 of 8 edges (37.5%)" in lines
    assert "halo sizes (row r: nodes of part q that r receives):" in lines
    assert "halo sizes" not in summary(_manifest(), max_matrix=1)
