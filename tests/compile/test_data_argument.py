"""A PyG ``Data`` argument (sarcompile.compile.data_argument): its graph is its ``edge_index``
once that is a sarcompile graph; PyG's tensor ``edge_index`` is converted once per tensor into
a shallow copy (the caller's Data untouched); its tensors and graph are the program's inputs."""

from __future__ import annotations

import torch
from torch_geometric.data import Data, HeteroData

import sarcompile as sc
from sarcompile.compile.data_argument import data_graph, data_keys, is_data, rebuilt_data, with_graph

EDGE_INDEX = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]])


def test_only_a_data_is_one():
    assert is_data(Data(x=torch.zeros(3, 2)))
    assert not is_data(HeteroData()) and not is_data({"x": torch.zeros(3, 2)})


def test_the_graph_of_a_data_is_its_edge_index_once_it_is_a_graph():
    g = sc.Graph.from_edges(EDGE_INDEX[0], EDGE_INDEX[1], 3)
    assert data_graph(Data(x=torch.zeros(3, 2), edge_index=g)) is g
    assert data_graph(Data(x=torch.zeros(3, 2), edge_index=EDGE_INDEX)) is None  # not converted yet
    assert data_graph(Data(x=torch.zeros(3, 2))) is None and data_graph(g) is None


def test_a_tensor_edge_index_is_converted_once_into_a_copy():
    data = Data(x=torch.randn(3, 2), edge_index=EDGE_INDEX)
    converted: dict = {}
    out = with_graph(data, converted, keep=8)
    assert out is not data and data.edge_index is EDGE_INDEX  # the caller's Data as it was
    graph = out.edge_index
    assert isinstance(graph, sc.Graph) and graph.num_nodes == 3
    assert graph.src.tolist() == [0, 1, 2, 2] and graph.dst.tolist() == [1, 2, 0, 1]
    assert out.x is data.x  # a shallow copy: the features are the caller's tensors
    assert with_graph(data, converted, keep=8).edge_index is graph  # once per edge_index tensor
    assert with_graph(out, converted, keep=8) is out  # already a graph: as it is
    plain = torch.randn(3, 2)
    assert with_graph(plain, converted, keep=8) is plain


def test_the_conversions_kept_are_the_last_few():
    converted: dict = {}
    edge_indexes = [EDGE_INDEX.clone() for _ in range(5)]
    for e in edge_indexes:
        with_graph(Data(x=torch.zeros(3, 1), edge_index=e), converted, keep=2)
    kept = [tensor for tensor, _ in converted.values()]
    assert len(kept) == 2 and kept[0] is edge_indexes[3] and kept[1] is edge_indexes[4]


def test_tensors_and_the_graph_are_inputs_and_come_back_as_a_data():
    g = sc.Graph.from_edges(EDGE_INDEX[0], EDGE_INDEX[1], 3)
    data = Data(x=torch.randn(3, 2), edge_index=g, y=torch.tensor([0, 1, 1]), name="toy", num_classes=2)
    keys = data_keys(data)
    assert set(keys) == {"x", "edge_index", "y"}  # not the plain attributes
    rebuilt = rebuilt_data(keys, [getattr(data, k) for k in keys])
    assert is_data(rebuilt) and all(getattr(rebuilt, k) is getattr(data, k) for k in keys)
