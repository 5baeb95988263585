"""``sc.distribute``: a model compiled per call shape, on one machine or as a worker.

:class:`DistributedModule` wraps the user's model. Each call finds the call's graphs
(:mod:`.call_graphs`) and its shape (:mod:`.call_shape`), compiles a program for a new shape
by the pipeline (:mod:`.pipeline`, the passes listed in :data:`sarcompile.compile.passes.PIPELINE`)
and runs it; ``model.plan(...)`` says what the program will do on N workers before it runs.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch import nn

from sarcompile.errors import CompileError
from sarcompile.graph.graph import Graph
from sarcompile.graph.hetero import HeteroGraph, HeteroShard
from sarcompile.compile.passes.context import CompileOptions
from sarcompile.plan.build import build_plan
from sarcompile.plan.plan import Plan
from sarcompile.plan.sizes import TypedWorkerStats, WorkerStats, worker_stats
from sarcompile.graph.shard import ShardGraph
from sarcompile.graph.tables import shard_rows, shard_tables
from sarcompile.nn import LAYER_STREAMS, RandomStream

from sarcompile.compile.call_graphs import find_graphs, kept_graphs
from sarcompile.compile.call_shape import CallShape, example_features, table_count, typed_call
from sarcompile.compile.pipeline import Program, compile_program
__all__ = ["Program", "compile_program", "distribute", "DistributedModule"]


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
            x = example_features(source)
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
                call = typed_call(self._orig.forward, workers, x)
            else:
                call = CallShape.default(self._orig.forward, x=x, kept=kept_graphs(self._orig, self._converted))
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
        graphs = find_graphs(self._orig, args, kwargs, self._converted)
        graph, args, kwargs = graphs.first, graphs.args, graphs.kwargs
        call = CallShape.of_call(self._orig.forward, args, kwargs, graphs.where, graphs.kept,
                                 table_count(self._orig, graph))
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
