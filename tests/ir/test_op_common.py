"""What the IR op families share (sarcompile.ir.op_common): the checks of the graph and row
arguments, each naming the problem and the fix, and a whole graph run as one worker's shard
with edge tensors put in CSR (by destination) order and back."""

from __future__ import annotations

import pytest
import torch

import sarcompile as sc
from sarcompile.graph.shard import ShardGraph
from sarcompile.ir.op_common import _check_rows, _from_csr_order, _graph_kind, _one_node_set, _single, _to_csr_order

SRC, DST = torch.tensor([0, 3, 1, 2, 0]), torch.tensor([2, 0, 2, 1, 0])


def _g() -> sc.Graph:
    return sc.Graph.from_edges(SRC, DST, 4)


def test_an_op_takes_a_graph_and_says_how_to_build_one():
    _graph_kind(_g())
    with pytest.raises(sc.GraphError, match=r"must be a sarcompile Graph .*got Tensor; build one with sc.Graph"):
        _graph_kind(torch.zeros(2, 2))


def test_rows_are_checked_against_what_the_graph_needs():
    _check_rows(_g(), torch.zeros(4, 3), "x", 4)
    with pytest.raises(sc.GraphError, match="^x has 5 rows but the graph needs 4$"):
        _check_rows(_g(), torch.zeros(5, 3), "x", 4)


def test_a_relation_between_two_node_types_is_refused_where_one_tensor_holds_both_ends():
    _one_node_set(_g(), "message_passing")
    bipartite = sc.Graph(torch.tensor([0, 1]), torch.tensor([1, 0]), 2, num_src_nodes=3)
    with pytest.raises(sc.GraphError, match="message_passing reads source and destination rows from one tensor"):
        _one_node_set(bipartite, "message_passing")


def test_edges_go_to_csr_order_and_back():
    g = _g()
    w = torch.tensor([10.0, 11.0, 12.0, 13.0, 14.0])  # one value per edge, in the order given
    csr = _to_csr_order(g, w)
    # by destination, ties (edges 0 and 2 into node 2; 1 and 4 into node 0) in the order given
    assert csr.tolist() == [11.0, 14.0, 13.0, 10.0, 12.0]
    assert torch.equal(_from_csr_order(g, csr), w)
    assert _to_csr_order(g, None) is None


def test_a_whole_graph_runs_as_the_one_shard_of_one_worker_made_once():
    g = _g()
    shard = _single(g)
    assert isinstance(shard, ShardGraph) and shard is _single(g)
    assert (shard.rank, shard.world_size, shard.num_nodes) == (0, 1, 4)
