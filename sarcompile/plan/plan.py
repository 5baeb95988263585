"""What a compiled model will do on N workers, before it runs: ``model.plan(...)``.

A :class:`Plan` has one row per IR op: its layer, the op, the residency of its rows
(what it reads -> what it gives), the strategy and why it was chosen, the bytes each worker receives per round and in total in
forward and backward, and what the op keeps for backward. Communication is derived from
the partition's halo sizes and the width of each op's rows, so it is exact: it equals
what the runtime's byte counters (:data:`sarcompile.dist.traffic.stats`) record.

This module holds what a plan is and how it prints (``print(plan)``, :meth:`Plan.to_dot`,
:meth:`Plan.kernel_sources`); :func:`sarcompile.plan.build.build_plan` makes one, from a
probe run of the program (:mod:`sarcompile.plan.traffic` for the bytes each op moves,
:mod:`sarcompile.plan.memory` for :meth:`Plan.memory_estimate`'s figures, two of them exact
-- saved activations and remote blocks alive at once -- and the kernels' workspace a
documented approximation). ``memory_estimate(inference=True)`` is the peak of a prediction
instead: one forward in eval mode under ``torch.no_grad()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sarcompile.codegen.gpu_compile import resources_tables
from sarcompile.codegen.kernel_cache import KernelSpec
from sarcompile.graph.graph import index_dtype
from sarcompile.plan.sizes import TypedWorkerStats, WorkerStats
from sarcompile.ir.vocab import Strategy

__all__ = ["OpPlan", "Plan", "Kernel", "NodeTable", "MemoryEstimate"]


@dataclass
class OpPlan:
    """One op of the plan. Byte lists have one entry per worker (what it receives).

    Example:

    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> op = sc.distribute(sc.nn.SAGEConv(2, 4)).plan(g, 2, x=torch.ones(3, 2)).ops[0]
    >>> op.layer, op.op, op.rows, str(op.strategy)
    ('', 'spmm(mean)', 'node -> node', 'direct')
    """

    name: str  # the fx node
    layer: str  # the layer it came from ("" for ops written in the model itself)
    op: str  # e.g. "spmm(mean)", "attention", "edge_softmax"
    strategy: Strategy  # direct | remat | stash | oneshot | local | allreduce
    reason: str
    row_bytes: int  # bytes of one node's row that crosses workers
    forward_bytes: list[int] = field(default_factory=list)
    backward_bytes: list[int] = field(default_factory=list)
    round_bytes: list[int] = field(default_factory=list)  # largest block a worker receives in one round
    saved: str = ""  # what the op keeps for backward
    comm: str = ""  # opt-in reduction (compression, staleness), "" for exact
    rows: str = ""  # residency: of its row inputs -> of its result, e.g. "node -> edge"
    relation: tuple[str, str, str] | None = None  # on a typed graph, the relation it aggregates over
    reused: bool = False  # its result is kept across steps (passes/reuse): computed in the first only


@dataclass
class Kernel:
    """A generated Triton kernel the plan runs on CUDA (``executor="auto"`` or
    ``"triton"``): which op uses it and for what, and its source as generated for CUDA."""

    op: str  # the fx node
    role: str  # "forward", "backward x", "backward edge_weight", ...
    name: str
    source: str
    spec: KernelSpec  # what it is generated from (codegen.gpu_compile compiles it)


@dataclass
class NodeTable:
    """A learnable table with one row per node of a type (see :mod:`sarcompile.graph.tables`):
    each worker holds, updates and keeps the gradient of its own rows only."""

    path: str  # the parameter's name in the model
    node_type: str
    row_bytes: int
    worker_bytes: list[int]  # the rows each worker holds (parameter only)


@dataclass
class MemoryEstimate:
    """Estimated peak bytes of one worker over a training step (or, from
    ``plan.memory_estimate(inference=True)``, a prediction), and where they go.

    Example:

    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> plan = sc.distribute(sc.nn.SAGEConv(2, 4)).plan(g, 2, x=torch.ones(3, 2))
    >>> worker0 = plan.memory_estimate()[0]
    >>> worker0.rank, worker0.peak_bytes == sum(worker0.breakdown.values())
    (0, True)
    """

    rank: int
    peak_bytes: int
    breakdown: dict[str, int]


@dataclass
class Plan:
    """The plan of a compiled model on a partitioned graph; ``print(plan)`` shows it.

    Example:

    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> plan = sc.distribute(sc.nn.SAGEConv(2, 4)).plan(g, 2, x=torch.ones(3, 2))
    >>> plan.num_parts, [str(op.strategy) for op in plan.ops]
    (2, ['direct'])
    >>> plan.forward_bytes(0) == sum(op.forward_bytes[0] for op in plan.ops)
    True
    """

    model: str
    mode: str
    num_parts: int
    workers: list[WorkerStats]
    ops: list[OpPlan]
    stages: list[tuple[str, str]]  # (pass, code after it): every stage as readable Python
    estimates: list[MemoryEstimate] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)  # generated kernels, per op and role
    warnings: list[str] = field(default_factory=list)  # e.g. stale or compressed attention
    tables: list[NodeTable] = field(default_factory=list)  # node tables held per worker (typed graphs)
    # Wall seconds of compiling: tracing, each pass, and "plan" (probing the program for
    # this plan's sizes). A program compiled once serves later plans and calls: its stages
    # keep the times of that compile.
    compile_seconds: dict[str, float] = field(default_factory=dict)
    # Remote blocks each exchange posts ahead of the one it computes on, and gradient
    # pushes it keeps in flight (sc.distribute's blocks_in_flight); None: no op exchanges rows.
    blocks_in_flight: int | None = None
    inference: list[MemoryEstimate] = field(default_factory=list)  # of a prediction: memory_estimate(inference=True)
    # Per worker, the bytes a checkpoint written in the background copies: memory_estimate(checkpoint=True)
    checkpoint_copy: list[int] = field(default_factory=list)

    def memory_estimate(self, inference: bool = False, checkpoint: bool = False) -> list[MemoryEstimate]:
        """Per worker: ``peak_bytes`` and a ``breakdown`` into node_data (the part's
        node tensors; planned from a graph, the features ``x`` alone), graph (the shard's index tensors),
        parameters, gradients,
        optimizer (if the plan was given one), saved_activations (what autograd keeps for
        backward but the parameters and the input features, counted above; exact), remote_blocks (the most remote rows alive at once, exact),
        exchange_buffers (besides those, the rows gathered to send and the gradients on
        their way back at the exchange's peak; close, the runtime's order of frees aside),
        workspace (kernel temporaries and gradient buffers: an approximation), kernel_code
        (the libraries' code pages a step maps in on first use: a measured constant) and, with
        ``staleness`` or ``bounded_staleness``, link_cache (the remote blocks each such op
        keeps between iterations). With ``compress``, traffic is counted as sent (packed).

        With ``inference``, the peak of a prediction (``python -m sarcompile.predict``): one
        forward of the model in eval mode under ``torch.no_grad()``. Nothing is kept for a
        backward: no gradients, optimizer state, saved activations or stashed blocks, and
        stale or compressed exchanges run exactly. Its breakdown: node_data, graph,
        parameters (node_tables: the rows alone), activations (the most forward values alive
        at once, the output among them: exact, as saved_activations), remote_blocks and
        exchange_buffers of the forward's exchanges alone (a ``stash`` or ``oneshot`` op's
        blocks freed when it returns), workspace (the per-edge temporaries above, without
        node-row gradient buffers: an approximation) and kernel_code.

        With ``checkpoint``, a training step while a checkpoint is written in the
        background (``python -m sarcompile.train`` with ``--checkpoint-every`` below the
        run's epochs): the breakdown adds checkpoint_copy, the copy the write holds until
        it is on disk: the worker's rows of every node table and their optimizer state,
        with their int64 ids, its links' stale caches, and on worker 0 the parameters and
        their optimizer state (exact but for buffers, RNG state and residuals: small)."""
        estimates = self.inference if inference else self.estimates
        if not checkpoint or inference:
            return list(estimates)
        return [MemoryEstimate(e.rank, e.peak_bytes + copy, {**e.breakdown, "checkpoint_copy": copy})
                for e, copy in zip(estimates, self.checkpoint_copy)]

    def compile_summary(self) -> str:
        """One line: the compile's wall time in all and its slowest stages."""
        if not self.compile_seconds:
            return "compile time not recorded"
        slowest = sorted(self.compile_seconds.items(), key=lambda kv: -kv[1])[:4]
        return (f"compiled in {sum(self.compile_seconds.values()):.2f} s ("
                + ", ".join(f"{name} {t:.3f} s" for name, t in slowest) + ", ...)")

    def forward_bytes(self, rank: int) -> int:
        """Bytes worker ``rank`` receives in one forward pass."""
        return sum(op.forward_bytes[rank] for op in self.ops)

    def backward_bytes(self, rank: int) -> int:
        """Bytes worker ``rank`` receives in one backward pass (parameter all-reduce not included)."""
        return sum(op.backward_bytes[rank] for op in self.ops)

    def stage(self, name: str) -> str:
        """The program's code after the pass ``name`` (``trace``, ``lower``, ``fuse``, ...)."""
        for stage, code in self.stages:
            if stage == name:
                return code
        raise KeyError(f"no stage {name!r}; stages are {[s for s, _ in self.stages]}")

    def __str__(self) -> str:
        head = f"plan of {self.model}: mode={self.mode}, {self.num_parts} workers"
        # Over a typed graph, which relation each op aggregates over; a one-type plan reads as it always did.
        typed = bool(self.workers) and isinstance(self.workers[0], TypedWorkerStats)
        header = ("#", "layer", "op", *(("relation",) if typed else ()), "rows", "strategy", "round (max)",
                  "fwd recv (max)", "bwd recv (max)", "saved for backward")
        rows = [
            (
                str(i),
                op.layer or "-",
                op.op,
                *((_relation_name(op.relation),) if typed else ()),
                op.rows,
                f"{op.strategy}{f' ({op.comm})' if op.comm else ''}{', reused' if op.reused else ''}",
                _size(max(op.round_bytes, default=0)),
                _size(max(op.forward_bytes, default=0)),
                _size(max(op.backward_bytes, default=0)),
                op.saved,
            )
            for i, op in enumerate(self.ops, 1)
        ]
        why = [f"  {i}. {op.strategy}: {op.reason}" for i, op in enumerate(self.ops, 1) if op.reason]
        per_worker = [
            f"  worker {r}: forward {_size(self.forward_bytes(r))}, backward {_size(self.backward_bytes(r))}"
            for r in range(self.num_parts)
        ]
        keys = list(self.estimates[0].breakdown) if self.estimates else []
        predicting = {e.rank: e.peak_bytes for e in self.inference}
        memory = _table(
            ("worker", "peak", "predict", *keys),
            [(str(e.rank), _size(e.peak_bytes), _size(predicting.get(e.rank, 0)), *(_size(e.breakdown[k]) for k in keys))
             for e in self.estimates],
        )
        kernels = [f"  {k.op} {k.role}: {k.name}" for k in self.kernels] or ["  none (torch code only)"]
        warned = ["warnings:", *(f"  {w}" for w in self.warnings)] if self.warnings else []
        overlap = [] if self.blocks_in_flight is None else [
            f"overlap (blocks_in_flight={self.blocks_in_flight}): remote blocks posted ahead of the one computed on: "
            f"{self.blocks_in_flight} (oneshot: all); rounds of gradients in flight: {self.blocks_in_flight}"]
        return "\n".join(
            [head, *_table(header, rows), *overlap, *warned, "why:", *why, "received per step:", *per_worker,
             *(self._typed_lines() if typed else ()),
             "estimated memory per worker (peak: a training step; predict: a prediction, "
             "memory_estimate(inference=True)):", *("  " + line for line in memory),
             "generated kernels on CUDA (sources: plan.kernels, sarcompile plan --show-kernels):", *kernels]
        )

    def _typed_lines(self) -> list[str]:
        """Rows of each node type and the sizes of each relation per worker (smallest to
        largest worker), and the node tables each worker holds its rows of."""
        types = list(self.workers[0].nodes)
        relations = list(self.workers[0].relations)

        def spread(values: list[int]) -> str:
            return f"{min(values)}" if min(values) == max(values) else f"{min(values)}..{max(values)}"

        lines = ["node types per worker:", *("  " + line for line in _table(
            ("type", "rows"), [(t, spread([w.nodes[t] for w in self.workers])) for t in types]))]
        lines += ["relations per worker:", *("  " + line for line in _table(
            ("relation", "edges", "halo rows"),
            [(_relation_name(rel), spread([w.relations[rel].edges for w in self.workers]),
              spread([sum(w.relations[rel].halo) for w in self.workers])) for rel in relations]))]
        if self.tables:
            lines += ["node tables (each worker holds its own rows; never all-reduced):", *("  " + line for line in _table(
                ("table", "type", "row", "per worker"),
                [(t.path, t.node_type, _size(t.row_bytes), f"{_size(min(t.worker_bytes))}..{_size(max(t.worker_bytes))}")
                 for t in self.tables]))]
        return lines

    def kernel_sources(self, arch: str | None = None) -> str:
        """Every generated kernel once, with the ops that use it, then its source; with
        ``arch`` (``"sm_80"``, ``"sm_90"``), also its registers, spills and shared memory
        there per autotuner configuration, compiled with the index width of the plan's
        largest block (:mod:`sarcompile.codegen.gpu_compile`: needs triton, no GPU)."""
        users: dict[str, list[str]] = {}
        kernels: dict[str, Kernel] = {}
        for k in self.kernels:
            users.setdefault(k.name, []).append(f"{k.op} ({k.role})")
            kernels[k.name] = k
        resources = {name: "" for name in kernels}
        if arch is not None and kernels:
            index = self._index_width()
            tables = resources_tables([k.spec for k in kernels.values()], arch, index)
            for name, table in zip(kernels, tables):
                lines = "\n".join(f"#{line}" for line in table.splitlines())
                resources[name] = f"# on {arch} with {index} indices, per configuration:\n{lines}\n"
        return "\n".join(
            f"# ===== {name}: used by {', '.join(users[name])}\n{resources[name]}{k.source}"
            for name, k in kernels.items()
        )

    def _index_width(self) -> str:
        """The index width of the plan's largest block (:func:`sarcompile.graph.graph.index_dtype`)."""
        shards = [s for w in self.workers for s in (w.relations.values() if isinstance(w, TypedWorkerStats) else [w])]
        wide = any(index_dtype(s.nodes, s.nodes + sum(s.halo), s.edges) == torch.int64 for s in shards)
        return "int64" if wide else "int32"

    def to_dot(self) -> str:
        """Graphviz source: the ops in program order, labelled with strategy and traffic."""
        lines = ["digraph plan {", "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
        for i, op in enumerate(self.ops):
            label = f"{op.layer or '-'}\\n{op.op}\\n{op.strategy}\\nfwd {_size(max(op.forward_bytes, default=0))}"
            lines.append(f'  op{i} [label="{label}"];')
            if i:
                lines.append(f"  op{i - 1} -> op{i};")
        lines.append("}")
        return "\n".join(lines)


def _relation_name(rel: tuple[str, str, str] | None) -> str:
    return "-" if rel is None else f"{rel[0]} -{rel[1]}-> {rel[2]}"


def _size(n: int) -> str:
    if n == 0:
        return "0"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in (header, *rows)]
