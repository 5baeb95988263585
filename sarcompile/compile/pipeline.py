"""Running the pipeline (:data:`sarcompile.compile.passes.PIPELINE`) on a model: trace it,
then each pass whose ``when`` holds, keeping every stage's code for inspection when asked
for (a plan, ``model.program()``, ``SARCOMPILE_LOGS=passes``).

A single machine runs the passes for ``ALWAYS`` (and ``TABLES`` where the model has node
tables); a worker's program adds the ``WORKERS`` ones. A program compiled by a call runs
without its stages' code (see :class:`_PassModule`)."""

from __future__ import annotations


import functools
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import torch.fx as fx
from torch import nn

from sarcompile import logs
from sarcompile.errors import CompileError
from sarcompile.compile.libraries import load_available
from sarcompile.ir.lowering import has_lowering
from sarcompile.compile.passes import PIPELINE, When
from sarcompile.compile.passes.context import CompileOptions, PassContext
from sarcompile.ir.node_info import info, set_info
from sarcompile.ir.probe import Input
from sarcompile.compile.tables import compile_with_tables, input_type
from sarcompile.graph.tables import NODES
from sarcompile.compile.function_swaps import generated_wraps_dropped
from sarcompile.compile.trace import trace


from sarcompile.compile.call_shape import CallShape
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
    """Run the pipeline on ``model`` as called with ``call``; a single machine skips the
    passes that run only on workers (``partitioned``: for N workers). ``stages``: keep every stage's code
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
            set_info(node, input=inputs[node.target])
        if node.op == "placeholder" and node.target in constants:  # (unused: forward was traced with it)
            set_info(node, constant=(constants[node.target].value,))
    stages = [("trace", gm.stage_code())] if keep else []
    seconds = {"trace": time.perf_counter() - start}
    ctx = PassContext(**{f.name: getattr(options, f.name) for f in fields(CompileOptions)},
                      distributed=partitioned, stream=stream)
    for p in PIPELINE:
        if p.when is When.WORKERS and not partitioned or p.when is When.TABLES and not tables:
            continue
        start = time.perf_counter()
        gm = p.run(gm, ctx)
        seconds[p.name] = time.perf_counter() - start
        if keep:
            stages.append((p.name, p.show(gm) if p.show else gm.stage_code()))
    gm.finish()
    if "passes" in logs.ON:
        for name, code in stages:
            logs.log("passes", f"{type(model).__name__} after {name} ({seconds[name] * 1e3:.1f} ms):\n{code.strip()}")
    order = {info(n).table: input_type(info(n).input) for n in gm.graph.nodes
             if n.op == "placeholder" and info(n).table is not None}
    return Program(gm, stages, order, seconds)
