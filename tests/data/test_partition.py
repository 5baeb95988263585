"""Partitioning: every part written and loaded back is checked against the original graph,
recomputed here from the edge list without the partitioner's code."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sarcompile.data.part_files as part_files
from sarcompile.errors import GraphError, PartitionError
from sarcompile.graph.graph import Graph
from sarcompile.data.assign import METHODS, _symmetric_csr, assign
from sarcompile.data.manifest import Manifest, read_manifest, summary
from sarcompile.data.loading import load_partition
from sarcompile.data.partitioning import partition
from sarcompile.data.rundir import _atomic_write, _sha256


def messy_graph(num_nodes: int, num_edges: int, seed: int) -> Graph:
    """Random edges among the first 3/4 of the nodes (the rest are isolated), plus
    self-loops and repeated edges."""
    gen = torch.Generator().manual_seed(seed)
    live = max(1, num_nodes * 3 // 4)
    src = torch.randint(live, (num_edges,), generator=gen)
    dst = torch.randint(live, (num_edges,), generator=gen)
    loops = torch.tensor([0, live - 1])
    src = torch.cat([src, loops, src[:3]])
    dst = torch.cat([dst, loops, dst[:3]])
    return Graph.from_edges(src, dst, num_nodes)


def node_tensors(n: int) -> dict[str, torch.Tensor]:
    return {
        "x": torch.randn(n, 3, generator=torch.Generator().manual_seed(n)),
        "y": torch.arange(n) * 7,
        "train_mask": torch.arange(n) % 2 == 0,
    }


def check_roundtrip(
    g: Graph, node_data: dict[str, torch.Tensor], num_parts: int, method: str | torch.Tensor, out: Path
) -> None:
    """Write, load every rank, and compare with the original graph."""
    manifest = partition(g, num_parts, out, node_data=node_data, method=method, seed=3)
    parts = [load_partition(out, rank=r, world_size=num_parts) for r in range(num_parts)]

    # The parts' nodes are all nodes, each exactly once, sorted within a part.
    all_ids = torch.cat([p.global_ids for p in parts])
    assert torch.equal(torch.sort(all_ids).values, torch.arange(g.num_nodes))
    owner = torch.empty(g.num_nodes, dtype=torch.long)
    for r, p in enumerate(parts):
        owner[p.global_ids] = r
        assert torch.equal(p.global_ids, torch.sort(p.global_ids).values)
    assert torch.equal(owner, assign(g, num_parts, method, seed=3))

    # Every original edge lands exactly once, in its destination's part.
    all_eids = torch.cat([p.graph.edge_ids for p in parts])
    assert torch.equal(torch.sort(all_eids).values, torch.arange(g.num_edges))

    in_deg = torch.bincount(g.dst, minlength=g.num_nodes)
    for r, p in enumerate(parts):
        sg = p.graph
        assert sg.num_nodes == p.global_ids.numel() == manifest.parts[r].num_nodes
        assert sg.num_edges == manifest.parts[r].num_edges
        for q, block in enumerate(sg.blocks):
            eids = sg.edge_ids[sg.edge_ptr[q] : sg.edge_ptr[q + 1]]
            assert torch.equal(p.global_ids[block.row], g.dst[eids])
            assert torch.equal(block.src_gids[block.col], g.src[eids])
            assert torch.all(owner[g.src[eids]] == q)
            if q != r:
                # The halo r expects from q is exactly what q sends to r.
                sender = parts[q]
                assert torch.equal(block.src_gids, sender.global_ids[sender.graph.send_index[r]])
                into_r = (owner[g.src] == q) & (owner[g.dst] == r)
                halo = torch.unique(g.src[into_r]).numel()
                assert block.num_src == halo == manifest.halo_sizes[r][q]
            else:
                assert manifest.halo_sizes[r][r] == 0
        assert torch.equal(sg.in_degrees(), in_deg[p.global_ids])
        for key, t in node_data.items():
            assert torch.equal(p.node_data[key], t[p.global_ids])

    assert manifest.edge_cut == int((owner[g.src] != owner[g.dst]).sum())
    assert manifest.num_nodes == g.num_nodes and manifest.num_edges == g.num_edges
    assert read_manifest(out) == manifest


# -- round trips -----------------------------------------------------------------------------
GRAPHS = {
    "messy": (40, 120),
    "tiny": (3, 4),  # fewer nodes than 5 parts: empty parts
    "edgeless": (6, 0),
}


@pytest.mark.parametrize("num_parts", [1, 2, 3, 5])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("graph", GRAPHS)
def test_roundtrip(graph, method, num_parts, tmp_path):
    n, e = GRAPHS[graph]
    if e:
        g = messy_graph(n, e, seed=n + e)
    else:
        g = Graph.from_edges(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), n)
    check_roundtrip(g, node_tensors(n), num_parts, method, tmp_path)


@st.composite
def small_graphs(draw):
    n = draw(st.integers(0, 12))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=40)) if n else []
    src = torch.tensor([u for u, _ in pairs], dtype=torch.long)
    dst = torch.tensor([v for _, v in pairs], dtype=torch.long)
    return Graph.from_edges(src, dst, n)


@settings(max_examples=25, deadline=None)
@given(g=small_graphs(), num_parts=st.integers(1, 5), method=st.sampled_from(METHODS))
def test_roundtrip_property(g, num_parts, method):
    with tempfile.TemporaryDirectory() as out:
        check_roundtrip(g, node_tensors(g.num_nodes), num_parts, method, Path(out))


def test_empty_graph(tmp_path):
    g = Graph.from_edges(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), 0)
    check_roundtrip(g, {}, 2, "metis", tmp_path)


# -- assignment ------------------------------------------------------------------------------
def two_communities(size: int = 30, bridges: int = 3) -> Graph:
    gen = torch.Generator().manual_seed(0)
    src, dst = [], []
    for base in (0, size):
        a = torch.randint(size, (size * 8,), generator=gen) + base
        b = torch.randint(size, (size * 8,), generator=gen) + base
        src += [a, b]
        dst += [b, a]
    src.append(torch.arange(bridges))
    dst.append(torch.arange(bridges) + size)
    return Graph.from_edges(torch.cat(src), torch.cat(dst), 2 * size)


def cut(g: Graph, parts: torch.Tensor) -> int:
    return int((parts[g.src] != parts[g.dst]).sum())


def test_metis_cuts_less_than_random():
    g = two_communities()
    metis, rand = assign(g, 2, "metis"), assign(g, 2, "random")
    assert cut(g, metis) <= 3 < cut(g, rand)
    assert torch.bincount(metis, minlength=2).tolist() == [30, 30]


def test_assign_is_reproducible_and_in_range():
    g = messy_graph(50, 200, seed=1)
    for method in METHODS:
        a = assign(g, 4, method, seed=7)
        assert a.dtype == torch.long and a.shape == (50,)
        assert 0 <= int(a.min()) and int(a.max()) < 4
        assert torch.equal(a, assign(g, 4, method, seed=7))
    assert not torch.equal(assign(g, 4, "random", seed=1), assign(g, 4, "random", seed=2))
    assert assign(g, 5, "contiguous").tolist() == [v * 5 // 50 for v in range(50)]


@pytest.mark.parametrize("num_parts", [1, 3])
def test_given_assignment_roundtrip(num_parts, tmp_path):
    """A tensor of part ids as ``method`` is used as is (e.g. another partitioner's);
    the manifest records method "given"."""
    g = messy_graph(40, 120, seed=5)
    given_parts = torch.randint(num_parts, (40,), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    check_roundtrip(g, node_tensors(40), num_parts, given_parts, tmp_path)
    assert read_manifest(tmp_path).method == "given"
    assert torch.equal(assign(g, num_parts, given_parts), given_parts.long())


@pytest.mark.parametrize(
    "parts, match",
    [
        (torch.zeros(40), "integer part ids"),
        (torch.zeros(39, dtype=torch.long), "one part id per node"),
        (torch.zeros(40, 1, dtype=torch.long), "one part id per node"),
        (torch.full((40,), 3), r"\[0, 3\)"),
        (torch.full((40,), -1), r"\[0, 3\)"),
    ],
)
def test_given_assignment_is_checked(parts, match, tmp_path):
    g = messy_graph(40, 120, seed=5)
    with pytest.raises(PartitionError, match=match):
        partition(g, 3, tmp_path, method=parts)
    assert not (tmp_path / "manifest.json").exists()


def test_symmetric_csr_drops_loops_and_duplicates():
    g = Graph.from_edges(torch.tensor([0, 0, 1, 2, 2]), torch.tensor([1, 1, 0, 2, 0]), 4)
    xadj, adjncy = _symmetric_csr(g)
    assert xadj.tolist() == [0, 2, 3, 4, 4]
    assert adjncy.tolist() == [1, 2, 0, 0]


def test_bad_arguments(tmp_path):
    g = messy_graph(10, 20, seed=0)
    with pytest.raises(GraphError, match="Graph.from_edges"):
        partition((g.src, g.dst), 2, tmp_path)
    with pytest.raises(PartitionError, match="metis, random, contiguous"):
        assign(g, 2, "spectral")
    for bad in (0, -1, 2.0):
        with pytest.raises(PartitionError, match="num_parts"):
            partition(g, bad, tmp_path)
    with pytest.raises(GraphError, match=r"node_data\['x'\].*10 nodes"):
        partition(g, 2, tmp_path, node_data={"x": torch.zeros(9, 2)})
    assert not (tmp_path / "manifest.json").exists()


# -- the directory ---------------------------------------------------------------------------
@pytest.fixture
def written(tmp_path):
    g = messy_graph(30, 80, seed=5)
    out = tmp_path / "parts"
    partition(g, 3, out, node_data=node_tensors(30), method="random")
    return out


def test_manifest_contents(written):
    m = read_manifest(written)
    d = json.loads((written / "manifest.json").read_text())
    assert d["format_version"] == 1 and d["num_parts"] == 3 and d["method"] == "random"
    assert d["node_data"] == {
        "x": {"dtype": "float32", "shape": [3]},
        "y": {"dtype": "int64", "shape": []},
        "train_mask": {"dtype": "bool", "shape": []},
    }
    for r, info in enumerate(m.parts):
        path = written / info.file
        assert info.file == f"part-{r}.pt" and info.bytes == path.stat().st_size
        assert info.sha256 == _sha256(path)
    assert Manifest.from_json(m.to_json()) == m
    assert not list(written.glob(".*.tmp"))
    text = summary(m)
    assert "edge cut" in text and "halo" in text and str(m.edge_cut) in text


def test_part_files_hold_no_hidden_storage(written):
    # Part tensors sliced from a bigger one would drag the whole storage into the file.
    d = torch.load(written / "part-0.pt", weights_only=True)
    ids = d["global_ids"]
    assert ids.untyped_storage().nbytes() == ids.numel() * ids.element_size()


def test_default_rank_is_single_worker(tmp_path):
    g = messy_graph(12, 30, seed=2)
    partition(g, 1, tmp_path)
    p = load_partition(tmp_path)
    assert p.rank == 0 and torch.equal(p.global_ids, torch.arange(12))


def test_world_size_mismatch(written):
    with pytest.raises(PartitionError, match=r"3 parts but this run has 2 workers.*start 3 workers in all \(torchrun.s --nnodes x --nproc-per-node\).*--parts 2"):
        load_partition(written, rank=0, world_size=2)


def test_missing_directory(tmp_path):
    with pytest.raises(PartitionError, match="does not exist.*partition first"):
        load_partition(tmp_path / "nope", 0, 1)


def test_missing_manifest(tmp_path):
    with pytest.raises(PartitionError, match="no manifest.json.*partition first"):
        load_partition(tmp_path, 0, 1)


def test_unreadable_manifest(written):
    (written / "manifest.json").write_text("{not json")
    with pytest.raises(PartitionError, match="not valid JSON"):
        load_partition(written, 0, 3)


def test_unknown_format_version(written):
    d = json.loads((written / "manifest.json").read_text())
    d["format_version"] = 99
    (written / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(PartitionError, match="format_version 99"):
        load_partition(written, 0, 3)


def test_missing_part_file(written):
    (written / "part-1.pt").unlink()
    load_partition(written, 0, 3)  # other ranks are unaffected
    with pytest.raises(PartitionError, match="part-1.pt' is missing"):
        load_partition(written, 1, 3)


def test_corrupt_part_file(written):
    path = written / "part-2.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(PartitionError, match="checksum.*corrupt or from another partitioning"):
        load_partition(written, 2, 3)


def test_a_part_file_that_cannot_be_mapped_is_read_whole(written, monkeypatch):
    """A file system that cannot map files (some network or FUSE mounts) loads the same part."""
    want = load_partition(written, 1, 3)
    real = torch.load

    def no_mmap(*args, mmap=None, **kwargs):
        if mmap:
            raise RuntimeError("mmap: operation not supported")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", no_mmap)
    got = load_partition(written, 1, 3)
    assert torch.equal(got.global_ids, want.global_ids) and got.node_data.keys() == want.node_data.keys()
    assert all(torch.equal(got.node_data[k], want.node_data[k]) for k in want.node_data)
    assert all(torch.equal(a.indptr, b.indptr) and torch.equal(a.col, b.col)
               for a, b in zip(got.graph.blocks, want.graph.blocks))


def test_halo_mismatch_is_caught(written):
    m = read_manifest(written)
    m.halo_sizes[1][0] += 1
    (written / "manifest.json").write_text(m.to_json())
    with pytest.raises(PartitionError, match="sends"):
        load_partition(written, 0, 3)


def test_interrupted_repartition_does_not_load(written, monkeypatch):
    """A run that dies after rewriting some parts must not leave the old manifest behind."""
    real = part_files._write_part

    def dies_at_rank_1(out, rank, part):
        if rank == 1:
            raise RuntimeError("simulated crash")
        return real(out, rank, part)

    monkeypatch.setattr(part_files, "_write_part", dies_at_rank_1)
    g = messy_graph(30, 80, seed=6)
    with pytest.raises(RuntimeError, match="simulated crash"):
        partition(g, 3, written, method="contiguous")
    for rank in range(3):
        with pytest.raises(PartitionError, match="no manifest.json"):
            load_partition(written, rank, 3)


def test_failed_write_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")

    def fails(f):
        f.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _atomic_write(path, fails)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_repartition_replaces_everything(written):
    g = messy_graph(20, 50, seed=9)
    partition(g, 2, written, method="contiguous")
    m = read_manifest(written)
    assert m.num_parts == 2 and m.num_nodes == 20
    p = load_partition(written, 1, 2)
    assert torch.equal(p.global_ids, torch.arange(10, 20))
    # .lock: the partition run's lock file (left in place: the lock is the open file, not the name)
    assert sorted(f.name for f in written.iterdir()) == [".lock", "manifest.json", "part-0.pt", "part-1.pt"]


def test_graph_sha256_tells_adjacency_values_apart():
    """Two sparse adjacencies with the same edges and other values are other graphs (a resume
    must not mix them up); one of ones without self-loops is the graph of its edges."""
    from sarcompile.data.manifest import graph_sha256

    dst, src = torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1])
    adj = lambda values: torch.sparse_coo_tensor(torch.stack([dst, src]), values, (3, 3)).to_sparse_csr()  # noqa: E731
    weighted = Graph.from_adjacency(adj(torch.tensor([0.5, 1.0, 2.0, 1.0])))
    other = Graph.from_adjacency(adj(torch.tensor([0.5, 1.0, 2.0, 3.0])))
    ones = Graph.from_adjacency(adj(torch.ones(4)))
    assert graph_sha256(weighted) != graph_sha256(other)
    assert graph_sha256(ones) == graph_sha256(Graph.from_edges(ones.src, ones.dst, 3))
    assert graph_sha256(weighted) != graph_sha256(ones)
