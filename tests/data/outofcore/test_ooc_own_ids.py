"""The user's own node ids: an edge CSV of sparse 64-bit integers or strings partitioned with
``--own-ids`` (numbered in sorted order, the ids kept in the partition), OGB's ``mapping/``
files kept in memory and out of core (per type for ogbn-mag), and damaged id files refused.
The oracle is the CSV (or the mapping) itself: every edge read back through the kept ids
is the edge the file holds, in order."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ogb_files import write_ogbn_arxiv, write_ogbn_products
from ogb_mag_files import NUM_NODES as MAG_NODES
from ogb_mag_files import write_ogbn_mag

import sarcompile as sc
from sarcompile.cli.main import main
from sarcompile.errors import DatasetError, GraphError, PartitionError
from sarcompile.data.outofcore.ogb import partition_ogb

# Own ids are always read out of core; the limit is not what these tests are about, and the
# test process may already hold well over 1 GiB from earlier tests (pytest-xdist workers).
OOC_LIMIT = "8GiB"
SPARSE = st.integers(-(2**63), 2**63 - 1)
WORDS = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=6).map(str.strip) \
    .filter(lambda s: any(c.isalpha() for c in s) and s.lower() not in ("src", "dst"))  # a word: not an integer


def write_csv(path: Path, pairs: list[tuple], header: bool = False) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        if header:
            w.writerow(["dst", "src"])
            pairs = [(d, s) for s, d in pairs]
        w.writerows(pairs)
    return path


def read_back(parts: Path) -> list[tuple]:
    """The partition's edges, in edge order, each end as the user's id."""
    g, _ = sc.load_whole_graph(parts)
    ids = sc.read_node_ids(parts)
    assert isinstance(ids, np.memmap) or isinstance(ids.base, np.memmap)  # mapped, not loaded
    return list(zip(ids[g.src.numpy()].tolist(), ids[g.dst.numpy()].tolist()))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), ids=st.one_of(st.sets(SPARSE, min_size=1, max_size=30), st.sets(WORDS, min_size=1, max_size=30)),
       k=st.integers(1, 3), header=st.booleans())
def test_csv_of_own_ids_reads_back_as_written(tmp_path_factory, data, ids, k, header):
    """Sparse integers (negatives, both int64 ends) or strings (commas, quotes, any script),
    self-loops and repeated edges: every edge read back through the kept ids is the CSV's."""
    ids = sorted(ids)
    pick = st.sampled_from(ids)
    pairs = data.draw(st.lists(st.tuples(pick, pick), min_size=1, max_size=60))
    d = tmp_path_factory.mktemp("own")
    m = sc.partition_files(write_csv(d / "e.csv", pairs, header), k, d / "parts", own_ids=True, memory_limit=OOC_LIMIT)
    named = sorted({v for p in pairs for v in p})
    assert m.num_nodes == len(named) and m.node_ids["kind"] == ("integer" if isinstance(ids[0], int) else "string")
    assert sc.read_node_ids(d / "parts").tolist() == named  # numbered in sorted order
    assert read_back(d / "parts") == [tuple(p) for p in pairs]


def test_number_like_strings_among_words_are_strings_and_node_data_follows_the_order(tmp_path):
    """One word makes every id a string ("7" and "007" two nodes); --node-data rows are in
    the ids' sorted order; the CLI prints where the ids are."""
    path = write_csv(tmp_path / "e.csv", [("7", "007"), ("007", "b"), ("b", "7")])
    order = ["007", "7", "b"]
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.float32).reshape(3, 2))
    assert main(["partition", "--edges", str(path), "--own-ids", "--parts", "2", "--out", str(tmp_path / "p"),
                 "--node-data", f"x={tmp_path / 'x.npy'}"]) == 0
    assert sc.read_node_ids(tmp_path / "p").tolist() == order
    g, data = sc.load_whole_graph(tmp_path / "p")
    assert data["x"].tolist() == [[0, 1], [2, 3], [4, 5]]  # row i: the i-th id in order
    assert read_back(tmp_path / "p") == [("7", "007"), ("007", "b"), ("b", "7")]


def test_own_ids_refusals(tmp_path, capsys):
    path = write_csv(tmp_path / "e.csv", [("a", "b")])
    assert main(["partition", "--edges", str(path), "--parts", "1", "--out", str(tmp_path / "p")]) == 2
    assert "--own-ids" in capsys.readouterr().err  # words without --own-ids: the error says what to pass
    assert main(["partition", "--edges", str(path), "--own-ids", "--num-nodes", "2", "--parts", "1",
                 "--out", str(tmp_path / "p")]) == 2
    assert "drop --num-nodes" in capsys.readouterr().err
    assert main(["partition", "--dataset", "ogbn-arxiv", "--root", str(tmp_path), "--own-ids", "--parts", "1",
                 "--out", str(tmp_path / "p")]) == 2
    assert "--own-ids applies only to --edges FILE.csv" in capsys.readouterr().err
    write_csv(tmp_path / "empty.csv", [("", "b")])
    with pytest.raises(GraphError, match="edge 0 has an empty node id"):
        sc.partition_files(tmp_path / "empty.csv", 1, tmp_path / "q", own_ids=True)
    np.save(tmp_path / "x.npy", np.zeros((5, 2), dtype=np.float32))
    with pytest.raises(GraphError, match="has shape .5, 2. but the graph has 2 nodes"):
        sc.partition_files(path, 1, tmp_path / "q", {"x": tmp_path / "x.npy"}, own_ids=True)


def test_a_missing_or_damaged_id_file_is_refused_and_a_partition_without_ids_says_so(tmp_path):
    g = sc.Graph.from_edges(np.array([0, 1]), np.array([1, 2]), 3)
    sc.partition(g, 2, tmp_path / "p", node_ids=np.array([10, 2**40, -3]))
    ids_file = tmp_path / "p" / "node_ids.npy"
    data = bytearray(ids_file.read_bytes())
    data[-1] ^= 1
    ids_file.write_bytes(bytes(data))
    with pytest.raises(PartitionError, match="does not match its checksum.*re-run sarcompile partition"):
        sc.read_node_ids(tmp_path / "p")
    ids_file.unlink()
    with pytest.raises(PartitionError, match="node_ids.npy' is missing"):
        sc.read_node_ids(tmp_path / "p")
    sc.partition(g, 2, tmp_path / "p")  # partitioned again without ids: the old file does not outlive it
    assert not ids_file.exists()
    with pytest.raises(PartitionError, match="made from node ids 0..n-1"):
        sc.read_node_ids(tmp_path / "p")
    with pytest.raises(GraphError, match="repeats id 4"):
        sc.partition(g, 1, tmp_path / "q", node_ids=np.array([4, 5, 4]))
    with pytest.raises(GraphError, match="has shape .2,. but the graph has 3 nodes"):
        sc.partition(g, 1, tmp_path / "q", node_ids=np.array(["a", "b"]))


# -- OGB's mapping/ ----------------------------------------------------------------------------
def write_mapping(path: Path, header: str, ids: list) -> None:
    """An OGB mapping file: a header line, then ``node index,id`` per node."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(header + "\n")
        f.writelines(f"{i},{v}\n" for i, v in enumerate(ids))


@pytest.mark.parametrize("kind", ["paper ids", "asins"])
def test_ogb_mapping_is_kept_in_memory_and_out_of_core(tmp_path, kind):
    """arxiv's MAG paper ids (integers) and products' ASINs (strings), read from the mapping
    file and kept by both partition paths."""
    root = tmp_path / "ogb"
    if kind == "paper ids":
        name, written = "ogbn-arxiv", write_ogbn_arxiv(root)
        ids = (np.arange(len(written.x)) * 7919 + 2**40).tolist()
        write_mapping(root / "ogbn_arxiv" / "mapping" / "nodeidx2paperid.csv.gz", "node idx,paper id", ids)
    else:
        name, written = "ogbn-products", write_ogbn_products(root)
        ids = [f"B{i * 37:09d}" for i in range(len(written.x))]
        write_mapping(root / "ogbn_products" / "mapping" / "nodeidx2asin.csv.gz", "node idx,asin", ids)
    assert sc.load_ogb(name, root).node_ids.tolist() == ids
    assert main(["partition", "--dataset", name, "--root", str(root), "--parts", "2", "--out", str(tmp_path / "a")]) == 0
    partition_ogb(name, root, 3, tmp_path / "b", memory_limit=OOC_LIMIT)
    for parts in ("a", "b"):
        assert sc.read_node_ids(tmp_path / parts).tolist() == ids


def test_ogbn_mag_mapping_per_type(tmp_path):
    root = tmp_path / "ogb"
    write_ogbn_mag(root)
    ids = {"paper": [3 * i + 2**33 for i in range(MAG_NODES["paper"])],
           "author": [10 * i for i in range(MAG_NODES["author"])]}
    for t, values in ids.items():  # institution and field_of_study left without: no ids for them
        write_mapping(root / "ogbn_mag" / "mapping" / f"{t}_entidx2name.csv.gz", "ent idx,ent name", values)
    assert main(["partition", "--dataset", "ogbn-mag", "--root", str(root), "--parts", "2",
                 "--out", str(tmp_path / "p")]) == 0
    kept = sc.read_node_ids(tmp_path / "p")
    assert {t: v.tolist() for t, v in kept.items()} == ids


def test_a_damaged_ogb_mapping_is_refused(tmp_path):
    root = tmp_path / "ogb"
    written = write_ogbn_arxiv(root)
    path = root / "ogbn_arxiv" / "mapping" / "nodeidx2paperid.csv.gz"
    write_mapping(path, "node idx,paper id", list(range(len(written.x) - 1)))
    with pytest.raises(DatasetError, match="59 ids for 60 nodes"):
        sc.load_ogb("ogbn-arxiv", root)
    with gzip.open(path, "wt") as f:
        f.write("node idx,paper id\n1,5\n0,6\n")
    with pytest.raises(DatasetError, match="node index 0, 1, ... in order"):
        partition_ogb("ogbn-arxiv", root, 2, tmp_path / "p", memory_limit=OOC_LIMIT)
