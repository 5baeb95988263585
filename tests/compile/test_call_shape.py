"""How a call is described to the compiler (sarcompile.compile.call_shape.CallShape.of_call):
where the graph argument is, the plain Python arguments traced as their values, and which
tensors are per node, per edge or the same on every worker -- by their row counts against
the graph's, with ``edge`` in the name deciding when the two counts are equal."""

from __future__ import annotations

import torch
from torch import nn

import sarcompile as sc
from sarcompile.compile.call_shape import CallShape
from sarcompile.compile.leaves import Constant
from sarcompile.ir.probe import Input
from sarcompile.ir.vocab import Residency

NODE, EDGE, CONST, GRAPH = Residency.NODE, Residency.EDGE, Residency.CONST, Residency.GRAPH


def _graph(nodes: int, edges: int) -> sc.Graph:
    src = torch.arange(edges) % nodes
    return sc.Graph.from_edges(src, (src + 1) % nodes, nodes)


class FeaturesFirst(nn.Module):
    def forward(self, x, g, w=None, training: bool = True, k: int = 2):
        return x


def _shape(*args, graph_input=1, **kwargs) -> CallShape:
    return CallShape.of_call(FeaturesFirst().forward, args, kwargs, graph_input)


def test_the_graph_argument_is_where_the_call_says_by_position_or_keyword():
    g, x = _graph(5, 8), torch.randn(5, 3)
    by_position = _shape(x, g)
    assert by_position.graph_input == 1
    assert dict(by_position.inputs)["g"] == Input(GRAPH)
    by_keyword = CallShape.of_call(FeaturesFirst().forward, (x,), {"g": g}, "g")
    assert by_keyword.graph_input == "g" and dict(by_keyword.inputs)["g"] == Input(GRAPH)
    # the features are per node either way: their rows are the graph's nodes
    assert dict(by_position.inputs)["x"] == dict(by_keyword.inputs)["x"] == Input(NODE, (5, 3), torch.float32,
                                                                                 alternatives=(CONST,))


def test_a_graph_with_adjacency_values_is_an_input_with_their_dtype():
    adj = torch.tensor([[0.0, 0.5], [2.0, 0.0]], dtype=torch.float64).to_sparse()
    g = sc.Graph.from_adjacency(adj)
    assert g.adj_values is not None  # the oracle's premise: values other than 1 are kept
    assert dict(_shape(torch.randn(2, 3), g).inputs)["g"] == Input(GRAPH, dtype=torch.float64)


def test_plain_arguments_are_constants_given_or_by_default():
    g, x = _graph(5, 8), torch.randn(5, 3)
    shape = _shape(x, g, training=False)
    # every plain parameter, in the signature's order: the given False, the defaults None and 2
    assert shape.constants == (("w", Constant(None)), ("training", Constant(False)), ("k", Constant(2)))
    inputs = dict(shape.inputs)
    assert inputs["training"] == Input(CONST, value=False) and inputs["k"] == Input(CONST, value=2)
    assert shape.specialised() == {"w": Constant(None), "training": Constant(False), "k": Constant(2)}
    # another value is another program; True and 1 are two (the traced code may tell them apart)
    assert _shape(x, g, training=True) != shape
    assert _shape(x, g, k=1) != _shape(x, g, k=True)
    assert _shape(x, g, k=2) == _shape(x, g)  # the default given explicitly is the same call


def test_tensor_inputs_are_per_node_per_edge_or_the_same_everywhere_by_their_rows():
    g = _graph(5, 8)

    def where(w: torch.Tensor) -> Input:
        return dict(_shape(torch.randn(5, 3), g, w).inputs)["w"]

    assert where(torch.randn(5, 2)) == Input(NODE, (5, 2), torch.float32, alternatives=(CONST,))
    assert where(torch.randn(8)) == Input(EDGE, (8,), torch.float32, alternatives=(CONST,))
    # neither count: the same on every worker, with its shape for the probe
    assert where(torch.randn(4, 3)) == Input(CONST, (4, 3), torch.float32)
    assert where(torch.tensor(2.0)) == Input(CONST, (), torch.float32)
    assert where(torch.ones(5, dtype=torch.int64)).dtype == torch.int64


class Named(nn.Module):
    def forward(self, g, h, edge_attr):
        return h


def test_when_nodes_and_edges_are_as_many_the_name_decides_and_the_other_stays_possible():
    g = _graph(6, 6)
    assert g.num_nodes == g.num_edges == 6
    inputs = dict(CallShape.of_call(Named().forward, (g, torch.randn(6, 4), torch.randn(6, 2)), {}, 0).inputs)
    assert inputs["h"] == Input(NODE, (6, 4), torch.float32, alternatives=(EDGE, CONST))
    assert inputs["edge_attr"] == Input(EDGE, (6, 2), torch.float32, alternatives=(NODE, CONST))
