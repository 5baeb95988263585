"""What a failed trace tells the user (sarcompile.compile.trace_errors): each kind of failure
gets its own advice -- the control-flow advice only where Python control flow on a traced
value is the cause -- and the place is the layer fx was in and the user's innermost line."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from sarcompile.compile.trace_errors import AssignError, LengthUnknown, TorchScriptCalled, failure, user_line, where

CONTROL_FLOW = "so Python control flow may not depend on tensor values"
PROXY = fx.Proxy(fx.Graph().placeholder("x"))


@pytest.mark.parametrize("error, words, control_flow", [
    (fx.proxy.TraceError("symbolically traced variables cannot be used as inputs to control flow"),
     "symbolically traced variables cannot be used as inputs to control flow", True),
    (fx.proxy.TraceError("Proxy object cannot be iterated"), "a per-node tensor was iterated along its rows", True),
    (AssignError("h[mask] = v: the mask is not row-local"), "h[mask] = v: the mask is not row-local", False),
    (TypeError("'Proxy' object does not support item assignment"), "torch.where(mask, v, h)", False),
    (TorchScriptCalled("encoder.block"), "layer 'encoder.block' is a TorchScript module", False),
    (RuntimeError("Expected a value of type 'Tensor' for argument 'x' but instead found type 'Proxy'"),
     "a TorchScript function (torch.jit.script) was called with a traced tensor", False),
    (TypeError("float() argument must be a string or a real number, not 'Proxy'"),
     "was used as a Python number", False),
    (LengthUnknown(), "len() of a traced tensor", False),
    (RuntimeError("'len' is not supported in symbolic tracing by default"), "len() of a traced tensor", False),
    (KeyError(PROXY), "a dict or ModuleDict was indexed by a traced value (Proxy(x))", False),
    (KeyError("paper"), "KeyError 'paper': forward asked for a key", False),
    (AttributeError("'Graph' object has no attribute 'ndata'"),
     "AttributeError: 'Graph' object has no attribute 'ndata'. While tracing", False),
    (ValueError("shapes do not match"), "ValueError: shapes do not match, raised by forward", False),
])
def test_each_kind_of_failure_gets_its_own_advice(error, words, control_flow):
    text = failure(error)
    assert words in text
    assert (CONTROL_FLOW in text) == control_flow, text


def _raise_here():
    raise ValueError("boom")  # the line user_line names


def test_the_users_innermost_line_is_named():
    with pytest.raises(ValueError) as e:
        _raise_here()
    line = _raise_here.__code__.co_firstlineno + 1
    code = 'raise ValueError("boom")  # the line user_line names'
    assert user_line(e.value) == f", at test_trace_errors.py:{line}: `{code}`"
    assert user_line(ValueError("never raised")) == ""  # no traceback: no place


class _Tracer:
    def __init__(self, stack):
        self.module_stack = stack


def test_where_names_the_layer_fx_was_in_and_the_line():
    with pytest.raises(ValueError) as e:
        _raise_here()
    inner = {"": ("", None), "conv2": ("conv2", torch.nn.Linear)}  # the root, then the layer entered
    assert where(_Tracer(inner), e.value) == " in layer 'conv2' (Linear)" + user_line(e.value)
    assert where(_Tracer({"": ("", None)}), e.value) == user_line(e.value)  # at the root: no layer


def test_an_assignment_error_is_placed_at_its_traced_node():
    graph = fx.Graph()
    node = graph.placeholder("h")  # no source line recorded: the layer alone
    error = AssignError("not row-local", node)
    assert where(_Tracer({"lin": ("lin", torch.nn.Linear)}), error) == " in layer 'lin' (Linear)"
