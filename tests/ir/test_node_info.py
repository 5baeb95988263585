"""The node record: defaults where nothing was written, writes that keep the other fields,
and copies (fx's and the passes') that a later write on one node leaves apart."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import fx

from sarcompile.ir.node_info import KEY, NodeInfo, inherit, info, set_info
from sarcompile.ir.vocab import Residency


def _graph() -> tuple[fx.Graph, fx.Node, fx.Node]:
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.relu, (x,))
    g.output(y)
    return g, x, y


def test_a_node_nothing_was_recorded_on_reads_the_defaults_and_is_left_unchanged():
    _, x, _ = _graph()
    assert info(x) == NodeInfo() and info(x).residency is None and info(x).row_axis == 0
    assert KEY not in x.meta  # reading writes nothing


def test_a_write_keeps_the_fields_written_before_and_an_unknown_field_is_refused():
    _, x, _ = _graph()
    set_info(x, residency=Residency.NODE, table="emb")
    set_info(x, row_axis=1)
    assert (info(x).residency, info(x).table, info(x).row_axis) == (Residency.NODE, "emb", 1)
    with pytest.raises(TypeError):
        set_info(x, residencey=Residency.NODE)


def test_a_constant_traced_as_none_is_told_from_no_constant():
    _, x, y = _graph()
    set_info(x, constant=(None,))
    assert info(x).constant == (None,) and info(y).constant is None


def test_a_write_after_a_shallow_meta_copy_leaves_the_original_as_it_was():
    g, x, y = _graph()
    set_info(y, residency=Residency.NODE, layer="conv")
    with g.inserting_after(y):
        copied = g.node_copy(y, lambda n: n)  # fx copies meta shallowly
    updated = g.call_function(torch.relu, (x,))
    updated.meta.update(y.meta)  # as the passes do for a node they replace
    set_info(copied, residency=Residency.CONST)
    set_info(updated, layer="other")
    assert (info(y).residency, info(y).layer) == (Residency.NODE, "conv")
    assert (info(copied).residency, info(copied).layer) == (Residency.CONST, "conv")
    assert (info(updated).residency, info(updated).layer) == (Residency.NODE, "other")


def test_a_deep_copied_module_keeps_the_record():
    g, _, y = _graph()
    set_info(y, residency=Residency.EDGE, fused=["a", "b"])
    gm = copy.deepcopy(fx.GraphModule(torch.nn.Module(), g))
    (relu,) = [n for n in gm.graph.nodes if n.target is torch.relu]
    assert info(relu).residency is Residency.EDGE and info(relu).fused == ["a", "b"]


def test_inherit_copies_only_what_the_source_recorded_as_dict_update_did():
    _, x, y = _graph()
    set_info(x, layer="conv", row_axis=1)
    set_info(y, layer_type="SAGEConv", residency=Residency.NODE, user_frame=("m.py", 3))
    inherit(y, x, ("layer", "layer_type", "row_axis", "user_frame"))
    # x's layer and axis come over; y's own type and frame, which x never recorded, stay
    assert (info(y).layer, info(y).layer_type, info(y).row_axis) == ("conv", "SAGEConv", 1)
    assert (info(y).residency, info(y).user_frame) == (Residency.NODE, ("m.py", 3))
    assert info(x).layer_type is None  # the source is unchanged
