"""The graphs of a call (sarcompile.compile.call_graphs.find_graphs): in an argument, by
position or keyword, and kept on the model's modules by attribute path; a sparse adjacency
converted once to the graph of the same edges; no graph, or shards mixed with whole graphs,
refused saying where sarcompile looked and what to give."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import sarcompile as sc
from sarcompile.compile.call_graphs import find_graphs, first_graph, is_graph
from sarcompile.graph.shard import ShardGraph, split_graph

G = sc.Graph.from_edges(torch.tensor([0, 1, 2, 3]), torch.tensor([2, 3, 0, 1]), 4)


def _shard() -> ShardGraph:
    return ShardGraph.from_part(split_graph(G, torch.tensor([0, 0, 1, 1]), 2)[0], 0, 2, 4, 4)


class Keeps(nn.Module):
    def __init__(self, **graphs):
        super().__init__()
        self.inner = nn.Module()
        for name, g in graphs.items():
            setattr(self.inner, name, g)
        self._private = G  # not a kept graph: private attributes are the model's business


def test_what_counts_as_a_graph():
    assert is_graph(G) and is_graph([G, G]) and is_graph((G,))
    assert not is_graph([]) and not is_graph([G, torch.zeros(1)]) and not is_graph(torch.zeros(2, 2))
    assert first_graph([G, _shard()]) is G and first_graph(torch.zeros(1)) is None


def test_the_graph_argument_is_found_by_position_or_keyword():
    x = torch.randn(4, 3)
    assert find_graphs(nn.Module(), (x, G), {}, {}).where == 1
    by_keyword = find_graphs(nn.Module(), (x,), {"g": G}, {})
    assert by_keyword.where == "g" and by_keyword.first is G and not by_keyword.partitioned
    assert find_graphs(nn.Module(), ([G, G], x), {}, {}).where == 0  # a list of graphs: DGL's blocks


def test_graphs_kept_on_the_model_are_found_by_path_and_private_ones_are_not():
    found = find_graphs(Keeps(g=G, blocks=[G, G]), (torch.randn(4, 3),), {}, {})
    assert found.where is None and set(found.kept) == {"inner.g", "inner.blocks"} and found.first is G


def test_shards_are_partitioned_and_may_not_be_mixed_with_whole_graphs():
    shard = _shard()
    assert find_graphs(Keeps(g=shard), (shard,), {}, {}).partitioned
    with pytest.raises(sc.CompileError) as e:
        find_graphs(Keeps(g=G), (shard,), {}, {})
    assert "a worker's shards (argument 0) and whole graphs (self.inner.g)" in str(e.value)
    assert "model.inner.g = part.graph" in str(e.value)


def test_no_graph_says_where_it_looked():
    with pytest.raises(sc.CompileError, match="no graph: sarcompile looked in forward's arguments"):
        find_graphs(nn.Module(), (torch.randn(4, 3),), {}, {})


def _adjacency() -> torch.Tensor:
    # adj_t as PyG's ToSparseTensor makes it: row v, column u for an edge u -> v
    return torch.sparse_coo_tensor(torch.stack([G.dst, G.src]), torch.ones(4), (4, 4)).coalesce()


def test_a_sparse_adjacency_is_converted_once_to_the_graph_of_its_edges():
    adj, converted = _adjacency(), {}
    first = find_graphs(nn.Module(), (torch.randn(4, 3), adj), {}, converted)
    graph = first.args[1]
    assert isinstance(graph, sc.Graph) and first.where == 1 and graph.adj_values is None  # ones, no self-loops
    assert sorted(zip(graph.src.tolist(), graph.dst.tolist())) == sorted(zip(G.src.tolist(), G.dst.tolist()))
    again = find_graphs(nn.Module(), (torch.randn(4, 3), adj), {}, converted)
    assert again.args[1] is graph  # the same object: a program keyed by it is reused


def test_conversions_kept_are_bounded_and_keyed_by_the_object_itself():
    converted: dict = {}
    adjacencies = [_adjacency() for _ in range(12)]
    for adj in adjacencies:
        find_graphs(nn.Module(), (adj,), {}, converted)
    kept = [value for value, _ in converted.values()]
    assert len(kept) == 8 and all(k is a for k, a in zip(kept, adjacencies[4:]))  # the last 8, oldest first
    impostor = _adjacency()
    converted[id(impostor)] = (object(), "a graph of another object that had this id")
    assert isinstance(find_graphs(nn.Module(), (impostor,), {}, converted).args[0], sc.Graph)


def test_an_adjacency_whose_values_require_grad_is_refused():
    adj = _adjacency().requires_grad_()
    with pytest.raises(sc.CompileError, match=r"values require grad.*adj_t.detach\(\)"):
        find_graphs(nn.Module(), (adj,), {}, {})
