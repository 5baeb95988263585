"""How a model is called, as a compiled program depends on it (:class:`CallShape`): where
the graph argument is, the plain Python arguments traced as their values, and where each
tensor input lives (per node, per edge, or the same on every worker)."""

from __future__ import annotations


import inspect
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from sarcompile.errors import CompileError, GraphError
from sarcompile.graph.graph import Graph
from sarcompile.graph.hetero import HeteroGraph, parse_relation_key
from sarcompile.compile.leaves import (ATTRIBUTE, TYPED_GRAPHS, ArgLayout, Constant, argument_name, call_arguments, has_frames, is_plain,
                     layout_of, leaves_of_call, needs_leaves, takes_varargs, with_frames)
from sarcompile.data.manifest import read_manifest
from sarcompile.compile.residency_rules import GRAPH_NAMES
from sarcompile.plan.sizes import TypedWorkerStats
from sarcompile.ir.probe import Input
from sarcompile.graph.shard import ShardGraph
from sarcompile.graph.tables import table_type
from sarcompile.ir.vocab import Residency


from sarcompile.compile.call_graphs import first_graph, is_graph
@dataclass(frozen=True)
class CallShape:
    """What a traced program depends on in how the model is called: where the graph
    argument is (DGL-style code calling ``g.update_all`` needs it traced as a graph), and
    the plain Python arguments (``constants``: bool, int, float, str, None and tuples of
    them, given or by default) -- traced as their values, so that ``if training:``,
    ``self.lins[target]`` and ``if edge_weight is not None`` (PyG's ready-made models) are
    decided when compiling, and a call with another value compiles a program of its own.
    ``inputs`` says, per argument name, where each input lives and its trailing shape (see
    :class:`~sarcompile.ir.probe.Input`): the residency pass checks the program for
    it. A program is compiled per shape.

    A tensor input with as many rows as the graph has nodes is per-node, with as many as it
    has edges per-edge (``edge`` in its name first when the two counts are equal), unless
    the residency pass's example run only works with another of these or as a constant;
    other tensors and values are the same on every worker."""

    graph_input: int | str | None = None
    constants: tuple[tuple[str, Constant], ...] = ()
    inputs: tuple[tuple[str, Input], ...] = ()
    # A call with dicts, lists, tuples or a typed graph: how each argument becomes the
    # program's leaves (see sarcompile.compile.leaves); ``inputs`` are then per leaf, and the
    # constants are layouts of their own.
    layouts: tuple[ArgLayout, ...] = ()
    # Over a one-type graph, its node count in the whole graph where the model has a parameter
    # with as many rows: a table of the nodes it may hold (see table_count).
    node_count: int | None = None

    @classmethod
    def of_call(cls, forward, args: tuple, kwargs: dict, graph_input: int | str | None,
                kept: dict[str, Any] | None = None, node_count: int | None = None) -> "CallShape":
        """The shape of ``forward(*args, **kwargs)`` with the graph at ``graph_input`` (a
        position or keyword; None where the model keeps its graphs), and ``kept``, the
        graphs the model keeps by attribute path (``{"g": g}`` for ``self.g``): inputs of
        the program after the call's. ``node_count``: see the field; such a call is made of
        leaves, as a typed one, so that node tables are inputs after them."""
        params = inspect.signature(forward).parameters
        bound = call_arguments(forward, args, kwargs)
        given = {k: v for k, (v, _) in bound.items()}
        if node_count is not None:
            graph_name = None if graph_input is None else argument_name(forward, graph_input)
            return replace(cls._of_leaves(forward, bound, graph_name, graph_input, kept or {}), node_count=node_count)
        if needs_leaves(given) or takes_varargs(bound) or kept or any(map(has_frames, given.values())):
            graph_name = None if graph_input is None else argument_name(forward, graph_input)
            return cls._of_leaves(forward, bound, graph_name, graph_input, kept or {})
        graph_name = list(params)[graph_input] if isinstance(graph_input, int) else graph_input
        graph = given.get(graph_name)
        inputs, constants = [], []
        for name, p in params.items():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or (name not in given and p.default is p.empty):
                continue
            value = given[name] if name in given else p.default
            if name == graph_name or is_graph(value):
                inputs.append((name, _graph_spec(value)))
            elif is_plain(value):
                constants.append((name, Constant(value)))
                inputs.append((name, Input(Residency.CONST, value=value)))
            else:
                inputs.append((name, _input_of(name, value, graph)))
        return cls(graph_input, tuple(constants), tuple(inputs))

    @classmethod
    def _of_leaves(cls, forward, bound: dict[str, tuple[Any, str]], graph_name: str | None,
                   graph_input: int | str | None, kept: dict[str, Any]) -> "CallShape":
        """A call with dicts, lists, a typed graph, values for ``*args`` / ``**kwargs`` or
        graphs kept on the model (``bound``, see :func:`~sarcompile.compile.leaves.call_arguments`;
        ``kept``, see :meth:`of_call`): one input per leaf, each named by its type or
        relation when the graph is typed; a graph's frame fields an input each, per node or
        per edge (of the type or relation of the frame)."""
        arguments = _with_plain_defaults(forward, bound) | {ATTRIBUTE + path: (v, "attr") for path, v in kept.items()}
        graph = first_graph(bound.get(graph_name, (None, ""))[0]) or next(map(first_graph, kept.values()), None)
        layouts, inputs = [], []
        for name, (value, passed) in arguments.items():
            layout = with_frames(layout_of(name, value, passed), value)
            layouts.append(layout)
            names, leaves = layout.leaf_names(), layout.leaves(value)
            framed = len(names) - len(layout.frames)
            for leaf, (_, end, of, _), tensor in zip(names[framed:], layout.frames, leaves[framed:]):
                rows = Residency.NODE if end == "ndata" else Residency.EDGE
                inputs.append((leaf, Input(rows, tuple(tensor.shape), tensor.dtype, of=of)))
            for leaf, key, value in zip(names[:framed], layout.keys or (None,), leaves[:framed]):
                if layout.kind == "typed":
                    inputs.append((leaf, Input(Residency.GRAPH, of=key)))
                elif is_graph(value) or (name == graph_name and layout.kind != "data"):
                    inputs.append((leaf, _graph_spec(value)))
                elif isinstance(graph, TYPED_GRAPHS):
                    inputs.append((leaf, _typed_input(key, value, graph)))
                else:
                    inputs.append((leaf, _input_of(leaf, value, graph)))
        return cls(graph_input, (), tuple(inputs), tuple(layouts))

    def specialised(self) -> dict[str, Constant]:
        """The plain Python arguments the program is traced with, by name."""
        return dict(self.constants) | {x.name: x.keys[0] for x in self.layouts if x.kind == "constant"}

    def arguments(self, forward, args: tuple, kwargs: dict, kept: dict[str, Any] | None = None) -> tuple:
        """The program's inputs for this call: ``args`` / ``kwargs`` themselves, or their
        leaves (and those of ``kept``, the graphs the model keeps, see :meth:`of_call`)."""
        if not self.layouts:
            return args
        given = {k: v for k, (v, _) in call_arguments(forward, args, kwargs).items()}
        given |= {ATTRIBUTE + path: v for path, v in (kept or {}).items()}
        return tuple(leaves_of_call(self.layouts, given))

    @classmethod
    def default(cls, forward, graph_input: int | str | None = None, x: torch.Tensor | None = None,
                kept: dict[str, Any] | None = None) -> "CallShape":
        """A call with the graph and the features only (``x``, the first other argument, when
        given): every optional input None. The graph is ``graph_input``, by default the first
        argument named as graphs are (``g``, ``graph``, ``edge_index``, ...), else the graphs
        the model keeps (``kept``, see :meth:`of_call`), else the first argument."""
        params = [n for n, p in inspect.signature(forward).parameters.items()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if graph_input is None and kept and not any(n in GRAPH_NAMES for n in params):
            shape = cls.of_call(forward, (), {}, None, kept)
            inputs = dict(shape.inputs)
            if x is not None and params:  # the first argument: the features
                inputs[params[0]] = Input(Residency.NODE, tuple(x.shape), x.dtype)
                layouts = tuple(layout for layout in shape.layouts if layout.name != params[0])
                shape = cls(None, (), tuple(inputs.items()), (ArgLayout(params[0]), *layouts))
            return shape
        if graph_input is None:
            graph_input = next((i for i, n in enumerate(params) if n in GRAPH_NAMES), 0)
        shape = cls.of_call(forward, (), {}, graph_input)
        graph_name = params[graph_input] if isinstance(graph_input, int) else graph_input
        inputs = dict(shape.inputs) | {graph_name: Input(Residency.GRAPH)}
        features = next((n for n in params if n != graph_name), None)
        if x is not None and features is not None:
            inputs[features] = Input(Residency.NODE, tuple(x.shape), x.dtype)
        return cls(graph_input, tuple((n, c) for n, c in shape.constants if n != features), tuple(inputs.items()))


def _graph_spec(graph: Any) -> Input:
    """The input of a one-type graph: with the dtype of its adjacency values where it has
    them (``adj_values``, see :meth:`Graph.from_adjacency`), so that the program reading them
    is one of its own and the probes carry values too (:func:`~sarcompile.ir.probe.example`)."""
    values = getattr(graph, "adj_values", None)
    return Input(Residency.GRAPH, dtype=None if values is None else values.dtype)


def table_count(model: nn.Module, graph: Any) -> int | None:
    """The node count of ``graph``, a one-type graph (of the whole graph, for a worker's
    shard), where ``model`` has a parameter of as many rows (more than one) or a sharded
    table: the program is then compiled with the tables of the nodes it finds by use
    (sarcompile.graph.tables), and keyed by the count. None otherwise, so that graphs of other
    sizes share a model's program."""
    if not isinstance(graph, (Graph, ShardGraph)) or graph.bipartite:
        return None
    count = graph.num_global_nodes if isinstance(graph, ShardGraph) else graph.num_nodes
    if any(table_type(p) is not None or count > 1 and not nn.parameter.is_lazy(p) and p.dim() >= 2
           and p.shape[0] == count for p in model.parameters()):
        return count
    return None


def _with_plain_defaults(forward, bound: dict[str, tuple[Any, str]]) -> dict[str, tuple[Any, str]]:
    """``bound`` (see :func:`~sarcompile.compile.leaves.call_arguments`) with the plain defaults of
    the parameters not given, in ``forward``'s order: a call that gives a default's value
    and one that leaves it out are one program."""
    out: dict[str, tuple[Any, str]] = {}
    for name, p in inspect.signature(forward).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            passed = "varargs" if p.kind is p.VAR_POSITIONAL else "varkw"
            out.update({k: v for k, v in bound.items() if v[1] == passed})
        elif name in bound:
            out[name] = bound[name]
        elif p.default is not p.empty and is_plain(p.default):
            out[name] = (p.default, "named")
    return out


def _hashable(value: Any) -> bool:
    try:
        hash(value)
        return True
    except TypeError:
        return False


def _input_of(name: str, value: Any, graph: Any) -> Input:
    """Where one input of a call lives (see :class:`CallShape`)."""
    if not isinstance(value, torch.Tensor):
        return Input(Residency.CONST, value=value if _hashable(value) else None)
    shape, rows = tuple(value.shape), (value.shape[0] if value.dim() else None)
    nodes, edges = getattr(graph, "num_nodes", None), getattr(graph, "num_edges", None)
    fits = [r for r, count in ((Residency.NODE, nodes), (Residency.EDGE, edges)) if rows is not None and rows == count]
    if not fits:
        return Input(Residency.CONST, shape, value.dtype)
    if len(fits) == 2 and "edge" in name:
        fits.reverse()
    # Which one it is, or a constant that happens to have as many rows, the example run decides.
    return Input(fits[0], shape, value.dtype, alternatives=(*fits[1:], Residency.CONST))


def _typed_input(key: Any, value: Any, graph: Any) -> Input:
    """Where one leaf lives in a call over a typed graph: the rows of the node type its key
    names (``x_dict["paper"]``), or of the relation it names (a weight per edge, keyed by
    triple, ``src__name__dst`` or name), if its row count fits; a constant otherwise."""
    if not isinstance(value, torch.Tensor):
        return Input(Residency.CONST, value=value if _hashable(value) else None)
    shape, rows = tuple(value.shape), (value.shape[0] if value.dim() else None)
    if isinstance(key, str) and key in graph.node_types and rows == graph.num_nodes(key):
        return Input(Residency.NODE, shape, value.dtype, alternatives=(Residency.CONST,), of=key)
    rel = None
    if isinstance(key, str) and "__" in key:
        try:
            rel = graph.relation(parse_relation_key(key))
        except GraphError:
            rel = None
    elif key is not None and key in graph:
        rel = graph.relation(key)
    if rel is not None and rows == graph[rel].num_edges:
        return Input(Residency.EDGE, shape, value.dtype, alternatives=(Residency.CONST,), of=rel)
    return Input(Residency.CONST, shape, value.dtype)


def example_features(source: Any) -> torch.Tensor | dict[str, torch.Tensor]:
    """An example of a partition's features (``node_data["x"]``; per node type, those
    that have one, in a typed partition): one row, of its dtype."""
    if isinstance(source, (Graph, HeteroGraph)):
        raise CompileError("plan(graph, num_parts, x=...): give an example input to size the rows")

    def one_row(info: dict) -> torch.Tensor:
        return torch.zeros((1, *info["shape"]), dtype=getattr(torch, info["dtype"]))

    manifest = read_manifest(source)
    if manifest.typed:
        return {t: one_row(d["node_data"]["x"]) for t, d in manifest.node_types.items() if "x" in d["node_data"]}
    info = manifest.node_data.get("x")
    if info is None:
        raise CompileError(f"partition {source!r} has no node_data['x']; pass x=... to plan()")
    return one_row(info)


def typed_call(forward, workers: list[TypedWorkerStats], x: Any) -> CallShape:
    """The call a model over a typed graph is planned for, before any call was made: the
    graph (the first argument named as graphs are, PyG's ``edge_index_dict`` among them,
    else the first) and ``x``, a dict of example features per node type, as the first
    other argument. The graph stands for the whole one (its node counts find the node
    tables), and each feature example has as many rows as its type has nodes (a broadcast
    view: no memory)."""
    if not isinstance(x, dict):
        raise CompileError(f"a model over a typed graph is planned with a dict of example features per node type "
                           f"(x={{'paper': ...}}), got {type(x).__name__}")
    counts = workers[0].num_global_nodes
    empty = torch.empty(0, dtype=torch.long)
    graph = HeteroGraph.from_edges({rel: (empty, empty) for rel in workers[0].relations}, counts)
    params = [n for n, p in inspect.signature(forward).parameters.items()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    where = next((i for i, n in enumerate(params) if n in GRAPH_NAMES or n == "edge_index_dict"), 0)
    features = {t: v.detach()[:1].expand(counts[t], *v.shape[1:]) for t, v in x.items() if t in counts}
    args = [graph if i == where else features for i in range(min(2, len(params)))]
    return CallShape.of_call(forward, tuple(args), {}, where)
