"""Graph frames (sarcompile.graph.frames): ``ndata`` / ``edata`` of a one-type graph and a worker's
shard, ``G.nodes[t].data`` / ``G.edges[rel].data`` / ``G.ndata`` of a typed graph, rows
checked against the graph's counts, and the node data ``sc.load_partition`` puts on
``part.graph``'s frames: the worker's own rows, in its order."""

from __future__ import annotations

import pytest
import torch

import sarcompile as sc
from sarcompile.errors import GraphError

WRITES, CITES = ("author", "writes", "paper"), ("paper", "cites", "paper")


def _graph() -> sc.Graph:
    return sc.Graph.from_edges(torch.tensor([0, 1, 2, 3, 4]), torch.tensor([1, 2, 3, 4, 0]), 6)


def _hetero() -> sc.HeteroGraph:
    return sc.HeteroGraph.from_edges({WRITES: (torch.tensor([0, 1, 2]), torch.tensor([0, 0, 3])),
                                      CITES: (torch.tensor([0, 1]), torch.tensor([2, 3]))}, {"author": 3, "paper": 4})


def test_a_graphs_frames_hold_a_row_per_node_and_per_edge():
    g = _graph()
    x, w = torch.randn(6, 2), torch.randn(5)
    g.ndata["x"], g.edata["w"] = x, w
    assert g.ndata["x"] is x and g.edata["w"] is w and list(g.ndata) == ["x"] and "w" in g.edata
    with pytest.raises(GraphError, match=r"g.ndata\['y'\] has 5 rows but the graph has 6 nodes"):
        g.ndata["y"] = torch.ones(5)
    with pytest.raises(GraphError, match=r"g.edata\['v'\] has 6 rows but the graph has 5 edges"):
        g.edata["v"] = torch.ones(6)
    with pytest.raises(GraphError, match="takes a tensor"):
        g.ndata["z"] = [1.0] * 6
    del g.ndata["x"]
    assert len(g.ndata) == 0


def test_a_typed_graphs_frames_are_per_type_and_per_relation():
    hg = _hetero()
    p, a = torch.randn(4, 2), torch.randn(3, 2)
    hg.nodes["paper"].data["x"] = p
    hg.ndata["h"] = {"author": a}
    assert hg.nodes["paper"].data["x"] is p and hg.nodes["author"].data["h"] is a
    assert hg.ndata["x"] == {"paper": p} and sorted(hg.ndata) == ["h", "x"]
    w = torch.randn(3)
    hg.edges["writes"].data["w"] = w
    assert hg[WRITES].edata["w"] is w and hg.edata["w"] == {WRITES: w}
    with pytest.raises(GraphError, match=r"G.nodes\['author'\].data\['x'\] has 4 rows but the graph has 3 nodes"):
        hg.nodes["author"].data["x"] = p
    with pytest.raises(GraphError, match="no node type 'venue'"):
        hg.nodes["venue"].data["x"] = p


def test_load_partition_puts_the_node_data_on_the_shards_frames(tmp_path):
    g = _graph()
    x, y = torch.randn(6, 3), torch.arange(6)
    sc.partition(g, 2, tmp_path / "one", node_data={"x": x, "y": y})
    hg = _hetero()
    px = torch.randn(4, 2)
    sc.partition(hg, 2, tmp_path / "typed", node_data={"paper": {"x": px}, "author": {}})
    for rank in range(2):
        part = sc.load_partition(tmp_path / "one", rank=rank, world_size=2)
        assert sorted(part.graph.ndata) == ["x", "y"] and len(part.graph.edata) == 0
        assert torch.equal(part.graph.ndata["x"], x[part.global_ids])
        assert torch.equal(part.graph.ndata["y"], y[part.global_ids])
        typed = sc.load_partition(tmp_path / "typed", rank=rank, world_size=2)
        assert torch.equal(typed.graph.nodes["paper"].data["x"], px[typed.global_ids["paper"]])
        assert len(typed.graph.nodes["author"].data) == 0
        shard = part.graph  # edge frames: a row per edge of the shard, in its order
        shard.edata["w"] = torch.arange(g.num_edges)[shard.edge_ids.long()]
        with pytest.raises(GraphError, match="rows but the graph has"):
            shard.edata["v"] = torch.ones(g.num_edges + 1)
