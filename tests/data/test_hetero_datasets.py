"""Typed datasets: a tiny ogbn-mag written in OGB's on-disk layout and read back through ogb,
and the synthetic MAG-like generator; both partitioned and reassembled."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import sarcompile as sc
from sarcompile.errors import DatasetError, GraphError
from sarcompile.data.synthetic import mag_like
from ogb_mag_files import MASKS, NUM_CLASSES, NUM_NODES, RELATIONS, WrittenMag, write_ogbn_mag


@pytest.fixture
def mag(tmp_path: Path) -> WrittenMag:
    return write_ogbn_mag(tmp_path / "ogb")


def pairs(g: sc.Graph) -> list[tuple[int, int]]:
    return list(zip(g.src.tolist(), g.dst.tolist()))


def _no_prompt(*args: object) -> str:
    raise AssertionError("ogb must not prompt")


# -- load_ogb_mag ----------------------------------------------------------------------------
def check_mag(ds: sc.HeteroDataset, written: WrittenMag, add_reverse: bool) -> None:
    g = ds.graph
    assert (ds.name, ds.num_classes, ds.target_type) == ("ogbn-mag", NUM_CLASSES, "paper")
    assert {t: g.num_nodes(t) for t in g.node_types} == NUM_NODES
    reverse = [(d, f"rev_{r}", s) for s, r, d in RELATIONS if s != d] if add_reverse else []
    assert list(g.edge_types) == RELATIONS + reverse
    for (s, r, d), e in written.edges.items():
        stored = [tuple(p) for p in e.tolist()]
        assert pairs(g[s, r, d]) == stored
        if add_reverse and s != d:
            assert pairs(g[d, f"rev_{r}", s]) == [(v, u) for u, v in stored]
    assert {t: sorted(v) for t, v in ds.node_data.items()} == {
        "author": [], "field_of_study": [], "institution": [],
        "paper": ["test_mask", "train_mask", "val_mask", "x", "y"],
    }
    paper = ds.node_data["paper"]
    assert paper["x"].dtype == torch.float32 and torch.equal(paper["x"], torch.tensor(written.x, dtype=torch.float32))
    assert paper["y"].dtype == torch.int64 and paper["y"].tolist() == written.y.tolist()
    for mask, part in MASKS.items():
        assert paper[mask].dtype == torch.bool
        assert torch.nonzero(paper[mask]).flatten().tolist() == sorted(written.split[part].tolist())


@pytest.mark.parametrize("add_reverse", [True, False])
def test_mag_matches_the_files(mag, add_reverse):
    check_mag(sc.load_ogb_mag(mag.root, add_reverse=add_reverse), mag, add_reverse)


def test_mag_second_load_reads_ogbs_cache(mag):
    sc.load_ogb_mag(mag.root)
    # Without the raw edges only the cache can answer.
    (mag.root / "ogbn_mag" / "raw" / "relations" / "paper___cites___paper" / "edge.csv.gz").unlink()
    check_mag(sc.load_ogb_mag(mag.root), mag, add_reverse=True)


@pytest.mark.parametrize("missing", [
    "raw/triplet-type-list.csv.gz",
    "raw/relations/paper___cites___paper/edge.csv.gz",
    "raw/relations/author___writes___paper/num-edge-list.csv.gz",
    "raw/node-feat/paper/node-feat.csv.gz",
    "raw/node-label/paper/node-label.csv.gz",
    "split/time/nodetype-has-split.csv.gz",
    "split/time/paper/valid.csv.gz",
])
def test_mag_missing_file_is_named(mag, missing, monkeypatch):
    (mag.root / "ogbn_mag" / missing).unlink()
    monkeypatch.setattr("builtins.input", _no_prompt)
    with pytest.raises(DatasetError) as e:
        sc.load_ogb_mag(mag.root)
    message = str(e.value)
    assert repr(str(mag.root / "ogbn_mag" / missing)) in message
    assert "http://snap.stanford.edu/ogb/data/nodeproppred/mag.zip" in message
    assert f"folder 'mag' it holds to '{mag.root / 'ogbn_mag'}'" in message


def test_mag_missing_folder_says_where_to_put_the_zip(tmp_path):
    with pytest.raises(DatasetError, match=r"'.*ogbn_mag' does not exist; download .*mag\.zip"):
        sc.load_ogb_mag(tmp_path)


def test_load_ogb_points_mag_to_its_loader(tmp_path):
    with pytest.raises(DatasetError, match="load_ogb_mag"):
        sc.load_ogb("ogbn-mag", tmp_path)


def test_reverse_relation_clash_is_refused():
    from sarcompile.data.datasets import add_reverse_relations

    e = (torch.tensor([0]), torch.tensor([0]))
    with pytest.raises(GraphError, match="already have a relation"):
        add_reverse_relations({("a", "r", "b"): e, ("b", "rev_r", "a"): e})


# -- mag_like --------------------------------------------------------------------------------
SMALL = dict(num_papers=400, num_authors=300, num_institutions=12, num_fields=30, features=8, num_classes=5)


def test_mag_like_shape_and_ranges():
    ds = mag_like(**SMALL)
    g = ds.graph
    assert g.node_types == ("paper", "author", "institution", "field_of_study")
    assert [g.num_nodes(t) for t in g.node_types] == [400, 300, 12, 30]
    forward = [("author", "writes", "paper"), ("paper", "cites", "paper"),
               ("author", "affiliated_with", "institution"), ("paper", "has_topic", "field_of_study")]
    assert list(g.edge_types) == forward + [(d, f"rev_{r}", s) for s, r, d in forward if s != d]
    for (s, r, d), rg in g.items():
        assert rg.num_edges > 0
        assert 0 <= int(rg.src.min()) and int(rg.src.max()) < g.num_nodes(s)
        assert 0 <= int(rg.dst.min()) and int(rg.dst.max()) < g.num_nodes(d)
        assert len(set(pairs(rg))) == rg.num_edges  # no multi-edges
        if not r.startswith("rev_"):
            rev = g.relations.get((d, f"rev_{r}", s))
            assert rev is None or pairs(rev) == [(v, u) for u, v in pairs(rg)]
    assert not bool((g["cites"].src == g["cites"].dst).any())
    # The isolated paper and author: no edges in any relation.
    touched = {t: torch.zeros(g.num_nodes(t), dtype=torch.bool) for t in g.node_types}
    for (s, _, d), rg in g.items():
        touched[s][rg.src] = True
        touched[d][rg.dst] = True
    assert (~touched["paper"]).sum() == 1 and (~touched["author"]).sum() == 1
    # Everyone else: an author per paper, a paper and an institution per author, a topic per paper.
    for rel, end in (("writes", "dst"), ("writes", "src"), ("affiliated_with", "src"), ("has_topic", "src")):
        rg = g[rel]
        ids, count = (rg.dst, rg.num_nodes) if end == "dst" else (rg.src, rg.num_src_nodes)
        assert int((torch.bincount(ids, minlength=count) == 0).sum()) == 1
    assert not any(rel[1].startswith("rev_") for rel in mag_like(**SMALL, add_reverse=False).graph.edge_types)

    paper = ds.node_data["paper"]
    assert ds.target_type == "paper" and ds.num_classes == 5
    assert all(ds.node_data[t] == {} for t in ("author", "institution", "field_of_study"))
    assert paper["x"].dtype == torch.float32 and paper["x"].shape == (400, 8)
    assert paper["y"].dtype == torch.int64 and 0 <= int(paper["y"].min()) and int(paper["y"].max()) < 5
    masks = torch.stack([paper[m] for m in MASKS])
    assert masks.dtype == torch.bool and masks.sum(0).eq(1).all()  # disjoint and covering
    assert masks.sum(1).tolist() == [320, 40, 40]


def test_mag_like_is_deterministic_per_seed():
    def flat(ds: sc.HeteroDataset) -> list[torch.Tensor]:
        return [t for _, rg in ds.graph.items() for t in (rg.src, rg.dst)] + list(ds.node_data["paper"].values())

    a, b, c = (flat(mag_like(**SMALL, seed=s)) for s in (0, 0, 1))
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not all(u.shape == v.shape and torch.equal(u, v) for u, v in zip(a, c))


def test_mag_like_labels_are_learnable():
    """Features point at the class, citations mostly stay within it: a class-mean
    classifier beats chance, and beats it further with the cited papers' features."""
    ds = mag_like(num_papers=3000, num_authors=2000, num_institutions=50, num_fields=200, features=32,
                  num_classes=10)
    paper, cites = ds.node_data["paper"], ds.graph["cites"]
    y, train, test = paper["y"], paper["train_mask"], paper["test_mask"]

    def accuracy(feat: torch.Tensor) -> float:
        means = torch.zeros(10, feat.shape[1]).index_add_(0, y[train], feat[train])
        means /= torch.bincount(y[train], minlength=10).clamp(min=1)[:, None]
        return float((torch.cdist(feat[test], means).argmin(1) == y[test]).float().mean())

    both_ways = sc.Graph(torch.cat([cites.src, cites.dst]), torch.cat([cites.dst, cites.src]), cites.num_nodes)
    alone, with_neighbours = accuracy(paper["x"]), accuracy(paper["x"] + sc.spmm(both_ways, paper["x"], "mean"))
    assert float((y[cites.src] == y[cites.dst]).float().mean()) > 0.7
    assert 0.2 < alone < with_neighbours


def test_mag_like_refuses_empty_types():
    with pytest.raises(GraphError, match="num_institution"):
        mag_like(**{**SMALL, "num_institutions": 0})
    with pytest.raises(GraphError, match="authors_per_paper"):
        mag_like(**SMALL, authors_per_paper=0.5)


def test_mag_like_is_fast_at_200k_nodes():
    import time

    start = time.perf_counter()
    ds = mag_like(num_papers=100_000, num_authors=100_000, num_institutions=2_000, num_fields=10_000, features=16)
    assert ds.graph.num_nodes() == 212_000
    assert time.perf_counter() - start < 5


# -- partition and reassemble ----------------------------------------------------------------
def check_round_trip(ds: sc.HeteroDataset, out: Path) -> None:
    sc.partition(ds.graph, 2, out, node_data=ds.node_data)
    graph, node_data = sc.load_whole_graph(out)
    assert graph.node_types == ds.graph.node_types and graph.edge_types == ds.graph.edge_types
    assert all(graph.num_nodes(t) == ds.graph.num_nodes(t) for t in graph.node_types)
    for rel, rg in ds.graph.items():
        assert torch.equal(graph[rel].src, rg.src) and torch.equal(graph[rel].dst, rg.dst)
    assert node_data.keys() == ds.node_data.keys()
    for t, tensors in ds.node_data.items():
        assert node_data[t].keys() == tensors.keys()
        assert all(torch.equal(node_data[t][k], v) for k, v in tensors.items())


def test_mag_like_partitions_and_reassembles(tmp_path):
    check_round_trip(mag_like(**SMALL), tmp_path / "parts")


def test_loaded_mag_partitions_and_reassembles(mag, tmp_path):
    check_round_trip(sc.load_ogb_mag(mag.root), tmp_path / "parts")
