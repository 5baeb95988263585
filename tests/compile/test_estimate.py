"""What-if estimates: the partition model, exact rows from real partitions, the table."""

from __future__ import annotations

import pytest
import torch

import sarcompile as sc
from sarcompile.compile.estimate import model_workers
from sarcompile.plan.sizes import worker_stats
from cases import MixModel


def _graph(n=3000, e=30000, seed=0) -> sc.Graph:
    gen = torch.Generator().manual_seed(seed)
    return sc.Graph.from_edges(torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen), n)


@pytest.mark.parametrize("num_parts", [2, 4, 8])
def test_partition_model_matches_random_partitions(num_parts):
    g = _graph()
    modelled = model_workers(g, num_parts)[0]
    real = worker_stats(g, num_parts, method="random", seed=1)
    mean_halo = sum(sum(w.halo) for w in real) / (num_parts * (num_parts - 1))
    assert modelled.halo[1] == pytest.approx(mean_halo, rel=0.05)
    assert modelled.nodes == -(-g.num_nodes // num_parts)


def test_metis_halos_are_below_the_model_on_a_clustered_graph():
    # Two communities with few edges between them: METIS finds them, the model cannot.
    gen = torch.Generator().manual_seed(0)
    n = 2000
    src = torch.randint(0, n // 2, (20000,), generator=gen) + (torch.rand(20000, generator=gen) < 0.5) * (n // 2)
    dst = src % (n // 2) + (src >= n // 2) * (n // 2)
    dst = (dst + torch.randint(0, 50, (20000,), generator=gen)) % (n // 2) + (src >= n // 2) * (n // 2)
    g = sc.Graph.from_edges(src, dst, n)
    metis = worker_stats(g, 2, method="metis")
    assert sum(metis[0].halo) < 0.1 * model_workers(g, 2)[0].halo[1]


def test_estimate_table_rows_and_exact_rows(tmp_path, capsys):
    g = _graph(n=800, e=6000)
    x = torch.zeros(1, 6)
    sc.partition(g, 2, tmp_path, node_data={"x": torch.zeros(g.num_nodes, 6)}, method="random")
    table = sc.estimate(MixModel(), g, num_parts=[1, 2, 4, 16], modes=["sar", "stash", "oneshot"], x=x,
                        partitions={2: tmp_path})
    printed = capsys.readouterr().out
    assert "workers" in printed and "partition" in printed and "model" in printed
    assert len(table.rows) == 12
    assert [r.exact for r in table.rows if r.mode == "sar"] == [False, True, False, False]
    # The exact row is the plan of the real partition's largest worker.
    plan = sc.distribute(MixModel()).plan(tmp_path)
    assert table.peak(2, "sar") == max(e.peak_bytes for e in plan.memory_estimate())
    # Memory falls with the worker count; sar never needs more than the baselines.
    sar = [table.peak(n, "sar") for n in (1, 2, 4, 16)]
    assert sar == sorted(sar, reverse=True)
    for n in (2, 4, 16):
        assert table.peak(n, "sar") <= table.peak(n, "stash") == table.peak(n, "oneshot")
    table.plot(tmp_path / "estimate.png")
    assert (tmp_path / "estimate.png").stat().st_size > 1000


def test_estimate_needs_an_example_input():
    with pytest.raises(ValueError, match="example input"):
        sc.estimate(MixModel(), _graph(n=50, e=100), num_parts=[2], show=False)


def test_typed_estimates_model_each_relation_and_node_tables(tmp_path):
    """A typed graph: each relation's halo under the model is its source type's, as a real
    random partition gives it; the estimate counts a worker's share of the node tables
    and falls with the worker count; a real partition's row is its plan's."""
    from sarcompile.data.synthetic import mag_like

    # (2001 authors: a worker's share rounds up, and the tables are still found by the true count)
    g = mag_like(num_papers=1500, num_authors=2001, num_institutions=60, num_fields=120, seed=0).graph
    for rel in (("author", "writes", "paper"), ("paper", "cites", "paper")):
        modelled = model_workers(g, 4)[0].relations[rel]
        real = worker_stats(g, 4, method="random", seed=1)
        mean_halo = sum(sum(w.relations[rel].halo) for w in real) / 12
        assert modelled.halo[1] == pytest.approx(mean_halo, rel=0.05), rel

    class Tables(torch.nn.Module):  # featureless authors, a table of 16 per author
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.ModuleDict({"author": torch.nn.Embedding(g.num_nodes("author"), 16)})
            self.lin = torch.nn.Linear(16, 8)

        def forward(self, g, x):
            return {"paper": self.lin(sc.spmm(g["writes"], self.emb["author"].weight, "mean")) + x["paper"][:, :8]}

    x = {"paper": torch.zeros(1, 8)}
    sc.partition(g, 2, tmp_path, node_data={"paper": {"x": torch.zeros(g.num_nodes("paper"), 8)}}, method="random")
    table = sc.estimate(Tables(), g, num_parts=[1, 2, 4], modes=["sar"], x=x, partitions={2: tmp_path}, show=False)
    peaks = [table.peak(n, "sar") for n in (1, 2, 4)]
    assert peaks == sorted(peaks, reverse=True)
    one = max(table.rows, key=lambda r: r.peak_bytes).worst.breakdown
    assert one["node_tables"] == g.num_nodes("author") * 16 * 4 * 2  # all rows on one worker, and their gradient
    assert one["parameters"] == (16 * 8 + 8) * 4  # the table is not a replicated parameter
    plan = sc.distribute(Tables()).plan(tmp_path)
    assert table.peak(2, "sar") == max(e.peak_bytes for e in plan.memory_estimate())
