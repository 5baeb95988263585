"""The compile pipeline and ``sc.distribute``.

The pipeline, in order (each pass is a plain ``(GraphModule, options) -> GraphModule``)::

    trace      user module -> fx graph, graph layers as leaves      (sarcompile.compile.trace)
    lower      layers -> IR ops (spmm, sddmm, edge_softmax, ...)    (passes/lower.py)
    fuse       attention chains -> one fused attention op           (passes/fuse.py)
    residency  node / edge / graph / param per value; refuses what
               would mix rows (not exact on N workers)              (passes/residency.py)
    row_reductions  a mean over every node -> node_mean (a collective) (passes/row_reductions.py)
    dropout    dropout of rows -> masks keyed by node / edge id     (passes/dropout.py)
    partition  ops that read remote rows -> sequential aggregation  (passes/partition.py)
    strategy   direct / remat / stash / oneshot per op              (passes/strategy.py)
    communication  opt-in stale / compressed exchange per op        (passes/communication.py)
    kernels    executor per op: generated Triton or torch kernels   (passes/kernels.py)

A single machine runs the program after ``fuse`` and ``kernels``; a worker runs the one
after ``strategy`` and ``kernels``. Every stage's code is kept in :attr:`Program.stages` for
inspection when asked for (a plan, ``model.program()``, ``SARCOMPILE_LOGS=passes``); a program
compiled by a call runs without them (see :class:`_PassModule`).
"""

from __future__ import annotations

import functools
import inspect
import os
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
import torch.fx as fx
from torch import nn

from sarcompile import logs
from sarcompile.compile.data_argument import data_graph, is_data, with_graph
from sarcompile.errors import CompileError, GraphError
from sarcompile.graph.frames import copy_dgl_frames
from sarcompile.compile.libraries import load_available
from sarcompile.graph.graph import Graph
from sarcompile.graph.hetero import HeteroGraph, HeteroShard, parse_relation_key
from sarcompile.compile.leaves import (ATTRIBUTE, TYPED_GRAPHS, ArgLayout, Constant, argument_name, call_arguments, has_frames, is_plain,
                     layout_of, leaves_of_call, needs_leaves, takes_varargs, with_frames)
from sarcompile.ir.lowering import has_lowering
from sarcompile.data.partitioning import read_manifest
from sarcompile.compile.passes.context import CompileOptions
from sarcompile.compile.passes.communication import communication
from sarcompile.compile.passes.dropout import dropout
from sarcompile.compile.passes.fuse import fuse
from sarcompile.compile.passes.accumulate import accumulate
from sarcompile.compile.passes.head_dot import head_dot
from sarcompile.compile.passes.inplace import inplace
from sarcompile.compile.passes.kernels import kernels
from sarcompile.compile.passes.linear_first import linear_first
from sarcompile.compile.passes.linear_groups import linear_groups
from sarcompile.compile.passes.lower import lower
from sarcompile.compile.passes.node_tables import node_tables
from sarcompile.compile.passes.partition import partition
from sarcompile.compile.passes.residency import GRAPH_NAMES, listing, residency
from sarcompile.compile.passes.row_reductions import row_reductions
from sarcompile.compile.passes.reuse import reuse
from sarcompile.compile.passes.strategy import strategy
from sarcompile.plan.plan import Plan, TypedWorkerStats, WorkerStats, build_plan, worker_stats
from sarcompile.ir.probe import Input
from sarcompile.graph.shard import ShardGraph
from sarcompile.compile.tables import compile_with_tables, input_type
from sarcompile.graph.tables import NODES, shard_rows, shard_tables, table_type
from sarcompile.compile.trace import generated_wraps_dropped, trace
from sarcompile.ir.vocab import Residency
from sarcompile.nn import LAYER_STREAMS, RandomStream

__all__ = ["Program", "compile_program", "distribute", "DistributedModule"]


@dataclass
class Program:
    """A compiled GraphModule plus the readable code of every stage that made it."""

    module: fx.GraphModule
    stages: list[tuple[str, str]] = field(default_factory=list)
    # Node tables (sarcompile.graph.tables) the program takes after the call's inputs, in order: their node types.
    tables: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time of tracing and of each pass

    def inputs(self, model: nn.Module, call: "CallShape", args: tuple, kwargs: dict,
               kept: dict[str, Any] | None = None) -> tuple:
        """What the program is called with for ``model(*args, **kwargs)`` (``kept``: the
        graphs the model keeps, by attribute path)."""
        leaves = call.arguments(model.forward, args, kwargs, kept)
        return (*leaves, *(model.get_parameter(path) for path in self.tables))


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
    # with as many rows: a table of the nodes it may hold (see _table_count).
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
            if name == graph_name or _is_graph(value):
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
        graph = _first_graph(bound.get(graph_name, (None, ""))[0]) or next(map(_first_graph, kept.values()), None)
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
                elif _is_graph(value) or (name == graph_name and layout.kind != "data"):
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


def _table_count(model: nn.Module, graph: Any) -> int | None:
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


def _lazy_layers(model: nn.Module) -> list[str]:
    """The layers holding lazily initialised parameters, as ``'path' (Type)``: the outermost
    layer with a lowering rule around each such parameter, else the module holding it."""
    found: dict[str, str] = {}
    for path, m in model.named_modules():
        if not any(isinstance(p, nn.parameter.UninitializedParameter) for p in m.parameters(recurse=False)):
            continue
        parts = path.split(".") if path else []
        prefixes = [".".join(parts[:i]) for i in range(len(parts) + 1)]  # the model itself first
        layer = next((q for q in prefixes if has_lowering(model.get_submodule(q))), path)
        kind = type(model.get_submodule(layer)).__name__
        found.setdefault(layer, f"{layer!r} ({kind})" if layer else kind)
    return list(found.values())


class _PassModule(fx.GraphModule):
    """The GraphModule the pipeline's passes rewrite. Each pass ends with ``recompile()`` so
    that it stands alone (its tests run what it returns); here that waits until the program
    is finished (:meth:`finish`) or a stage's code is read (:meth:`stage_code`): fx's code
    generation after every pass was a third of a compile, and a program compiled by a call
    is run, never read, until then. Passes read the graph, not the code."""

    _deferring = True

    def recompile(self) -> Any:
        return None if self._deferring else super().recompile()

    def stage_code(self) -> str:
        """The code of the graph as the last pass left it."""
        fx.GraphModule.recompile(self)
        return self.code

    def finish(self) -> "_PassModule":
        """Generate the code to run; ``recompile`` is fx's own again from here."""
        self.__dict__["_deferring"] = False  # (past nn.Module's __setattr__, which would look for a parameter)
        fx.GraphModule.recompile(self)
        return self


def compile_program(model: nn.Module, options: CompileOptions, partitioned: bool, call: CallShape = CallShape(),
                    stages: bool = True, stream: Callable[[], nn.Module] | None = None) -> Program:
    """Run the pipeline on ``model`` as called with ``call``; a single machine skips
    ``partition`` and ``strategy``. ``stages``: keep every stage's code
    (:attr:`Program.stages`), which costs a third of the compile. ``stream``: makes the
    dropout masks' :class:`~sarcompile.nn.RandomStream` (see :mod:`sarcompile.compile.passes.dropout`)."""
    with generated_wraps_dropped():
        return _compile(model, options, partitioned, call, stages or "passes" in logs.ON, stream)


def _compile(model: nn.Module, options: CompileOptions, partitioned: bool, call: CallShape, keep: bool,
             stream: Callable[[], nn.Module] | None) -> Program:
    load_available()  # lowering rules for the layers of libraries in use (PyG)
    lazy = _lazy_layers(model)
    if lazy:
        raise CompileError(
            f"layer {', '.join(lazy[:3])}{', ...' if len(lazy) > 3 else ''} has lazily initialised parameters "
            "(in_channels=-1), whose shapes only a first call decides; run the model once eagerly on example "
            "inputs before sc.distribute (PyG's documented dry run, under torch.no_grad()), or give in_channels"
        )
    typed = next((layout for layout in call.layouts if layout.kind == "typed"), None)
    if typed is None and call.node_count is None:
        return _pipeline(model, options, partitioned, call, keep, stream, {}, [])
    # with the node tables found by name, else by use (sarcompile.graph.tables); a one-type graph's
    # nodes are a single type
    counts = {NODES: call.node_count} if typed is None else dict(zip(typed.node_types, typed.node_counts))
    return compile_with_tables(model, counts,
                               functools.partial(_pipeline, model, options, partitioned, call, keep, stream))


def _pipeline(model: nn.Module, options: CompileOptions, partitioned: bool, call: CallShape, keep: bool,
              stream: Callable[[], nn.Module] | None, tables: dict[str, Input], traced: list[fx.GraphModule]) -> Program:
    """The pipeline with node tables ``tables`` (parameter name -> its input), putting the
    module traced, which the passes then rewrite, into ``traced``."""
    inputs = dict(call.inputs)
    start = time.perf_counter()
    gm = trace(model, call.graph_input, {name: c.value for name, c in call.constants}, inputs, call.layouts,
               tables, _PassModule)
    traced.append(gm)
    constants = dict(call.constants)
    for node in gm.graph.nodes:  # what the residency pass starts from
        if node.op == "placeholder" and node.target in inputs:
            node.meta["input"] = inputs[node.target]
        if node.op == "placeholder" and node.target in constants:  # (unused: forward was traced with it)
            node.meta["constant"] = constants[node.target].value
    stages = [("trace", gm.stage_code())] if keep else []
    seconds = {"trace": time.perf_counter() - start}
    check = functools.partial(residency, distributed=partitioned)
    # node_tables runs only where a typed model holds node tables, so one-type plans read as before
    passes = [("node_tables", node_tables)] if tables else []
    passes += [("lower", lower), ("fuse", fuse), ("linear_first", linear_first), ("residency", check),
               ("row_reductions", row_reductions), ("dropout", functools.partial(dropout, stream=stream))]
    if partitioned:
        passes += [("partition", partition), ("strategy", strategy), ("communication", communication)]
    passes += [("kernels", kernels), ("reuse", reuse), ("inplace", inplace), ("linear_groups", linear_groups),
               ("accumulate", accumulate), ("head_dot", head_dot)]
    for name, run in passes:
        start = time.perf_counter()
        gm = run(gm, options)
        seconds[name] = time.perf_counter() - start
        if keep:
            code = gm.stage_code()
            stages.append((name, listing(gm) if run is check else code))
    gm.finish()
    if "passes" in logs.ON:
        for name, code in stages:
            logs.log("passes", f"{type(model).__name__} after {name} ({seconds[name] * 1e3:.1f} ms):\n{code.strip()}")
    order = {n.meta["table"]: input_type(n.meta["input"]) for n in gm.graph.nodes
             if n.op == "placeholder" and "table" in n.meta}
    return Program(gm, stages, order, seconds)


def _example_features(source: Any) -> torch.Tensor | dict[str, torch.Tensor]:
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


def _typed_call(forward, workers: list[TypedWorkerStats], x: Any) -> CallShape:
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


GRAPHS = (Graph, ShardGraph, HeteroGraph, HeteroShard)


def _is_graph(value: Any) -> bool:
    """Whether ``value`` is a graph, or a non-empty list or tuple of graphs (DGL's
    ``blocks``, a list of metapath graphs)."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(isinstance(v, GRAPHS) for v in value)
    return isinstance(value, GRAPHS)


def _first_graph(value: Any) -> Any:
    """``value`` if it is a graph, its first if it is a list of them, the graph of a PyG
    ``Data`` (its ``edge_index``), else None."""
    if is_data(value):
        return data_graph(value)
    if not _is_graph(value):
        return None
    return value[0] if isinstance(value, (list, tuple)) else value


def _dgl_graph(value: Any) -> bool:
    return type(value).__module__.startswith("dgl.") and hasattr(value, "canonical_etypes")


def _adjacency(value: Any) -> bool:
    """Whether ``value`` is a square sparse adjacency (PyG's ``adj_t`` as ``ToSparseTensor``
    makes it without torch_sparse: a ``torch.sparse_csr`` or ``sparse_coo`` tensor)."""
    return (isinstance(value, torch.Tensor) and value.layout in (torch.sparse_csr, torch.sparse_coo)
            and value.dim() == 2 and value.shape[0] == value.shape[1])


def _convertible(value: Any) -> bool:
    """A DGL graph or a sparse adjacency, or a non-empty list or tuple of them: what the
    compiler converts to sarcompile graphs (see :func:`_converted`)."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(_dgl_graph(v) or _adjacency(v) for v in value)
    return _dgl_graph(value) or _adjacency(value)


@dataclass
class _Graphs:
    """Where a call's graphs are: the argument holding one (a position or keyword; None if
    none does) and those the model keeps (``kept``: by attribute path); ``partitioned``
    whether they are a worker's shards."""

    where: int | str | None
    kept: dict[str, Any]
    partitioned: bool
    first: Any  # the first graph found (a typed shard's node tables are sharded by it)
    args: tuple  # the call's arguments, each DGL graph or sparse adjacency converted
    kwargs: dict


def _find_graphs(model: nn.Module, args: tuple, kwargs: dict, converted: dict[int, tuple[Any, Any]]) -> _Graphs:
    """The graphs of ``model(*args, **kwargs)``: in an argument (a graph, or a list or tuple
    of graphs), and kept on the model's modules as attributes (``self.g = g``, or a list of
    graphs) -- a DGL graph or a sparse adjacency in either place is converted (once,
    ``converted`` keeps it, see :func:`_converted`) to the sarcompile graph of the same
    nodes and edges, and the call's arguments are given with it in its place. All of them
    are whole graphs (one machine) or all a worker's shards. A PyG ``Data`` argument holds its
    graph as ``edge_index`` (a tensor there is converted, see :mod:`sarcompile.compile.data_argument`)."""
    args = tuple(_converted(v, converted) if _convertible(v) else with_graph(v, converted, _CONVERTED_KEPT)
                 for v in args)
    kwargs = {k: _converted(v, converted) if _convertible(v) else with_graph(v, converted, _CONVERTED_KEPT)
              for k, v in kwargs.items()}
    where = next((w for w, v in [*enumerate(args), *kwargs.items()] if _is_graph(v) or data_graph(v) is not None),
                 None)
    kept = _kept_graphs(model, converted)
    held = None if where is None else args[where] if isinstance(where, int) else kwargs[where]
    found = {} if held is None else {f"argument {where!r}": data_graph(held) if is_data(held) else held}
    found |= {f"self.{path}": v for path, v in kept.items()}
    if not found:
        raise CompileError(
            "no graph: sarcompile looked in forward's arguments (a graph, or a list or tuple of graphs) and in the "
            "model's attributes (self.g = g, kept by any of its modules), and found none. Call the model with a graph "
            "(model(g, x): a sarcompile Graph or HeteroGraph, a DGL graph or a sparse adjacency on one machine, a "
            "worker's part.graph), or keep it on the model: self.g = g in __init__, and on a worker model.g = "
            "part.graph"
        )
    shards = {what: all(isinstance(g, (ShardGraph, HeteroShard)) for g in (v if isinstance(v, (list, tuple)) else [v]))
              for what, v in found.items()}
    if len(set(shards.values())) > 1:
        whole = [what for what, shard in shards.items() if not shard]
        raise CompileError(
            f"the model's graphs are a worker's shards ({', '.join(w for w in shards if shards[w])}) and whole graphs "
            f"({', '.join(whole)}) at once; on a worker give every graph as its shard: part.graph, e.g. "
            f"model.{whole[0][5:] if whole[0].startswith('self.') else 'g'} = part.graph"
        )
    return _Graphs(where, kept, next(iter(shards.values())), _first_graph(next(iter(found.values()))), args, kwargs)


def _kept_graphs(model: nn.Module, converted: dict[int, tuple[Any, Any]]) -> dict[str, Any]:
    """The graphs ``model``'s modules keep as public attributes (a graph or a list or tuple
    of graphs), by path; a DGL graph as its sarcompile graph (see :func:`_find_graphs`)."""
    kept: dict[str, Any] = {}
    for prefix, module in model.named_modules():
        for name, value in vars(module).items():
            if name.startswith("_"):
                continue
            if _convertible(value):
                value = _converted(value, converted)
            if _is_graph(value):
                kept[f"{prefix}.{name}" if prefix else name] = value
    return kept


# DGL graphs and adjacencies a model was given, kept converted (the last few: a model called
# with a new graph each time converts each once).
_CONVERTED_KEPT = 8


def _converted(value: Any, converted: dict[int, tuple[Any, Any]]) -> Any:
    """The sarcompile graph of ``value`` (or of each in a list or tuple): a DGL graph's
    (``Graph.from_dgl``, ``HeteroGraph.from_dgl`` for a heterograph) or a sparse
    adjacency's (rows the destinations, as PyG's ``adj_t``). Converted once: ``converted``
    keeps the last few by id, with the object, so an id reused by another is not mistaken;
    a DGL graph's frames are copied again each time (a script sets its fields between calls)."""
    if isinstance(value, (list, tuple)):
        return type(value)(_converted(v, converted) for v in value)
    kept = converted.get(id(value))
    if kept is None or kept[0] is not value:
        kept = (value, _adjacency_graph(value) if isinstance(value, torch.Tensor) else _dgl_to_graph(value))
        converted[id(value)] = kept
        while len(converted) > _CONVERTED_KEPT:
            del converted[next(iter(converted))]
    elif not isinstance(value, torch.Tensor):
        copy_dgl_frames(value, kept[1])
    return kept[1]


def _dgl_to_graph(g: Any) -> Graph | HeteroGraph:
    if g.is_block:
        raise CompileError(
            "a DGL block (a sampled minibatch's, dgl.to_block) was given: sarcompile trains on the whole graph, "
            "split across workers. Give the graph itself (a list [g, g] where the model takes one block per layer)"
        )
    homogeneous = len(g.ntypes) == 1 and len(g.canonical_etypes) == 1
    return Graph.from_dgl(g) if homogeneous else HeteroGraph.from_dgl(g)


def _adjacency_graph(adj: torch.Tensor) -> Graph:
    """The graph of sparse adjacency ``adj`` (:meth:`Graph.from_adjacency`: its edges, and its
    values where they are not all ones or it has self-loops, which PyG's layers read as they
    read the matrix). Values that require grad are refused: the program takes them as data."""
    if adj.requires_grad:
        raise CompileError(
            "a sparse adjacency whose values require grad was given as the graph; sarcompile takes the adjacency's "
            "values as data and gives them no gradient. Give adj_t.detach(), or the graph and a weight per edge "
            "(model(x, g, edge_weight=w), w in the graph's edge order) where the weights are learned"
        )
    return Graph.from_adjacency(adj)


# Programs one model may compile for other values of its plain Python arguments before it is
# told that each new value compiles again (torch.compile's recompile limit is 8 too).
VARIANTS_BEFORE_WARNING = 8


def _warn_if_constants_keep_changing(compiled: list[CallShape], call: CallShape, name: str) -> bool:
    """Warn where ``call`` would be the first program past :data:`VARIANTS_BEFORE_WARNING`
    compiled (``compiled``: the calls of a model's programs) for other values of the same
    plain Python arguments; whether it warned."""
    values = call.specialised()
    others = [c.specialised() for c in compiled if c.specialised().keys() == values.keys()]
    changing = sorted(n for n in values if any(o[n] != values[n] for o in others))
    if len(others) < VARIANTS_BEFORE_WARNING or not changing:
        return False
    warnings.warn(
        f"{name} has compiled {len(others) + 1} programs, one per value of its plain Python arguments "
        f"{', '.join(changing)}: each new value traces and compiles forward again. Pass a value that changes "
        "from call to call as a tensor (torch.tensor(v)), an input of one program, not a constant of each",
        stacklevel=6,  # the model's call
    )
    return True


class DistributedModule(nn.Module):
    """A user module compiled for single-machine and partitioned execution.

    It *shares* the original module's parameters, buffers, submodules and training flag
    (the very same dicts and flag), so gradients land on the original's parameters,
    ``state_dict()`` has the original's keys, checkpoints move freely between the eager
    and compiled model, and ``original.eval()`` is seen by the compiled one.

    Example:

    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> model = sc.distribute(sc.nn.SAGEConv(2, 4))
    >>> type(model).__name__
    'DistributedModule'
    >>> plan = model.plan(g, 2, x=torch.ones(3, 2))   # what it will do on 2 workers
    >>> [op.op for op in plan.ops]
    ['spmm(mean)']
    """

    def __init__(self, module: nn.Module, options: CompileOptions):
        if isinstance(module, DistributedModule):
            raise CompileError("this module is already distributed; wrap the original module once")
        # Set before nn.Module.__init__, whose `self.training = True` goes to the original.
        object.__setattr__(self, "_orig", module)
        mode = module.training
        super().__init__()
        module.training = mode
        object.__setattr__(self, "_options", options)
        object.__setattr__(self, "_programs", {})
        object.__setattr__(self, "_converted", {})  # DGL graphs and adjacencies given, as sarcompile graphs
        object.__setattr__(self, "_stream", None)  # dropout masks' RandomStream, made when first needed
        self._parameters = module._parameters
        self._buffers = module._buffers
        self._modules = module._modules
        self._non_persistent_buffers_set = module._non_persistent_buffers_set

    @property
    def training(self) -> bool:  # type: ignore[override]
        return self._orig.training

    @training.setter
    def training(self, mode: bool) -> None:
        self._orig.training = mode

    @property
    def original(self) -> nn.Module:
        """The module that was wrapped."""
        return self._orig

    @property
    def options(self) -> CompileOptions:
        return self._options

    def dropout_stream(self) -> RandomStream:
        """Where the dropout masks of every program of this model draw their salt (see
        :mod:`sarcompile.compile.passes.dropout`): one :class:`~sarcompile.nn.RandomStream`, kept
        across recompiles (train and eval programs, replaced parameters), so the sequence of
        masks goes on. Its seed is ``distribute(..., seed=)``, else ``torch.initial_seed()``
        when it is made (at the first compile of a model that drops out in training): seed
        torch alike on every worker, or pass ``seed``. Its ``step`` counts training calls;
        save and restore ``dropout_stream().state_dict()`` to resume the same masks."""
        if self._stream is None:
            seed = self._options.seed if self._options.seed is not None else torch.initial_seed()
            object.__setattr__(self, "_stream", RandomStream(seed))
        return self._stream

    def mask_state(self) -> dict[str, Any]:
        """Where every dropout mask of this model is in its sequence: the model's
        :meth:`dropout_stream` and the attention-dropout stream of each PyG or DGL attention
        layer compiled so far (by module path). Not part of ``state_dict()``, which keeps the
        user's keys: a checkpoint saves it beside, and :meth:`load_mask_state` resumes the
        same masks."""
        layers = {path: LAYER_STREAMS[m].state_dict() for path, m in self._orig.named_modules() if m in LAYER_STREAMS}
        return {"model": self.dropout_stream().state_dict(), "layers": layers}

    def load_mask_state(self, state: dict[str, Any]) -> None:
        """Resume the masks :meth:`mask_state` saved (before the first call compiles)."""
        self.dropout_stream().load_state_dict(state["model"])
        for path, saved in state["layers"].items():
            stream = LAYER_STREAMS.setdefault(self._orig.get_submodule(path), RandomStream(0))
            stream.load_state_dict(saved)

    def program(self, partitioned: bool, call: CallShape | None = None, stages: bool = True) -> Program:
        """The compiled program for the current training flag (compiled on first use), with
        every stage's code unless ``stages`` is false (as a call compiles it).

        A program refers to the parameter and buffer objects it was traced with, so it is
        compiled again when any of them was replaced (``load_state_dict(assign=True)``,
        assigning a new buffer, ``.to()``).
        """
        state = tuple(self._orig.parameters()) + tuple(self._orig.buffers())
        call = call or self.__dict__.get("_last_call") or CallShape.default(self._orig.forward)
        key = (partitioned, self.training, call)
        cached = self._programs.get(key)
        if cached is None and not self.__dict__.get("_warned_constants"):  # (once per model)
            self.__dict__["_warned_constants"] = _warn_if_constants_keep_changing(
                [k[2] for k in self._programs], call, type(self._orig).__name__)
        if cached is None or len(cached[0]) != len(state) or any(a is not b for a, b in zip(cached[0], state)):
            self._programs[key] = (state, compile_program(self._orig, self._options, partitioned, call, stages,
                                                          self.dropout_stream))
        program = self._programs[key][1]
        if stages and not program.stages:
            # Compiled by a call, without its stages: the same pipeline again for them. The
            # module that runs stays (it may hold state, such as a stale exchange's cache).
            again = compile_program(self._orig, self._options, partitioned, call, stream=self.dropout_stream)
            program.stages, program.seconds = again.stages, again.seconds
        return program

    def plan(
        self,
        source: str | os.PathLike | Graph | HeteroGraph,
        num_parts: int | None = None,
        x: torch.Tensor | dict[str, torch.Tensor] | None = None,
        method: str | torch.Tensor | dict = "metis",
        seed: int = 0,
        optimizer: Any = None,
    ) -> Plan:
        """The plan of this model on ``num_parts`` workers, without training (see
        :mod:`sarcompile.plan.plan`). ``source`` is a partition directory, or a graph that is
        partitioned in memory into ``num_parts`` (``method`` and ``seed`` as for
        :func:`sarcompile.partition`, or a tensor giving each node's part -- per node type,
        a dict of them, for a typed graph). ``x`` is an example input (only its trailing
        shape and dtype matter, and whether it requires grad); by default the partition's
        ``node_data["x"]``. Over a typed graph, ``x`` is a dict of them per node type (by
        default each type's ``node_data[type]["x"]``, types without one being featureless).
        ``optimizer`` (an instance, or "adam" / "sgd") adds its state to the memory
        estimate. Plans the training program: ``forward(graph, x)``.
        """
        workers = worker_stats(source, num_parts, method, seed)
        if x is None:
            x = _example_features(source)
        return self.plan_for_workers(workers, x, optimizer)

    def plan_for_workers(self, workers: list[WorkerStats] | list[TypedWorkerStats],
                         x: torch.Tensor | dict[str, torch.Tensor], optimizer: Any = None) -> Plan:
        """The plan for workers of the given sizes (real, or from a partition model)."""
        # Traced as the last call was made (where the graph is, which inputs are None);
        # before any call, or where the call read a DGL graph's frames (fields the example
        # shard has not), as forward(g, x) with every optional input None.
        call = self.__dict__.get("_last_call")
        typed = bool(workers) and isinstance(workers[0], TypedWorkerStats)
        if (call is None or typed != any(layout.kind == "typed" for layout in call.layouts)
                or any(layout.frames for layout in call.layouts)):
            if typed:
                call = _typed_call(self._orig.forward, workers, x)
            else:
                call = CallShape.default(self._orig.forward, x=x, kept=_kept_graphs(self._orig, self._converted))
        program = self.program(partitioned=True, call=call)
        served = self._eval_program(call)  # a prediction's, for the inference estimate
        # The probe runs must not advance dropout counters or other buffers of the model.
        buffers = {id(v): (v, v.clone()) for v in [*self._orig.buffers(), *program.module.buffers(),
                                                   *served.module.buffers()]}
        try:
            return build_plan(
                type(self._orig).__name__, self._options.mode, program.module, program.stages, workers, x, optimizer,
                program.seconds, served.module,
            )
        finally:
            with torch.no_grad():
                for v, saved in buffers.values():
                    v.copy_(saved)

    def _eval_program(self, call: CallShape) -> Program:
        """The partitioned program of ``call`` in eval mode, as a prediction runs it; every
        submodule's training flag is left as it was."""
        flags = {m: m.training for m in self._orig.modules()}
        self._orig.eval()
        try:
            return self.program(partitioned=True, call=call, stages=False)
        finally:
            for m, flag in flags.items():
                m.training = flag

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        graphs = _find_graphs(self._orig, args, kwargs, self._converted)
        graph, args, kwargs = graphs.first, graphs.args, graphs.kwargs
        call = CallShape.of_call(self._orig.forward, args, kwargs, graphs.where, graphs.kept,
                                 _table_count(self._orig, graph))
        self.__dict__["_last_call"] = call
        program = self.program(graphs.partitioned, call, stages=False)
        if not call.layouts:
            return program.module(*args, **kwargs)
        if program.tables and isinstance(graph, (HeteroShard, ShardGraph)):  # a worker keeps its own rows of each
            shard_tables(self._orig, program.tables, *shard_rows(graph))
        return program.module(*program.inputs(self._orig, call, args, kwargs, graphs.kept))

    def __setattr__(self, name: str, value: Any) -> None:
        # A plain attribute of the model (the graph it keeps: model.g = part.graph on a
        # worker) is set on the model, whose forward reads it.
        if not name.startswith("_") and name in vars(self._orig):
            setattr(self._orig, name, value)
        else:
            super().__setattr__(name, value)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._orig, name)

    def __repr__(self) -> str:
        return f"distribute({self._orig!r}, mode={str(self._options.mode)!r})"


def distribute(
    model: nn.Module | type | None = None,
    *,
    mode: str = "sar",
    executor: str = "auto",
    staleness: int = 1,
    compress: str | None = None,
    strategies: dict[str, str] | None = None,
    bounded_staleness: int | None = None,
    error_feedback: bool = True,
    compress_layers: list[str] | None = None,
    blocks_in_flight: int = 1,
    seed: int | None = None,
):
    """Compile a model for exact distributed full-batch training.

    ``sc.distribute(model)`` wraps an instance; ``@sc.distribute`` (with or without
    options) decorates a class so that constructing it returns the wrapped instance.

    Opt-in, approximate: ``staleness=K`` (DIGEST: remote rows refreshed every K training
    iterations), ``bounded_staleness=S`` (pipelined: exchange overlapped with the next
    iteration, exact every S), ``compress="1bit" | "2bit" | "int4" | "int8"`` (rows that
    cross workers quantized per row; with ``error_feedback``, the default, the
    quantization error is carried to the next send), applied to the layers in
    ``compress_layers`` (all when None). See :mod:`sarcompile.runtime.link`.

    ``blocks_in_flight``: remote blocks each exchange posts ahead of the one it computes on,
    and gradient pushes kept in flight (default 1; 0 for the least memory, more for more
    overlap at one block buffer each). The plan counts their buffers.

    ``seed``: the seed of the dropout masks. Dropout of node and edge rows (``F.dropout``,
    ``nn.Dropout``, the layers' own) draws masks keyed by (seed, step, node or edge id), the
    same on one machine and on N workers (:mod:`sarcompile.compile.passes.dropout`); by default
    the seed is ``torch.initial_seed()``, so seed torch alike on every worker.

    Example:

    >>> model = sc.distribute(sc.nn.SAGEConv(2, 4))
    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> model(g, torch.ones(3, 2)).shape   # one machine: what the eager layer returns
    torch.Size([3, 4])
    """
    options = CompileOptions(
        mode, executor, staleness, compress, dict(strategies or {}), bounded_staleness, error_feedback,
        # a str stays a str, so that the options refuse it rather than split it into letters
        compress_layers if compress_layers is None or isinstance(compress_layers, str) else tuple(compress_layers),
        blocks_in_flight, seed,
    )
    if model is None:
        return lambda m: distribute(m, mode=mode, executor=executor, staleness=staleness, compress=compress,
                                    strategies=strategies, bounded_staleness=bounded_staleness,
                                    error_feedback=error_feedback, compress_layers=compress_layers,
                                    blocks_in_flight=blocks_in_flight, seed=seed)
    if isinstance(model, type):
        if not issubclass(model, nn.Module):
            raise CompileError(f"@distribute decorates torch.nn.Module classes, not {model.__name__}")
        cls = model

        def construct(*args: Any, **kwargs: Any) -> DistributedModule:
            return DistributedModule(cls(*args, **kwargs), options)

        construct.__name__ = cls.__name__
        construct.__qualname__ = cls.__qualname__
        construct.__doc__ = cls.__doc__
        construct.__wrapped__ = cls
        return construct
    if not isinstance(model, nn.Module):
        raise CompileError(f"distribute() takes a torch.nn.Module, got {type(model).__name__}")
    return DistributedModule(model, options)
