"""sarcompile.data.outofcore.partition_files and `sarcompile partition --edges SRC.npy,DST.npy`:
the same directory sc.partition writes for the same assignment, within a memory limit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ooc_multilevel import edge_lists
from train_jobs import curve, run_train, train_job

import sarcompile as sc
from sarcompile.cli.main import main
from sarcompile.errors import GraphError, PartitionError, RunDirError
from sarcompile.data.outofcore import open_edges, partition_files
from sarcompile.data.outofcore.budget import MARGIN, current_rss
from sarcompile.data.outofcore.partition import MULTILEVEL
from sarcompile.data.manifest import read_manifest
from sarcompile.data.part_files import read_part
from sarcompile.data.rundir import lock_dir
from sarcompile.dist.memory import mapped_bytes
from sarcompile.data.synthetic_stream import write_sbm


def _write(d, n, src, dst, node_data):
    d.mkdir(parents=True, exist_ok=True)
    np.save(d / "src.npy", src), np.save(d / "dst.npy", dst)
    for k, v in node_data.items():
        np.save(d / f"{k}.npy", v)
    return open_edges(d / "src.npy", d / "dst.npy", n), {k: d / f"{k}.npy" for k in node_data}


def _node_data(n, seed):
    rng = np.random.default_rng(seed)
    train = rng.random(n) < 0.5
    return {"x": rng.standard_normal((n, 3)).astype(np.float32), "y": rng.integers(-1, 4, n),
            "train_mask": train, "val_mask": ~train}


def assert_same_directory(a, b):
    """Two partition directories hold the same parts, manifest entries and graph hash."""
    ma, mb = read_manifest(a), read_manifest(b)
    assert (ma.num_parts, ma.num_nodes, ma.num_edges, ma.halo_sizes, ma.edge_cut, ma.node_data, ma.graph_sha256) == \
        (mb.num_parts, mb.num_nodes, mb.num_edges, mb.halo_sizes, mb.edge_cut, mb.node_data, mb.graph_sha256)
    for r in range(ma.num_parts):
        pa, pb = ma.parts[r], mb.parts[r]
        assert (pa.num_nodes, pa.num_edges, pa.self_loops, pa.block_edges) == \
            (pb.num_nodes, pb.num_edges, pb.self_loops, pb.block_edges)
        x, y = read_part(a, ma, r), read_part(b, mb, r)
        for field in x.__dataclass_fields__:
            u, v = getattr(x, field), getattr(y, field)
            if u is None or v is None:  # an optional field (edge_values: only an adjacency's graph has them)
                assert u is None and v is None, (r, field)
                continue
            pairs = zip(u, v) if isinstance(u, list) else ((u[k], v[k]) for k in u) if isinstance(u, dict) else [(u, v)]
            if isinstance(u, dict):
                assert sorted(u) == sorted(v)
            for s, t in pairs:
                assert s.dtype == t.dtype and torch.equal(s, t), (r, field)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(graph=edge_lists(), k=st.integers(1, 4), method=st.sampled_from(["metis", "random", "contiguous"]),
       seed=st.integers(0, 5))
def test_same_directory_as_sc_partition(tmp_path_factory, graph, k, method, seed):
    """Isolated nodes, self-loops, repeated edges, empty parts: where METIS fits the limit,
    the very directory sc.partition writes."""
    n, src, dst = graph
    d = tmp_path_factory.mktemp("g")
    data = _node_data(n, seed)
    edges, files = _write(d, n, src, dst, data)
    m = partition_files(edges, k, d / "ooc", files, method=method, seed=seed, memory_limit="4GiB")
    assert m.method == method
    g = sc.Graph.from_edges(torch.from_numpy(src), torch.from_numpy(dst), n)
    sc.partition(g, k, d / "mem", node_data={key: torch.from_numpy(v) for key, v in data.items()},
                 method=method, seed=seed)
    assert_same_directory(d / "ooc", d / "mem")


@pytest.fixture(scope="module")
def sbm(tmp_path_factory):
    """4000 nodes in 4 planted blocks with learnable features."""
    out = tmp_path_factory.mktemp("sbm")
    return write_sbm(out, num_nodes=4000, avg_degree=8, num_blocks=4, p_in=0.9, features=8, num_classes=4, seed=2)


def _small_limit() -> int:
    """A limit that leaves 4 MiB above this process: too little for METIS on the whole graph."""
    return current_rss() + MARGIN + 4 * 2**20


@pytest.fixture(scope="module")
def coarsened(sbm, tmp_path_factory):
    out = tmp_path_factory.mktemp("parts")
    files = {k: sbm.files[k] for k in ("x", "y", "train_mask", "val_mask", "test_mask")}
    m = partition_files(open_edges(*sbm.edges(), sbm.num_nodes), 2, out, files, memory_limit=_small_limit())
    return out, m


def test_coarsened_partition_is_the_given_assignment_in_memory(sbm, coarsened, tmp_path):
    """Out of core (METIS on a coarsened graph): every node in exactly one part, and the
    same directory as sc.partition with that assignment, the whole graph in memory."""
    out, m = coarsened
    assert m.method == MULTILEVEL
    ids = torch.cat([sc.load_partition(out, rank=r, world_size=2).global_ids for r in range(2)])
    assert torch.equal(torch.sort(ids).values, torch.arange(sbm.num_nodes))
    assignment = torch.empty(sbm.num_nodes, dtype=torch.long)
    for r in range(2):
        assignment[sc.load_partition(out, rank=r, world_size=2).global_ids] = r
    g = sc.Graph.from_edges(torch.from_numpy(np.load(sbm.files["src"])), torch.from_numpy(np.load(sbm.files["dst"])),
                            sbm.num_nodes)
    data = {k: torch.from_numpy(np.load(sbm.files[k])) for k in ("x", "y", "train_mask", "val_mask", "test_mask")}
    sc.partition(g, 2, tmp_path / "mem", node_data=data, method=assignment)
    assert_same_directory(out, tmp_path / "mem")
    whole, node_data = sc.load_whole_graph(out)
    assert torch.equal(whole.src, g.src) and torch.equal(whole.dst, g.dst)
    assert all(torch.equal(node_data[k], data[k]) for k in data)


def test_training_on_a_coarsened_partition_gives_the_one_process_curve(pool, coarsened, tmp_path):
    """Each rank trains from a directory holding the manifest and its own part file only:
    no step of loading, training, evaluating or checkpointing reads another rank's part."""
    out, m = coarsened
    argv = ["--hidden", "8", "--epochs", "3", "--no-progress", "--dropout", "0.5", "--checkpoint-every", "2"]
    own = []
    for r in range(2):
        d = tmp_path / f"rank{r}"
        d.mkdir()
        for name in ("manifest.json", m.parts[r].file):
            os.link(out / name, d / name)
        own.append(["--parts", str(d), "--out", str(tmp_path / "r2"), *argv])
    two = pool(2).run(train_job, own)
    assert isinstance(two[0], list) and curve(two[0]) == curve(two[1]), two
    one = tmp_path / "one"
    g, node_data = sc.load_whole_graph(out)
    sc.partition(g, 1, one, node_data=node_data)
    single = run_train(pool, 1, ["--parts", str(one), "--out", str(tmp_path / "r1"), *argv])
    for a, b in zip(two[0], single, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6), (two[0], single)


_WATCHED: list[Path] = []  # the directory a pool worker's audit hook records opens under, while a job runs
_OPENED: set[str] = set()


def _record_open(event: str, args: tuple) -> None:
    if event == "open" and _WATCHED and isinstance(args[0], (str, os.PathLike)):
        path = Path(args[0]).resolve()
        if path.parent == _WATCHED[0]:
            _OPENED.add(path.name)


def pages_job(rank: int, world_size: int, argv: list[str]) -> dict:
    """Runs on a pool worker: trains with ``argv`` and reports the files of the partition
    directory this process opened, and the resident bytes of each file it had mapped
    while it trained (after the first step)."""
    import sarcompile.train.loop as trainer

    directory = Path(argv[argv.index("--parts") + 1]).resolve()
    step, mapped = trainer._train_step, {}

    def counted_step(*args):
        result = step(*args)
        if not mapped:  # after the first step
            mapped.update(mapped_bytes(directory))
        return result

    if not _WATCHED:
        sys.addaudithook(_record_open)  # hooks cannot be removed: _WATCHED turns it off between jobs
    _WATCHED[:] = [directory]
    _OPENED.clear()
    trainer._train_step = counted_step
    try:
        records = trainer.train(argv)
    finally:
        trainer._train_step, _WATCHED[:] = step, []
    return {"epochs": len(records), "opened": sorted(_OPENED), "mapped": mapped}


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="counts pages from Linux's /proc/self/smaps")
def test_each_rank_maps_only_its_own_rows(pool, coarsened, tmp_path):
    """Both ranks train from one shared directory: each opens the manifest and its own part
    file only, and the part file's pages resident while it trains are its node rows
    (features, labels, masks), not the file's edge lists, which the shard copied."""
    out, m = coarsened
    argv = ["--parts", str(out), "--out", str(tmp_path / "run"), "--hidden", "8", "--epochs", "1", "--no-progress"]
    got = pool(2).run(pages_job, [argv] * 2)
    for r, seen in enumerate(got):
        own = m.parts[r].file
        assert seen["epochs"] == 1
        assert seen["opened"] == sorted(["manifest.json", own]), seen
        assert list(seen["mapped"]) == [own], seen
        node_bytes = sum(t.numel() * t.element_size() for t in read_part(out, m, r).node_data.values())
        # A fault on a file mapping also maps the cached pages around it (Linux's fault-around,
        # 64 KiB by default): allow that much on either side of each node tensor.
        assert 0 < seen["mapped"][own] <= node_bytes + 2 * 64 * 1024 * len(m.node_data), (seen, node_bytes)
        assert seen["mapped"][own] < (out / own).stat().st_size / 3, seen  # the edge lists are most of the file


def test_bad_node_data_is_refused_before_anything_is_written(sbm, coarsened, tmp_path):
    out, _ = coarsened
    before = {p.name: p.read_bytes() for p in out.glob("*") if p.is_file() and p.name != ".lock"}
    x = np.load(sbm.files["x"])
    x[1234, 5] = np.nan
    np.save(tmp_path / "x.npy", x)
    with pytest.raises(GraphError, match=r"node_data\['x'\].*1234"):
        partition_files(open_edges(*sbm.edges(), sbm.num_nodes), 2, out, {"x": tmp_path / "x.npy"}, memory_limit="4GiB")
    assert {p.name: p.read_bytes() for p in out.glob("*") if p.is_file() and p.name != ".lock"} == before  # intact
    np.save(tmp_path / "short.npy", x[:10])
    with pytest.raises(GraphError, match="has shape .* but the graph has 4000 nodes"):
        sc.partition_files(sbm.edges(), 2, tmp_path / "o", {"x": tmp_path / "short.npy"}, num_nodes=sbm.num_nodes)
    with pytest.raises(GraphError, match="needs num_nodes=N"):
        sc.partition_files(sbm.edges(), 2, tmp_path / "o")


def test_a_limit_below_the_node_arrays_names_the_least_that_works(sbm, tmp_path):
    with pytest.raises(PartitionError, match="give --memory-limit at least"):
        partition_files(open_edges(*sbm.edges(), sbm.num_nodes), 2, tmp_path, memory_limit=current_rss())


def test_a_second_run_on_the_directory_is_refused_and_a_killed_runs_scratch_removed(sbm, tmp_path):
    edges = open_edges(*sbm.edges(), sbm.num_nodes)
    with lock_dir(tmp_path, "partition run"):
        with pytest.raises(RunDirError, match="in use by another partition run"):
            partition_files(edges, 2, tmp_path)
    stale = tmp_path / ".scratch-killed"
    stale.mkdir()
    (stale / "edges-0.bin").write_bytes(b"x" * 100)
    partition_files(edges, 2, tmp_path, memory_limit="4GiB")
    assert not stale.exists() and not list(tmp_path.glob(".scratch-*"))
    sc.load_partition(tmp_path, rank=1, world_size=2)


def test_cli_two_arrays_and_node_data(sbm, tmp_path, capsys):
    out = tmp_path / "cli"
    argv = ["partition", "--edges", ",".join(map(str, sbm.edges())), "--num-nodes", str(sbm.num_nodes),
            "--parts", "3", "--out", str(out), "--node-data", f"x={sbm.files['x']}", "--node-data",
            f"y={sbm.files['y']}", "--memory-limit", "4GiB"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "3 parts (metis, seed 0)" in printed and "peak RSS" in printed
    part = sc.load_partition(out, rank=2, world_size=3)
    assert torch.equal(part.node_data["x"], torch.from_numpy(np.load(sbm.files["x"]))[part.global_ids])
    for bad, message in [
        (["--num-nodes", "5"], "--num-nodes apply only to --edges SRC.npy,DST.npy"),
        (["--edges", "a.npy,b.npy,c.npy"], "give two .npy files"),
        (["--edges", ",".join(map(str, sbm.edges())), "--node-data", "x"], "write NAME=FILE.npy"),
    ]:
        base = ["partition", "--parts", "2", "--out", str(tmp_path / "bad")]
        if "--edges" not in bad:
            base += ["--edges", str(sbm.files["src"]).replace(".npy", ".pt")]
        if "--num-nodes" not in bad and "a.npy" not in bad[1]:
            base += ["--num-nodes", str(sbm.num_nodes)]
        assert main(base + bad) == 2
        assert message in capsys.readouterr().err
    assert main(["partition", "--edges", ",".join(map(str, sbm.edges())), "--parts", "2", "--out",
                 str(tmp_path / "bad")]) == 2
    assert "needs --num-nodes N" in capsys.readouterr().err


def test_peak_rss_stays_under_the_limit(tmp_path):
    """The whole process, torch included, in a fresh interpreter, 200k nodes and 2M edges:
    within a limit that forces coarsening, then within the least limit that lets METIS
    take the whole graph."""
    g = write_sbm(tmp_path, num_nodes=200_000, avg_degree=10, num_blocks=8, p_in=0.9, seed=3)
    script = textwrap.dedent(f"""
        from sarcompile.data.outofcore import budget, open_edges, partition_files
        edges = open_edges({str(g.files['src'])!r}, {str(g.files['dst'])!r}, 200_000)
        tight = budget.current_rss() + 160 * 2**20
        m = partition_files(edges, 8, {str(tmp_path / 'a')!r}, memory_limit=tight)
        print(m.method, tight, budget.peak_rss())
        whole = (budget.current_rss() + budget.MARGIN + 2**20 + 200_000 * (budget.NODE_BYTES + budget.METIS_NODE_BYTES)
                 + edges.num_edges * budget.IN_MEMORY_EDGE_BYTES)
        m = partition_files(edges, 8, {str(tmp_path / 'b')!r}, memory_limit=whole)
        print(m.method, whole, budget.peak_rss())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (method, limit, peak), (method2, limit2, peak2) = (line.split() for line in done.stdout.splitlines())
    assert method == MULTILEVEL and int(peak) <= int(limit), (int(peak) / 2**20, int(limit) / 2**20)
    assert method2 == "metis" and int(peak2) <= int(limit2), (int(peak2) / 2**20, int(limit2) / 2**20)


@pytest.mark.parametrize("header", ["", "src,dst\n", "dst,src\n"])
def test_a_csv_edge_file_partitions_as_its_arrays(tmp_path, header, capsys):
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, 50, 300), rng.integers(0, 50, 300)
    cols = (dst, src) if header.startswith("dst") else (src, dst)
    (tmp_path / "g.csv").write_text(header + "".join(f"{a},{b}\n" for a, b in zip(*cols)))
    np.save(tmp_path / "s.npy", src), np.save(tmp_path / "d.npy", dst)
    sc.partition_files((tmp_path / "s.npy", tmp_path / "d.npy"), 3, tmp_path / "npy", num_nodes=50)
    argv = ["partition", "--edges", str(tmp_path / "g.csv"), "--num-nodes", "50", "--parts", "3",
            "--memory-limit", "4GiB", "--out", str(tmp_path / "csv")]
    assert main(argv) == 0
    assert_same_directory(tmp_path / "csv", tmp_path / "npy")
    (tmp_path / "bad.csv").write_text("src,dst\n1,2\n3,x\n")
    with pytest.raises(GraphError, match="is not a CSV of integer src,dst pairs"):
        sc.partition_files(tmp_path / "bad.csv", 2, tmp_path / "bad", num_nodes=5)
