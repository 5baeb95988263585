"""PyG's graph utilities while a layer is traced (sarcompile/frontends/pyg_utils.py): the
general lowering of message functions with several node tensors, ``index`` and PyG's
``softmax`` / ``scatter`` / ``degree``, checked against eager PyG on one machine (the PyG
zoo test runs the zoo's layers on 1, 2 and 3 workers)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

pytest.importorskip("torch_geometric")
import torch_geometric.nn as gnn  # noqa: E402
from torch_geometric.nn import MessagePassing  # noqa: E402
from torch_geometric.utils import degree, scatter, softmax  # noqa: E402

import sarcompile as sc  # noqa: E402

DT = torch.float64


def _graph() -> tuple[torch.Tensor, torch.Tensor, int]:
    # isolated node 5, a self-loop on 2, a duplicate edge 0->1 and a hub 3
    src = torch.tensor([0, 0, 1, 2, 2, 4, 1, 0, 4, 3, 3, 3])
    dst = torch.tensor([1, 1, 2, 2, 0, 3, 3, 3, 0, 1, 2, 4])
    return src, dst, 7


class Attend(MessagePassing):
    """Several node tensors on both ends, an edge tensor, ``index`` into PyG's softmax."""

    def __init__(self, aggr="add"):
        super().__init__(aggr=aggr)
        self.q, self.k = nn.Linear(4, 3), nn.Linear(4, 3)
        self.e = nn.Linear(2, 3)

    def forward(self, x, edge_index, edge_attr):
        return self.propagate(edge_index, x=x, q=self.q(x), k=self.k(x), edge_attr=edge_attr)

    def message(self, x_j, q_i, k_j, edge_attr, index, ptr, size_i):
        score = (q_i * (k_j + self.e(edge_attr))).sum(-1, keepdim=True)
        return softmax(score, index, ptr, size_i) * x_j


class Normalised(MessagePassing):
    """``scatter`` and ``degree`` over ``edge_index[1]`` in forward, then a plain message."""

    def forward(self, x, edge_index):
        row, col = edge_index
        deg = degree(col, x.size(0), dtype=x.dtype).clamp(min=1).unsqueeze(-1)
        return self.propagate(edge_index, x=x) / deg

    def message(self, x_j, x_i):
        return x_j * torch.tanh(x_i)

    def aggregate(self, inputs, index, dim_size=None):
        return scatter(inputs, index, 0, dim_size, "max") + scatter(inputs, index, 0, dim_size, "mul")


class Wrap(nn.Module):
    def __init__(self, layer: nn.Module, edge: bool = False):
        super().__init__()
        self.layer, self.edge = layer, edge

    def forward(self, x, edge_index, edge_attr=None):
        return self.layer(x, edge_index, edge_attr) if self.edge else self.layer(x, edge_index)


def _check(model: nn.Module, edge: bool = False) -> None:
    src, dst, n = _graph()
    torch.manual_seed(1)
    model = model.to(DT)
    x = torch.randn(n, 4, dtype=DT)
    e = torch.randn(src.numel(), 2, dtype=DT) if edge else None

    def run(m, graph):
        xi = x.clone().requires_grad_(True)
        ei = None if e is None else e.clone().requires_grad_(True)
        out = m(xi, graph, ei) if edge else m(xi, graph)
        (out * torch.arange(out.numel(), dtype=DT).reshape(out.shape).sin()).sum().backward()
        grads = [p.grad for p in m.parameters()]
        return out, xi.grad, None if ei is None else ei.grad, grads

    compiled = sc.distribute(copy.deepcopy(model))
    want = run(model, torch.stack([src, dst]))
    got = run(compiled, sc.Graph.from_edges(src, dst, n))
    for w, g in zip(want[:3], got[:3]):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    for w, g in zip(want[3], got[3]):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("aggr", ["add", "mean", "max", "min", "mul", ["sum", "max"], gnn.aggr.StdAggregation(),
                                  gnn.aggr.SoftmaxAggregation(learn=True), gnn.aggr.PowerMeanAggregation(learn=True),
                                  gnn.aggr.VarAggregation()])
def test_message_with_several_node_tensors_and_softmax_matches_pyg(aggr):
    _check(Wrap(Attend(aggr), edge=True), edge=True)


def test_scatter_degree_and_overridden_aggregate_match_pyg():
    _check(Wrap(Normalised()))


def test_edge_index_used_as_a_tensor_is_refused():
    class Gather(MessagePassing):
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j, index):
            return x_j * index.unsqueeze(-1)  # arithmetic on the destination ids

    src, dst, n = _graph()
    with pytest.raises(sc.CompileError, match=r"edge_index\[1\].*used as a tensor"):
        sc.distribute(Wrap(Gather()))(torch.randn(n, 4), sc.Graph.from_edges(src, dst, n))


def test_scatter_onto_sources_is_refused():
    class Out(MessagePassing):
        def forward(self, x, edge_index):
            row, col = edge_index
            return self.propagate(edge_index, x=x) + scatter(x, row)

        def message(self, x_j):
            return x_j

    src, dst, n = _graph()
    with pytest.raises(sc.CompileError, match="source nodes"):
        sc.distribute(Wrap(Out()))(torch.randn(n, 4), sc.Graph.from_edges(src, dst, n))
