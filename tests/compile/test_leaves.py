"""A call's arguments as flat leaves (compile/leaves.py): every layout's leaves and leaf
names agree, rebuilding from the leaves gives forward the call it was given (a property
over random calls of dicts, lists, tuples, typed graphs, plain values and None, through
named parameters, ``*args``, ``**kwargs`` and keyword-only ones), constants are keyed by
type and value, and what cannot be flattened is refused with the fix."""

from __future__ import annotations

import inspect
import keyword
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sarcompile as sc
from sarcompile.compile.leaves import (
    ArgLayout, Constant, argument_name, call_arguments, is_plain, layout_of, leaves_of_call, needs_leaves,
    rebuilt_arguments, takes_varargs,
)
from sarcompile.errors import CompileError
from sarcompile.graph.hetero import TracedHetero

TYPES = ("paper", "author", "field")
RELATIONS = (("author", "writes", "paper"), ("paper", "cites", "paper"), ("field", "of", "paper"))

plains = st.recursive(
    st.one_of(st.booleans(), st.integers(-3, 3), st.floats(-2, 2, allow_nan=False), st.text("ab", max_size=2), st.none()),
    lambda inner: st.tuples(inner, inner) | st.tuples(inner),
    max_leaves=4,
).filter(lambda v: v is not None)  # (None is a layout of its own)


@st.composite
def tensors(draw) -> torch.Tensor:
    return torch.full((draw(st.integers(1, 3)), 2), float(draw(st.integers(0, 9))))


@st.composite
def typed_graphs(draw) -> sc.HeteroGraph:
    relations = draw(st.lists(st.sampled_from(RELATIONS), min_size=1, max_size=3, unique=True))
    counts = {t: draw(st.integers(1, 4)) for t in TYPES}
    edges = {r: (torch.tensor([0, counts[r[0]] - 1]), torch.tensor([counts[r[2]] - 1, 0])) for r in relations}
    return sc.HeteroGraph.from_edges(edges, counts)


def values() -> st.SearchStrategy:
    """An argument: a tensor, None, a plain value, a dict of tensors (by type or relation),
    a list or tuple of tensors, or a typed graph."""
    keys = st.sampled_from(TYPES) | st.sampled_from(RELATIONS)
    return st.one_of(
        tensors(), st.none(), plains,
        st.dictionaries(keys, tensors(), max_size=3),
        st.lists(tensors(), max_size=3), st.lists(tensors(), min_size=1, max_size=3).map(tuple),
        typed_graphs(),
    )


def _expected_leaves(value: Any) -> list[Any]:
    """The leaves of ``value``, by hand: a tensor is one, a dict one per key, a list or
    tuple of tensors one per item, a typed graph one per relation (its graph), a plain
    value or None none."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, sc.HeteroGraph):
        return [value[r] for r in value.edge_types]
    if isinstance(value, (list, tuple)) and not is_plain(value):
        return list(value)
    return []


def _same(a: Any, b: Any) -> bool:
    """``a`` is ``b`` rebuilt: the same tensors and graphs (by identity), containers of the
    same type and keys, plain values equal and of one type."""
    if isinstance(a, sc.HeteroGraph):
        return (isinstance(b, TracedHetero) and b.node_types == tuple(a.node_types)
                and list(b.relations) == list(a.edge_types)
                and all(b.relations[r] is a[r] for r in a.edge_types))
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and not is_plain(a):
        return type(a) is type(b) and len(a) == len(b) and all(x is y for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a is b
    return type(a) is type(b) and a == b or (a is None and b is None)


@settings(max_examples=100, deadline=None)
@given(value=values(), name=st.sampled_from(["x", "x_dict", "g"]))
def test_a_layouts_leaves_names_and_rebuilt_value(value, name):
    layout = layout_of(name, value)
    leaves = layout.leaves(value)
    expected = _expected_leaves(value)
    assert len(leaves) == len(expected) and all(a is b for a, b in zip(leaves, expected))
    names = layout.leaf_names()
    assert len(names) == len(leaves) == len(set(names))
    assert all(n.isidentifier() and not keyword.iskeyword(n) and n.startswith(name) for n in names)
    assert _same(value, layout.rebuild(leaves))
    if isinstance(value, sc.HeteroGraph):
        assert layout.node_counts == tuple(value.num_nodes(t) for t in value.node_types)


def _forward(a, b=7, *rest, c, d=None, **extra):
    """A forward with every kind of parameter."""


@st.composite
def calls(draw) -> tuple[tuple, dict]:
    args = [draw(values())]  # a, positional
    if draw(st.booleans()):
        args.append(draw(values()))  # b
        args += draw(st.lists(values(), max_size=2))  # *rest
    kwargs = {"c": draw(values())}
    if draw(st.booleans()):
        kwargs["d"] = draw(values())
    names = st.sampled_from(["e", "f_dict", "g2"])
    kwargs |= draw(st.dictionaries(names, values(), max_size=2))  # **extra
    return tuple(args), kwargs


def _bound(args: tuple, kwargs: dict) -> dict[str, Any]:
    """The oracle: how Python binds a call of _forward, defaults filled in."""
    bound = inspect.signature(_forward).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


@settings(max_examples=100, deadline=None)
@given(call=calls())
def test_rebuilt_arguments_give_forward_the_call_it_was_given(call):
    args, kwargs = call
    given_ = call_arguments(_forward, args, kwargs)
    # in forward's order: a, b, each *rest value, c, d, each **extra keyword (those given)
    rest, extra = args[2:], {k: v for k, v in kwargs.items() if k not in ("c", "d")}
    passed = ({"a": "named"} | ({"b": "named"} if len(args) > 1 else {}) | {f"rest_{i}": "varargs" for i in range(len(rest))}
              | {"c": "named"} | ({"d": "named"} if "d" in kwargs else {}) | {k: "varkw" for k in extra})
    assert {n: p for n, (_, p) in given_.items()} == passed and list(given_) == list(passed)
    assert all(given_[n][0] is v for n, v in zip([f"rest_{i}" for i in range(len(rest))], rest))
    assert takes_varargs(given_) == bool(rest or extra)
    layouts = tuple(layout_of(n, v, p) for n, (v, p) in given_.items())
    leaves = leaves_of_call(layouts, {n: v for n, (v, _) in given_.items()})
    names = [n for layout in layouts for n in layout.leaf_names()]
    assert len(names) == len(set(names)) == len(leaves)
    by_name = dict(zip(names, leaves))
    asked = []

    def placeholder(n: str) -> Any:
        asked.append(n)
        return by_name[n]

    params = list(inspect.signature(_forward).parameters.values())
    new_args, new_kwargs, attributes = rebuilt_arguments(params, layouts, placeholder)
    assert asked == names and attributes == {}
    want, got = _bound(args, kwargs), _bound(tuple(new_args), new_kwargs)
    assert list(got) == list(want)
    for k in want:
        if k == "rest":
            assert len(got[k]) == len(want[k]) and all(_same(a, b) for a, b in zip(want[k], got[k]))
        elif k == "extra":
            assert list(got[k]) == list(want[k]) and all(_same(want[k][e], got[k][e]) for e in want[k])
        else:
            assert _same(want[k], got[k]), k


def test_leaf_names_by_hand():
    assert ArgLayout("x", "dict", ("paper", ("author", "writes", "paper"))).leaf_names() == [
        "x__paper", "x__author__writes__paper"]
    assert ArgLayout("xs", "list", (0, 1)).leaf_names() == ["xs__0", "xs__1"]
    assert ArgLayout("self.g", passed="attr").leaf_names() == ["self_g"]
    assert ArgLayout("self.g", passed="attr").attribute == "g" and ArgLayout("g").attribute is None
    assert ArgLayout("t", "constant", (Constant(3),)).leaf_names() == [] == ArgLayout("n", "none").leaf_names()


def test_a_graph_the_model_keeps_is_rebuilt_as_an_attribute():
    g = sc.Graph.from_edges(torch.tensor([0]), torch.tensor([1]), 2)
    x = torch.ones(2, 1)

    def forward(x, scale=2.0):
        pass

    layouts = (layout_of("x", x), layout_of("self.conv.g", g, "attr"))
    leaves = dict(zip([n for layout in layouts for n in layout.leaf_names()], leaves_of_call(
        layouts, {"x": x, "self.conv.g": g})))
    args, kwargs, attributes = rebuilt_arguments(list(inspect.signature(forward).parameters.values()), layouts,
                                                 leaves.__getitem__)
    assert args[0] is x and args[1] == 2.0 and kwargs == {} and attributes == {"conv.g": g}
    assert attributes["conv.g"] is g


def test_constants_are_keyed_by_type_and_value():
    assert Constant(True) != Constant(1) and Constant(1) != Constant(1.0) and Constant((1, "a")) != Constant((True, "a"))
    assert Constant((2, "a")) == Constant((2, "a")) and hash(Constant((2, "a"))) == hash(Constant((2, "a")))
    assert len({Constant(0), Constant(False), Constant(0.0), Constant(0)}) == 3
    assert layout_of("t", (1, "a")) == ArgLayout("t", "constant", (Constant((1, "a")),))
    assert layout_of("t", None).kind == "none" and layout_of("t", None).leaves(None) == []


def test_which_values_are_plain_and_which_calls_need_leaves():
    t = torch.zeros(1)
    assert all(is_plain(v) for v in (True, 3, 2.5, "s", None, (1, ("a", None)), ()))
    assert not any(is_plain(v) for v in (t, [1], {"a": 1}, (1, t)))
    assert not needs_leaves({"x": t, "flag": True, "sizes": (1, 2), "none": None})
    for v in ({"a": t}, [t], (t, t), sc.HeteroGraph.from_edges({RELATIONS[1]: ([0], [0])}, {"paper": 1})):
        assert needs_leaves({"x": t, "v": v})


def test_a_typed_shards_counts_are_the_whole_graphs(tmp_path):
    g = sc.HeteroGraph.from_edges({RELATIONS[0]: ([0, 1, 2], [3, 4, 0]), RELATIONS[1]: ([0, 4], [1, 2])},
                                  {"author": 3, "paper": 5})
    sc.partition(g, 2, tmp_path, method="contiguous")
    shard = sc.load_partition(tmp_path, rank=1, world_size=2).graph
    layout = layout_of("g", shard)
    assert layout.kind == "typed" and dict(zip(layout.node_types, layout.node_counts)) == {"author": 3, "paper": 5}
    assert [g_ is shard.relations[r] for r, g_ in zip(layout.keys, layout.leaves(shard))] == [True, True]


def test_refusals_name_the_fix():
    with pytest.raises(CompileError, match=r"argument 'x'\['paper'\] is a dict: .* flatten it into one dict"):
        layout_of("x", {"paper": {"a": torch.zeros(1)}})
    with pytest.raises(CompileError, match=r"argument 'x'\['paper'\] is a list"):
        layout_of("x", {"paper": [torch.zeros(1)]})
    with pytest.raises(CompileError, match=r"called with arguments its forward\(a, \*, c\) does not take"):
        call_arguments(lambda a, *, c: None, (1, 2), {"c": 0})
    with pytest.raises(CompileError, match=r"takes no argument at position 2"):
        argument_name(lambda a, b=1: None, 2)


def test_argument_names_by_position_and_keyword():
    assert [argument_name(_forward, w) for w in (0, 1, 2, 4, "c", "extra_one")] == [
        "a", "b", "rest_0", "rest_2", "c", "extra_one"]
