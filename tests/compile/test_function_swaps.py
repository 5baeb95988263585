"""What tracing patches (sarcompile.compile.function_swaps): torch's size-taking factories
record a node when given a traced size; fx's table of wrapped functions loses what generated
code added, and keeps what modules registered; the names bound to a ruled function are found
by scanning a namespace, kept for modules' own globals until they or the rules change size."""

from __future__ import annotations

import sys

import torch
import torch.fx as fx
from torch.fx import _symbolic_trace

from sarcompile.compile import function_swaps
from sarcompile.compile.function_swaps import bound_originals, generated_wraps_dropped, sized_factory


def _proxy(name: str = "n") -> fx.Proxy:
    tracer = fx.Tracer()
    tracer.graph = fx.Graph()
    return fx.Proxy(tracer.graph.placeholder(name), tracer)


def test_a_factory_given_a_traced_size_records_a_node_and_runs_otherwise():
    ones = sized_factory(torch.ones)
    assert ones.__name__ == "ones"
    assert torch.equal(ones(2, 3), torch.ones(2, 3))
    for call in (lambda n: ones(n, 3), lambda n: ones((n, 3)), lambda n: ones(size=[3, n])):
        out = call(_proxy())
        assert isinstance(out, fx.Proxy) and out.node.op == "call_function" and out.node.target is torch.ones


def test_what_generated_code_adds_to_fxs_wrap_table_is_dropped_and_modules_keep_theirs():
    table = _symbolic_trace._wrapped_fns_to_patch
    generated = {"__name__": "fx-generated-code"}  # globals of no loaded module
    own = vars(sys.modules[__name__])
    before = dict(table)
    try:
        with generated_wraps_dropped():
            table[(id(generated), "f")] = generated
            table[(id(own), "g")] = own
        assert (id(generated), "f") not in table and table[(id(own), "g")] is own
        assert all(table[k] is v for k, v in before.items())  # what was there stays
    finally:
        table.pop((id(own), "g"), None)
        table.pop((id(generated), "f"), None)


def _ruled(*xs):
    return xs


def _other(*xs):
    return xs


RULES = {id(_ruled): (_ruled, _other)}


def test_names_bound_to_a_ruled_function_are_found_and_kept_for_a_module_until_it_changes(monkeypatch):
    monkeypatch.setattr(function_swaps, "_BOUND", {})
    module = vars(sys.modules[__name__])
    assert bound_originals(module, RULES) == ["_ruled"]
    assert id(module) in function_swaps._BOUND  # a module's own globals: kept
    monkeypatch.setitem(module, "also_ruled", _ruled)  # the module grew: scanned again
    assert bound_originals(module, RULES) == ["_ruled", "also_ruled"]
    more = RULES | {id(_other): (_other, _ruled)}  # the rules grew: scanned again
    assert bound_originals(module, more) == ["_ruled", "_other", "also_ruled"]

    frame = {"f": _ruled, "g": len}
    assert bound_originals(frame, RULES) == ["f"]
    assert id(frame) not in function_swaps._BOUND  # any other dict is scanned each time
