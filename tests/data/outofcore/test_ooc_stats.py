"""sarcompile.data.outofcore.edge_stats and `sarcompile estimate`: the estimate of a graph read
from its edge files is the estimate of the same graph in memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from test_ooc_multilevel import edge_lists

import sarcompile as sc
from sarcompile.cli.main import main
from sarcompile.graph.stats import GraphStats
from sarcompile.data.outofcore import edge_stats, open_edges
from sarcompile.train import GNN


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(graph=edge_lists())
def test_edge_stats_are_the_graphs(tmp_path, graph):
    n, src, dst = graph
    np.save(tmp_path / "s.npy", src), np.save(tmp_path / "d.npy", dst)
    got = edge_stats(open_edges(tmp_path / "s.npy", tmp_path / "d.npy", n), chunk_edges=7)
    want = GraphStats.of(sc.Graph.from_edges(torch.from_numpy(src), torch.from_numpy(dst), n))
    assert (got.num_nodes, got.num_edges, got.self_loops) == (want.num_nodes, want.num_edges, want.self_loops)
    assert torch.equal(got.out_degree_counts, want.out_degree_counts)


def test_cli_estimate_matches_sc_estimate_and_uses_a_partition(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n = 3000
    src, dst = rng.integers(0, n, 30_000), rng.integers(0, n, 30_000)
    np.save(tmp_path / "s.npy", src), np.save(tmp_path / "d.npy", dst)
    g = sc.Graph.from_edges(torch.from_numpy(src), torch.from_numpy(dst), n)
    sc.partition(g, 4, tmp_path / "p4", node_data={"x": torch.zeros(n, 16)})
    args = {"model": "sage", "in_dim": 16, "num_classes": 5, "layers": 3, "hidden": 32}
    want = sc.estimate(GNN(**args), g, num_parts=[2, 4, 16], modes=["sar"], x=torch.zeros(1, 16),
                       partitions={4: tmp_path / "p4"}, show=False)
    argv = ["estimate", "sarcompile.train:GNN", "--args", '{"model": "sage", "in_dim": 16, "num_classes": 5, '
            '"layers": 3, "hidden": 32}', "--edges", f"{tmp_path / 's.npy'},{tmp_path / 'd.npy'}",
            "--num-nodes", str(n), "--features", "16", "--workers", "2", "16", "--partition", f"4={tmp_path / 'p4'}"]
    for part in (tmp_path / "p4").glob("part-*.pt"):  # the plan of a partition reads only its manifest
        part.unlink()
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert str(want) in printed and "4        partition" in printed
    assert main([*argv[:-2], "--partition", f"8={tmp_path / 'p4'}"]) == 2
    assert "holds 4 parts of a graph of 3000 nodes" in capsys.readouterr().err


@pytest.mark.parametrize("bad, message", [(["--edges", "a.npy"], "give two .npy files"),
                                          (["--args", "{"], "--args is not JSON")])
def test_cli_estimate_refuses_bad_arguments(tmp_path, capsys, bad, message):
    base = ["estimate", "sarcompile.train:GNN", "--edges", "a.npy,b.npy", "--num-nodes", "5", "--features", "3"]
    assert main(base + bad) == 2
    assert message in capsys.readouterr().err
