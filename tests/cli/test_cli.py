"""The ``sarcompile`` command line: help, each edge file format, and one-line errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from commands import run
from sarcompile.cli.edge_files import load_edge_file
from sarcompile.cli.main import main
from sarcompile.codegen.gpu_compile import compiler_available
from sarcompile.errors import GraphError
from sarcompile.data.loading import load_partition
from sarcompile.data.manifest import read_manifest

SRC = torch.tensor([0, 1, 2, 3, 4, 5, 5, 0])
DST = torch.tensor([1, 2, 0, 4, 5, 3, 5, 4])
N = 7  # node 6 is isolated


def node_data() -> dict[str, torch.Tensor]:
    return {"x": torch.arange(N * 2, dtype=torch.float32).reshape(N, 2), "train_mask": torch.arange(N) < 4}


def run_partition(edges, out, *extra) -> int:
    return main(["partition", "--edges", str(edges), "--parts", "2", "--out", str(out), *extra])


def check_loadable(out, num_nodes, num_edges, with_data=True):
    m = read_manifest(out)
    assert (m.num_parts, m.num_nodes, m.num_edges) == (2, num_nodes, num_edges)
    parts = [load_partition(out, rank=r, world_size=2) for r in range(2)]
    assert sum(p.graph.num_edges for p in parts) == num_edges
    if with_data:
        for p in parts:
            for key, t in node_data().items():
                assert torch.equal(p.node_data[key], t[p.global_ids])


def test_help_mentions_options(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["partition", "--help"])
    assert exit.value.code == 0
    text = capsys.readouterr().out
    assert "--parts" in text and "--edges" in text and ".csv" in text


def test_python_dash_m_help():
    result = subprocess.run(
        [sys.executable, "-m", "sarcompile", "partition", "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0 and "--parts" in result.stdout


def test_pt_file(tmp_path, capsys):
    path = tmp_path / "g.pt"
    torch.save({"src": SRC, "dst": DST, "num_nodes": N, **node_data()}, path)
    assert run_partition(path, tmp_path / "out", "--method", "contiguous", "--name", "toy") == 0
    printed = capsys.readouterr().out
    assert "partition 'toy'" in printed and "edge cut" in printed and " s" in printed
    check_loadable(tmp_path / "out", N, len(SRC))


def test_npz_file_without_num_nodes_takes_node_rows(tmp_path):
    path = tmp_path / "g.npz"
    np.savez(path, src=SRC.numpy(), dst=DST.numpy(), **{k: v.numpy() for k, v in node_data().items()})
    assert run_partition(path, tmp_path / "out", "--method", "random", "--seed", "4") == 0
    check_loadable(tmp_path / "out", N, len(SRC))
    assert read_manifest(tmp_path / "out").seed == 4


@pytest.mark.parametrize("header", ["src,dst\n", ""])
def test_csv_file(tmp_path, header):
    path = tmp_path / "g.csv"
    path.write_text(header + "".join(f"{u},{v}\n" for u, v in zip(SRC.tolist(), DST.tolist())))
    assert run_partition(path, tmp_path / "out") == 0
    check_loadable(tmp_path / "out", int(max(SRC.max(), DST.max())) + 1, len(SRC), with_data=False)
    assert read_manifest(tmp_path / "out").name == "g"


@pytest.mark.parametrize("header", ["dst,src\n", " DST , Src \n", "\ufeffdst,src\n"])
def test_csv_header_names_the_columns_in_either_order(tmp_path, header):
    path = tmp_path / "g.csv"
    path.write_text(header + "".join(f"{v},{u}\n" for u, v in zip(SRC.tolist(), DST.tolist())), encoding="utf-8")
    g, _ = load_edge_file(path)
    assert torch.equal(g.src, SRC) and torch.equal(g.dst, DST)  # by name, not by position


@pytest.mark.parametrize(
    "first, match",
    [
        ("1e3,2", "not a CSV of integer src,dst pairs"),  # a numeric line is data, never a header
        ("1.5,2", "not a CSV of integer src,dst pairs"),
        ("nan,inf", "not a CSV of integer src,dst pairs"),
        ("source,target", r"the header line 'source,target' does not name the columns src and dst"),
        ("src,src", "does not name the columns src and dst"),
        ("src,dst,w", "does not name the columns src and dst"),
    ],
)
def test_csv_first_line_is_never_guessed(tmp_path, capsys, first, match):
    path = tmp_path / "g.csv"
    path.write_text(first + "\n0,1\n1,2\n")
    with pytest.raises(GraphError, match=match):
        load_edge_file(path)
    assert run_partition(path, tmp_path / "out") == 2
    assert capsys.readouterr().err.startswith("sarcompile partition: error: ")


def write_bad(tmp_path, kind):
    if kind == "missing":
        return tmp_path / "nope.pt"
    if kind == "suffix":
        path = tmp_path / "g.txt"
        path.write_text("0 1\n")
    elif kind == "garbage_pt":
        path = tmp_path / "g.pt"
        path.write_bytes(b"not a torch file")
    elif kind == "no_dst":
        path = tmp_path / "g.pt"
        torch.save({"src": SRC}, path)
    elif kind == "bad_rows":
        path = tmp_path / "g.pt"
        torch.save({"src": SRC, "dst": DST, "num_nodes": N, "x": torch.zeros(N - 1)}, path)
    elif kind == "id_out_of_range":
        path = tmp_path / "g.npz"
        np.savez(path, src=np.array([0, 9]), dst=np.array([1, 2]), num_nodes=np.array(5))
    elif kind == "csv_text":
        path = tmp_path / "g.csv"
        path.write_text("src,dst\n0,1\n1,two\n")
    elif kind == "csv_columns":
        path = tmp_path / "g.csv"
        path.write_text("0,1,2\n")
    elif kind == "csv_empty":
        path = tmp_path / "g.csv"
        path.write_text("src,dst\n")
    return path


@pytest.mark.parametrize(
    "kind",
    [
        "missing", "suffix", "garbage_pt", "no_dst", "bad_rows",
        "id_out_of_range", "csv_text", "csv_columns", "csv_empty",
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, kind):
    path = write_bad(tmp_path, kind)
    assert run_partition(path, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.startswith("sarcompile partition: error: ") and err.count("\n") == 1
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_bad_parts_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as exit:
        main(["partition", "--edges", "g.pt", "--parts", "0", "--out", str(tmp_path)])
    assert exit.value.code == 2


def test_plan_command_prints_the_plan(tmp_path, capsys):
    import sarcompile as sc

    g = sc.Graph.from_edges(torch.randint(0, 200, (900,)), torch.randint(0, 200, (900,)), 200)
    sc.partition(g, 2, tmp_path / "parts", node_data={"x": torch.randn(200, 32)})
    spec = str(Path(__file__).resolve().parents[2] / "examples" / "train_sage.py") + ":SAGE"
    args = '{"in_dim": 32, "hidden": 16, "num_classes": 4, "dropout": 0.5}'
    assert main(["plan", spec, "--parts", str(tmp_path / "parts"), "--args", args, "--stage", "fuse",
                 "--dot", str(tmp_path / "plan.dot"), "--show-kernels"]) == 0
    out = capsys.readouterr().out
    assert "plan of SAGE: mode=sar, 2 workers" in out and "spmm(mean)" in out
    # --show-kernels; both layers narrow, so they aggregate their 16- and 4-wide projections (linear_first)
    assert "# ===== spmm_sum_width16" in out and "# ===== spmm_sum_width4" in out and "@triton.jit" in out
    assert "estimated memory per worker" in out and "program after fuse" in out
    assert (tmp_path / "plan.dot").read_text().startswith("digraph plan {")


@pytest.mark.skipif(compiler_available() is not None, reason=f"no CUDA compiler here: {compiler_available()}")
def test_plan_show_kernels_gpu_prints_each_kernels_resources(tmp_path, capsys):
    """``--show-kernels --gpu sm_90`` on the demo model: above each kernel's source, its
    registers, spills and shared memory on sm_90 per configuration. Run as a user would,
    with TRITON_INTERPRET=1 set (which cannot compile in-process: a child compiles),
    within a bounded time."""
    import sarcompile as sc

    g = sc.Graph.from_edges(torch.randint(0, 200, (900,)), torch.randint(0, 200, (900,)), 200)
    sc.partition(g, 2, tmp_path / "parts", node_data={"x": torch.randn(200, 32)})
    args = '{"in_dim": 32, "hidden": 16, "num_classes": 4, "dropout": 0.5}'
    out = run([sys.executable, "-m", "sarcompile", "plan", "examples/train_sage.py:SAGE", "--parts",
               str(tmp_path / "parts"), "--args", args, "--show-kernels", "--gpu", "sm_90"],
              timeout=180, TRITON_INTERPRET="1", SARCOMPILE_KERNEL_CACHE=str(tmp_path / "kernels"))
    for width in (16, 4):
        name = f"spmm_sum_width{width}_weight_cols0_float32"
        header, rest = out.split(f"# ===== {name}: used by ")[1].split("\n", 1)
        table, source = rest.split('"""', 1)
        assert table.startswith("# on sm_90 with int32 indices, per configuration:\n") and "@triton.jit" in source
        rows = table.splitlines()[1:]
        assert len(rows) == 4 and all(re.fullmatch(r"#  kernel +BLOCK_E=\d+, BLOCK_F=\d+, warps=\d +regs +\d+  "
                                                   r"spills 0  shared \d+ B", row) for row in rows), rows
    with pytest.raises(SystemExit):  # --gpu takes a known architecture
        main(["plan", "examples/train_sage.py:SAGE", "--parts", str(tmp_path / "parts"), "--show-kernels",
              "--gpu", "sm_70"])
    assert main(["plan", "examples/train_sage.py:SAGE", "--parts", str(tmp_path / "parts"), "--gpu", "sm_90"]) == 2
    assert "--gpu lists the resources of the kernels --show-kernels prints" in capsys.readouterr().err


def test_explain_says_how_each_layer_is_lowered_or_why_it_is_refused(tmp_path, capsys):
    spec = str(Path(__file__).resolve().parents[2] / "examples" / "train_sage.py") + ":SAGE"
    args = '{"in_dim": 8, "hidden": 16, "num_classes": 4, "dropout": 0.5}'
    assert main(["explain", spec, "--features", "8", "--args", args]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "SAGE, mode=sar: 2 graph ops; every other module and tensor operation runs as written, on each worker's "
        "own rows",
        "conv1:", "  spmm(mean) [node -> node]: direct, reused -- backward needs no remote inputs: send gradients to "
        "owners; the input is the call's and needs no grad: received in the first step only, then reused",
        "conv2:", "  spmm(mean) [node -> node]: direct -- backward needs no remote inputs: send gradients to owners",
    ]
    (tmp_path / "centered.py").write_text(
        "import torch\nimport sarcompile as sc\n\n"
        "class Centered(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.conv = sc.nn.SAGEConv(8, 8)\n\n"
        "    def forward(self, g, x):\n"
        "        h = self.conv(g, x)\n"
        "        return h - h.max(0).values\n"
    )
    assert main(["explain", f"{tmp_path / 'centered.py'}:Centered", "--features", "8"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("Centered cannot run distributed: ") and "centered.py" in out and "h.max(0)" in out


def test_plan_command_bad_model_spec(tmp_path, capsys):
    assert main(["plan", "no_such_module:make", "--parts", str(tmp_path)]) == 2
    assert "cannot import 'no_such_module'" in capsys.readouterr().err
    assert main(["plan", "not-a-spec", "--parts", str(tmp_path)]) == 2
    assert "MODULE:FACTORY" in capsys.readouterr().err


def test_plan_command_names_bad_arguments_widths_and_stages(tmp_path, capsys):
    """One line each, exit 2: --args that do not fit the factory, a model built for other
    widths than the partition's features, an unknown --stage."""
    import sarcompile as sc

    g = sc.Graph.from_edges(torch.randint(0, 200, (900,)), torch.randint(0, 200, (900,)), 200)
    parts = tmp_path / "parts"
    sc.partition(g, 2, parts, node_data={"x": torch.randn(200, 32)})
    spec = str(Path(__file__).resolve().parents[2] / "examples" / "train_sage.py") + ":SAGE"
    good = '{"in_dim": 32, "hidden": 16, "num_classes": 4, "dropout": 0.5}'

    def error(*argv) -> str:
        assert main(["plan", spec, *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("sarcompile plan: error: ") and len(err.splitlines()) == 1, err
        return err

    assert "missing a required argument: 'hidden'" in error("--parts", str(parts), "--args", '{"in_dim": 32}')
    assert "--args must be a JSON object" in error("--parts", str(parts), "--args", "[1]")
    wide = good.replace('"in_dim": 32', '"in_dim": 16')
    msg = error("--parts", str(parts), "--args", wide)
    assert "the model fails on example inputs shaped as the call's" in msg and "given: x [rows, 32]" in msg, msg
    msg = error("--parts", str(parts), "--args", good, "--stage", "bogus")
    assert "--stage bogus: no such pass; the passes are trace, lower, fuse" in msg, msg


# -- OGB datasets ----------------------------------------------------------------------------
def test_dataset_end_to_end(tmp_path):
    from ogb_files import write_ogbn_arxiv

    from sarcompile.data.loading import load_whole_graph

    written = write_ogbn_arxiv(tmp_path / "ogb")
    out = tmp_path / "parts"
    result = subprocess.run(
        [sys.executable, "-m", "sarcompile", "partition", "--dataset", "ogbn-arxiv", "--root", str(written.root),
         "--parts", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    printed = result.stdout
    assert "dataset ogbn-arxiv: symmetrized" in printed and "40 classes" in printed
    assert "30 train, 15 val, 15 test nodes" in printed
    assert "partition 'ogbn-arxiv'" in printed and "edge cut" in printed and "halo sizes" in printed
    assert "time: load" in printed and "partition + write" in printed and f"wrote 2 parts to {out}" in printed

    g, data = load_whole_graph(out)
    expected = written.symmetric_edge_set()
    assert set(zip(g.src.tolist(), g.dst.tolist())) == expected and g.num_edges == len(expected)
    assert torch.equal(data["x"], torch.tensor(written.x, dtype=torch.float32))
    assert data["y"].tolist() == written.y.tolist()
    assert sorted(torch.nonzero(data["val_mask"]).flatten().tolist()) == sorted(written.split["valid"].tolist())
    assert sum(load_partition(out, rank=r, world_size=2).graph.num_edges for r in range(2)) == len(expected)


def test_dataset_no_symmetrize_keeps_stored_edges(tmp_path, capsys):
    from ogb_files import write_ogbn_arxiv

    written = write_ogbn_arxiv(tmp_path / "ogb")
    args = ["--root", str(written.root), "--parts", "2", "--out", str(tmp_path / "out"), "--no-symmetrize"]
    assert main(["partition", "--dataset", "ogbn-arxiv", *args]) == 0
    assert "edges as OGB stores them" in capsys.readouterr().out
    assert read_manifest(tmp_path / "out").num_edges == len(written.edges)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--dataset", "ogbn-arxiv"], "needs --root DIR"),
        (["--dataset", "ogbn-foo", "--root", "{tmp}"], "choose one of ogbn-arxiv, ogbn-products, ogbn-papers100M, ogbn-mag"),
        (["--dataset", "ogbn-mag", "--root", "{tmp}"], "'{tmp}/ogbn_mag' does not exist; download http"),
        (["--dataset", "ogbn-mag", "--root", "{tmp}", "--symmetrize"], "--symmetrize applies to the homogeneous"),
        (["--edges", "g.pt", "--scale", "2"], "--scale applies only to --synthetic"),
        (["--dataset", "ogbn-arxiv", "--root", "{tmp}"], "'{tmp}/ogbn_arxiv' does not exist; download http"),
        (["--edges", "g.pt", "--root", "{tmp}"], "apply only to --dataset"),
    ],
)
def test_dataset_errors_are_one_line(tmp_path, capsys, argv, expected):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(["partition", *argv, "--parts", "2", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sarcompile partition: error: ") and err.count("\n") == 1
    assert expected.format(tmp=tmp_path) in err


@pytest.mark.parametrize("source", [[], ["--edges", "g.pt", "--dataset", "ogbn-arxiv"]])
def test_exactly_one_graph_source(tmp_path, source):
    with pytest.raises(SystemExit) as exit:
        main(["partition", *source, "--parts", "2", "--out", str(tmp_path)])
    assert exit.value.code == 2


def test_dgl_partition_without_dgl_says_so(tmp_path, capsys):
    """Reading DGL's files needs DGL; without it the error says what to install."""
    import importlib.util
    import json

    if importlib.util.find_spec("dgl") is not None:
        pytest.skip("DGL is installed here (tests/frontends/test_dgl_partition.py covers conversion)")
    config = tmp_path / "toy.json"
    config.write_text(json.dumps({"num_parts": 1, "num_nodes": 2, "num_edges": 1, "ntypes": {"_N": 0},
                                  "etypes": {"_N:_E:_N": 0}, "part-0": {"part_graph": "part0/graph.dgl"}}))
    assert main(["partition", "--dgl-partition", str(config), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sarcompile partition: error: ") and "needs DGL" in err


def test_parts_needed_without_dgl_partition(tmp_path, capsys):
    assert main(["partition", "--edges", "g.pt", "--out", str(tmp_path)]) == 2
    assert "--parts N is needed" in capsys.readouterr().err


def test_allocator_command_prints_the_library_to_preload(monkeypatch, capsys):
    monkeypatch.setattr("sarcompile.dist.memory.find_allocator", lambda name: f"/opt/lib/lib{name}.so.4")
    assert main(["allocator"]) == 0
    assert capsys.readouterr().out == "/opt/lib/libtcmalloc.so.4\n"
    assert main(["allocator", "jemalloc"]) == 0
    assert capsys.readouterr().out == "/opt/lib/libjemalloc.so.4\n"


def test_allocator_command_says_how_to_install_a_missing_one(monkeypatch, capsys):
    monkeypatch.setattr("sarcompile.dist.memory.find_allocator", lambda name: None)
    assert main(["allocator"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing for LD_PRELOAD=$(...) to pick up
    assert captured.err.startswith("sarcompile allocator: error: tcmalloc is not installed here")
    assert "apt install libtcmalloc-minimal4" in captured.err and "conda install" in captured.err
