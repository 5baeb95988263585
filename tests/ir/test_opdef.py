"""What an IR op is (ir/opdef.py): ``ir_op`` registers a definition whose checks run on the
constant arguments (without the passes' keywords) eagerly and at trace time, and whose op
is one fx node; ``OpDef`` binds arguments, describes, reports its exchange kind and refuses
to run without an implementation; and the exchange descriptions of the real ops agree
with autograd: a backward that reads remote rows is one whose wanted gradients depend on
the values sent, and every sent argument whose gradient is wanted has its gradients pushed."""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch
import torch.fx

import sarcompile as sc
from sarcompile.errors import CompileError, GraphError
from sarcompile.ir import opdef
from sarcompile.ir.opdef import PASS_KEYWORDS, AllReduce, Halo, OpDef, Push, definition, ir_op, registry, row_bytes
from sarcompile.ir.vocab import Exchange, Residency, Strategy

DT = torch.float64


@pytest.fixture
def toy(monkeypatch):
    """A toy op, defined into a copy of the registry (the real one stays as it was), and
    the constant arguments its check saw."""
    monkeypatch.setattr(opdef, "_REGISTRY", dict(opdef._REGISTRY))
    seen = []

    def check(g, x, factor, weight):
        seen.append({"factor": factor, "weight": weight})
        if factor <= 0:
            raise GraphError(f"scale factor must be positive, got {factor}")

    @ir_op(check=check, output=Residency.NODE, inputs={"x": Residency.NODE}, exchange=Push(of="x"),
           label=lambda a: f"scale(x{a['factor']})")
    def scale(g, x, factor: float = 2.0, weight=None, *, strategy: Strategy = Strategy.LOCAL, comm=None):
        return x * factor

    return scale, seen


def test_ir_op_registers_a_definition_and_checks_constants_without_pass_keywords(toy):
    scale, seen = toy
    d = scale.definition
    assert registry()[scale] is d and definition(scale) is d and d.fn is scale and d.name == "scale"
    assert (d.output, d.inputs, d.kind) == (Residency.NODE, {"x": Residency.NODE}, Exchange.PUSH)
    assert list(d.signature.parameters) == ["g", "x", "factor", "weight", "strategy", "comm"]
    x = torch.arange(3.0)
    torch.testing.assert_close(scale(None, x, 3.0, strategy=Strategy.DIRECT, comm="link"), x * 3, rtol=0, atol=0)
    torch.testing.assert_close(scale(None, x), x * 2, rtol=0, atol=0)
    assert seen == [{"factor": 3.0, "weight": None}, {"factor": 2.0, "weight": None}]  # defaults in, pass keywords out
    assert {"strategy", "comm"} <= set(PASS_KEYWORDS)
    with pytest.raises(GraphError, match="scale factor must be positive, got -1"):
        scale(None, x, -1)
    with pytest.raises(TypeError):  # an argument the op does not take: bound like a call
        scale(None, x, nope=1)


def test_an_op_is_one_fx_node_and_is_checked_at_trace_time(toy):
    scale, seen = toy

    class M(torch.nn.Module):
        def forward(self, g, x):
            return scale(g, x=x, factor=4.0) + 1  # a proxy passed by keyword too

    gm = torch.fx.symbolic_trace(M())
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is scale]
    assert definition(node) is scale.definition and node.kwargs == {"x": node.kwargs["x"], "factor": 4.0}
    assert seen[-1]["factor"] == 4.0
    placeholder = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert definition(placeholder) is None  # only a call_function node is an op

    class Bad(torch.nn.Module):
        def forward(self, g, x):
            return scale(g, x, 0.0)

    with pytest.raises(GraphError, match="positive"):
        torch.fx.symbolic_trace(Bad())


def test_definition_and_registry_lookups(toy):
    scale, _ = toy
    assert definition(torch.relu) is None and definition([1]) is None  # not an op; unhashable
    copy = registry()
    copy.clear()
    assert registry()[scale] is scale.definition  # a copy, not the registry


def test_opdef_binds_describes_and_refuses_to_run_without_an_implementation(toy):
    scale, _ = toy
    d = scale.definition
    x = torch.ones(2)
    assert d.bind((None, x), {"weight": 5}) == {"g": None, "x": x, "factor": 2.0, "weight": 5,
                                                 "strategy": Strategy.LOCAL, "comm": None}
    assert d.describe(d.bind((None, x, 0.5), {})) == "scale(x0.5)"
    unnamed = OpDef("plain", scale, d.signature, Residency.NODE, {})
    assert unnamed.describe({}) == "plain" and unnamed.kind is Exchange.NONE
    assert unnamed.saved({}) == "" and unnamed.kernels({}) == [] and unnamed.temporaries({}, 8) == opdef.Temporaries()
    with pytest.raises(CompileError, match="IR op scale has no shard implementation registered; import sarcompile"):
        d.run(None, x)

    def impl(*args, **kwargs):
        return ("impl", args, kwargs)

    assert d.implement(impl) is impl and d.run(1, x=2) == ("impl", (1,), {"x": 2})
    specs = d.register_kernels(lambda a: [("forward", a["factor"])])
    assert d.kernels({"factor": 3}) == [("forward", 3)] and specs is d.kernels


def test_exchange_kinds_and_row_bytes():
    never = lambda a, w: False  # noqa: E731
    halo = Halo(("h", "a_src"), never, never)
    args = {"h": torch.zeros(5, 3, 4), "a_src": torch.zeros(5, 2, dtype=DT), "b": torch.zeros(5, 100)}
    assert row_bytes(args["h"]) == 3 * 4 * 4 and row_bytes(args["a_src"]) == 2 * 8
    assert halo.row_bytes(args) == 48 + 16  # the sent arguments only, not b
    assert Push("b").row_bytes(args) == 100 * 4
    sig = inspect.signature(lambda x: x)
    kinds = [OpDef("o", print, sig, Residency.NODE, {}, exchange=e).kind
             for e in (halo, Push("b"), AllReduce(lambda a: (0, 0)), None)]
    assert kinds == [Exchange.HALO, Exchange.PUSH, Exchange.ALLREDUCE, Exchange.NONE]


def test_real_ops_exchange_kinds_labels_and_saved():
    spmm, sddmm = sc.spmm.definition, sc.sddmm.definition
    g = sc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    x = torch.zeros(2, 3)
    assert spmm.describe(spmm.bind((g, x, "max"), {})) == "spmm(max)"
    assert spmm.saved(spmm.bind((g, x, "min"), {})) == "argmin [n, F] int64"
    assert spmm.saved(spmm.bind((g, x, "sum"), {})) == "inputs (references)"
    assert sddmm.describe(sddmm.bind((g, x, x, "dot"), {})) == "sddmm(dot)"
    kinds = {d.name: d.kind for d in registry().values()}
    assert kinds["spmm"] is kinds["sddmm"] is kinds["gather_src"] is kinds["attention"] is Exchange.HALO
    assert kinds["batch_norm"] is kinds["node_mean"] is Exchange.ALLREDUCE
    assert kinds["edge_reduce_src"] is Exchange.PUSH and kinds["edge_softmax"] is Exchange.NONE
    # every halo op sends arguments it takes, and takes the keywords the passes set on it
    for d in registry().values():
        if d.kind is Exchange.HALO:
            assert set(d.exchange.sends) <= set(d.signature.parameters), d.name
            assert {"strategy", "comm"} <= set(d.signature.parameters), d.name


def test_all_reduce_bytes_by_hand():
    x = torch.zeros(7, 5, requires_grad=True)
    bn, mean = sc.ir.global_ops.batch_norm.definition, sc.ir.global_ops.node_mean.definition
    assert bn.exchange.bytes({"x": x}) == ((5 + 1 + 5) * 8, 2 * 5 * 8)
    assert bn.exchange.bytes({"x": x.detach()}) == ((5 + 1 + 5) * 8, 0)
    assert mean.exchange.bytes({"x": torch.zeros(7, 2, 3, requires_grad=True)}) == ((6 + 1) * 8, 6 * 8)


# -- the halo descriptions against autograd ----------------------------------------------------

G = sc.Graph.from_edges(torch.tensor([0, 1, 2, 3, 0, 2, 4]), torch.tensor([1, 2, 3, 0, 0, 4, 1]), 5)
E = G.num_edges


def _cases():
    """(op, its arguments, the tensor arguments whose gradient may be wanted)."""
    gen = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=DT)

    for reduce in ("sum", "mean"):
        yield sc.spmm, {"g": G, "x": r(5, 3), "reduce": reduce}, ("x",)
        yield sc.spmm, {"g": G, "x": r(5, 3), "reduce": reduce, "edge_weight": r(E).abs()}, ("x", "edge_weight")
    for op in ("add", "sub", "mul", "dot"):
        yield sc.sddmm, {"g": G, "a": r(5, 3), "b": r(5, 3), "op": op}, ("a", "b")  # sends a only
    yield sc.ir.edge_ops.gather_src, {"g": G, "x": r(5, 3)}, ("x",)


@pytest.mark.parametrize("fn, args, tensors", list(_cases()), ids=lambda v: getattr(v, "__name__", None))
def test_halo_backward_reads_remote_rows_exactly_when_autograd_does(fn, args, tensors):
    d = fn.definition
    sent = d.exchange.sends
    upstream = torch.randn(fn(**args).shape, generator=torch.Generator().manual_seed(1), dtype=DT)

    def grads(values: dict, wants: tuple) -> list[torch.Tensor]:
        inputs = {k: v.clone().requires_grad_(k in wants) if isinstance(v, torch.Tensor) else v for k, v in values.items()}
        out = fn(**inputs)
        return list(torch.autograd.grad(out, [inputs[k] for k in wants], upstream))

    for n in range(1, len(tensors) + 1):
        for wants in itertools.combinations(tensors, n):
            bound = d.bind((), args)
            # the oracle: do the wanted gradients change when the values of the sent rows do?
            moved = {**args, **{k: args[k] * 1.7 + 0.3 for k in sent}}
            depends = any(not torch.equal(a, b) for a, b in zip(grads(args, wants), grads(moved, wants)))
            assert d.exchange.reads_remote_in_backward(bound, frozenset(wants)) == depends, wants
            # remote rows get gradients exactly when a sent argument's is wanted
            assert d.exchange.pushes_gradients(bound, frozenset(wants)) == bool(set(wants) & set(sent)), wants
