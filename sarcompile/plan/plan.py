"""What a compiled model will do on N workers, before it runs: ``model.plan(...)``.

A :class:`Plan` has one row per IR op: its layer, the op, the residency of its rows
(what it reads -> what it gives), the strategy and why it was chosen, the bytes each worker receives per round and in total in
forward and backward, and what the op keeps for backward. Communication is derived from
the partition's halo sizes and the width of each op's rows, so it is exact: it equals
what the runtime's byte counters (:data:`sarcompile.runtime.comm.stats`) record.

Row widths, which inputs need gradients and what autograd keeps for backward come from
running the compiled program once on a small synthetic graph (a one-worker shard):
widths do not depend on the number of nodes, and every saved tensor is scaled by the
size it is proportional to (nodes, or edges of the graph variant it belongs to).

Every figure comes from the ops' definitions (:class:`~sarcompile.ir.opdef.OpDef`: what
each exchanges, keeps and holds as temporaries): the plan is a walk over them, with no
rule of its own for any op. :meth:`Plan.memory_estimate` adds these up per worker. Two parts are exact -- saved
activations and remote blocks alive at once, which tests compare with the runtime's own
counters; the workspace of the kernels is a documented approximation.
``memory_estimate(inference=True)`` is the peak of a prediction instead: one forward in
eval mode under ``torch.no_grad()``, whose live activations come from a second probe run
of the eval-mode program (:class:`_LiveProbe`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from sarcompile import logs
from torch.utils._pytree import tree_leaves

from sarcompile.codegen.gpu_compile import resources_tables
from sarcompile.codegen.kernel_cache import KernelSpec
from sarcompile.graph.graph import index_dtype
from sarcompile.ir.opdef import AllReduce, Halo, OpDef, Push, Temporaries, definition
from sarcompile.runtime.comm import offline
from sarcompile.runtime.link import Wire
from sarcompile.dist.pool import MIN_BYTES
from sarcompile.plan.probe import probe_for
from sarcompile.plan.sizes import TypedWorkerStats, WorkerStats, worker_stats
from sarcompile.ir.vocab import Strategy

__all__ = ["OpPlan", "Plan", "Kernel", "NodeTable", "MemoryEstimate", "WorkerStats", "TypedWorkerStats", "worker_stats",
           "build_plan"]


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
        The exchange's buffer pool (:mod:`sarcompile.dist.pool`) holds about
        remote_blocks + exchange_buffers between exchanges too.

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
        exchange = [e.breakdown.get("remote_blocks", 0) + e.breakdown.get("exchange_buffers", 0)
                    for e in self.estimates]
        pool = [] if self.blocks_in_flight is None or not exchange else [
            f"  the exchange's buffers of {MIN_BYTES / 2**20:g} MiB and more (CPU) come from a pool that keeps them "
            f"between exchanges and steps: at most about remote_blocks + exchange_buffers (up to "
            f"{_size(max(exchange))} a worker), less the blocks stash and oneshot ops keep; sc.empty_cache() "
            "releases its idle ones"]
        kernels = [f"  {k.op} {k.role}: {k.name}" for k in self.kernels] or ["  none (torch code only)"]
        warned = ["warnings:", *(f"  {w}" for w in self.warnings)] if self.warnings else []
        overlap = [] if self.blocks_in_flight is None else [
            f"overlap (blocks_in_flight={self.blocks_in_flight}): remote blocks posted ahead of the one computed on: "
            f"{self.blocks_in_flight} (oneshot: all); rounds of gradients in flight: {self.blocks_in_flight}"]
        return "\n".join(
            [head, *_table(header, rows), *overlap, *warned, "why:", *why, "received per step:", *per_worker,
             *(self._typed_lines() if typed else ()),
             "estimated memory per worker (peak: a training step; predict: a prediction, "
             "memory_estimate(inference=True)):", *("  " + line for line in memory), *pool,
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


class _Probe(fx.Interpreter):
    """Runs the program once on a small shard; records each IR op's bound arguments and
    every tensor autograd saves for backward (by storage, so shared ones count once)."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.seen: dict[str, dict[str, Any]] = {}
        self.saved: dict[int, tuple[int, tuple[int, ...]]] = {}  # storage -> (bytes, shape)

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        op = definition(n)
        if op is not None:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            self.seen[n.name] = {**op.bind(args, kwargs), "result": result}
        return result

    def run_and_record(self, args: list[Any], counted: list[torch.Tensor]) -> None:
        """Run on ``args``; ``counted``: inputs the estimate counts under another name --
        node tables (parameters) and node features (node data) -- which a saved tensor does
        not count as an activation, as the module's own parameters."""
        elsewhere = {t.untyped_storage().data_ptr() for t in [*self.module.parameters(), *counted]}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in elsewhere:  # (a first layer's linear keeps its input x, say)
                self.saved[storage.data_ptr()] = (storage.nbytes(), tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            self.run(*args)


class _LiveProbe(fx.Interpreter):
    """Runs the program once under ``torch.no_grad()``, as a prediction does, and records
    after each node the tensors alive: its result and every earlier value a later node
    still reads (the interpreter frees each after its last use), by storage, less those
    counted under another name (parameters, node tables, features)."""

    def __init__(self, gm: fx.GraphModule, elsewhere: list[torch.Tensor]):
        super().__init__(gm, garbage_collect_values=True)
        self.elsewhere = {t.untyped_storage().data_ptr() for t in [*gm.parameters(), *elsewhere]}
        self.moments: list[dict[int, tuple[int, tuple[int, ...]]]] = []  # per node: storage -> (bytes, shape)

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        live = {}
        for t in tree_leaves([list(self.env.values()), result]):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.elsewhere:
                storage = t.untyped_storage()
                live[storage.data_ptr()] = (storage.nbytes(), tuple(t.shape))
        self.moments.append(live)
        return result

    def peak(self, sizes: dict[int, int]) -> int:
        """The most bytes alive at once on a worker whose sizes ``sizes`` maps the probe's to."""
        return max((_scale_saved(live, sizes) for live in self.moments), default=0)


# The libraries' code a training step runs for the first time (libtorch's sparse, scatter
# and autograd paths, gloo) is paged in from disk and counts in the resident size like data:
# 11-14 MiB per process with torch 2.13 on CPU, whatever the graph or the number of workers
# (benchmarks/vs_dgl.py's ledger, "code_pages"). Without it the estimate was 18% low at
# N = 8, where the data is small.
KERNEL_CODE_BYTES = 12 * 2**20


def _scale_saved(saved: dict[int, tuple[int, tuple[int, ...]]], sizes: dict[int, int]) -> int:
    """Bytes the probe's saved tensors take on a worker: each scales with the size (rows
    of a node type, or the edges of one graph variant) that one of its dims equals;
    ``sizes`` maps the probe's sizes to the worker's."""
    total = 0
    for nbytes, shape in saved.values():
        dim = next((d for d in shape if d in sizes), None)
        total += nbytes if dim is None else nbytes * sizes[dim] // dim
    return total


def _wants(op: OpDef, args: dict[str, Any]) -> frozenset[str]:
    """The op's row arguments that need a gradient in the probe run."""
    return frozenset(name for name in op.inputs if isinstance(args.get(name), torch.Tensor) and args[name].requires_grad)


def _rows(op: OpDef, args: dict[str, Any]) -> str:
    """``node -> edge``: the residency of the op's row arguments given, and of its result."""
    given = sorted({str(r) for name, r in op.inputs.items() if args.get(name) is not None})
    return f"{'+'.join(given)} -> {op.output}"


def _optimizer_factor(optimizer: Any) -> int:
    """Tensors of state per parameter element that ``optimizer`` keeps."""
    if optimizer is None:
        return 0
    name = optimizer if isinstance(optimizer, str) else type(optimizer).__name__
    name = name.lower()
    if name.startswith("adam"):
        return 2
    if name == "sgd":
        momentum = 0.0 if isinstance(optimizer, str) else optimizer.defaults.get("momentum", 0.0)
        return 1 if (isinstance(optimizer, str) or momentum) else 0
    raise ValueError(f"unknown optimizer {name!r}: give 'adam', 'sgd' or an optimizer instance")


@dataclass
class _Exchange:
    """What the memory estimate needs of one exchanging op, per worker in round order
    (q = r-1, r-2, ...): the bytes of each block received and of the rows sent in the same
    round, and which directions move blocks (fetch) or gradients (push)."""

    blocks: list[list[int]]
    sends: list[list[int]]
    keeps: bool  # the remote blocks stay for backward
    forward: tuple[bool, bool]  # (fetches, pushes)
    backward: tuple[bool, bool]
    row_bytes: int
    temporaries: Temporaries
    stats: list[WorkerStats]  # per worker, the sizes of the graph the op aggregates over
    in_flight: int = 1  # blocks posted ahead, and pushes not yet completed (blocks_in_flight)
    over_block: bool = False  # backward writes the gradient it pushes over the block it fetched again


def _round_peak(blocks: list[int], sends: list[int], fetch: bool, push: bool, in_flight: int = 1,
                over_block: bool = False) -> int:
    """Most bytes alive at once over one exchange's rounds, in the order
    ``comm._sync_rounds`` keeps. Round k visits its block, with the next ``in_flight``
    blocks arriving meanwhile, each with the rows sent for it gathered into their own
    buffer (with none in flight, a block's rows go out while it arrives). When gradients go
    back, the visit makes the block's gradient (written over the block if ``over_block``).
    Fetching too, it goes out once the rows sent ahead are gone, with the owner's gradient
    for the rows sent arriving, and completes before the next block is posted. Pushing
    alone, the last ``in_flight`` rounds' gradients (each that block's gradient and the
    owner's, arriving) are on their way during a visit."""

    def ahead(k: int, sent: bool = True) -> int:
        return sum(blocks[j] + (sends[j] if sent else 0) for j in range(k + 1, min(k + 1 + in_flight, len(blocks))))

    peak = 0
    for k, block in enumerate(blocks):
        arriving = block + (0 if in_flight else sends[k])
        if fetch and push:
            visiting = block + (0 if over_block else block) + ahead(k)
            now = max(arriving, visiting, block + sends[k] + ahead(k, sent=False))
        elif fetch:
            now = max(arriving, block + ahead(k))
        elif push:
            now = block + sends[k] + sum(blocks[j] + sends[j] for j in range(max(k - in_flight, 0), k))
        else:
            now = 0
        peak = max(peak, now)
    return peak


def _remote_peak(ops: list[_Exchange], r: int, buffers: bool, backward: bool = True) -> int:
    """Most remote bytes alive at worker ``r`` at once over a step, ``ops`` in program
    order: the blocks received alone, or with ``buffers`` also the rows gathered to send
    and the gradients on their way back. Without ``backward`` (a forward under
    ``torch.no_grad()``), an op that keeps its blocks frees them when it returns."""
    kept, peak = 0, 0

    def rounds(op: _Exchange, fetch: bool, push: bool, blocks: list[int]) -> int:
        sends = op.sends[r] if buffers else [0] * len(blocks)
        return _round_peak(blocks, sends, fetch, push and buffers, op.in_flight, op.over_block)

    for op in ops:  # forward: kept blocks pile up until backward
        blocks = op.blocks[r]
        now = sum(blocks) + rounds(op, False, op.forward[1], blocks) if op.keeps else rounds(op, *op.forward, blocks)
        peak = max(peak, kept + now)
        kept += sum(blocks) if op.keeps and backward else 0
    if not backward:
        return peak
    for op in reversed(ops):  # backward: each op frees its own
        peak = max(peak, kept + rounds(op, *op.backward, op.blocks[r]))
        kept -= sum(op.blocks[r]) if op.keeps else 0
    return peak


def build_plan(
    model_name: str,
    mode: str,
    gm: fx.GraphModule,
    stages,
    workers: list[WorkerStats] | list[TypedWorkerStats],
    x: torch.Tensor | dict[str, torch.Tensor] | None,
    optimizer: Any = None,
    compile_seconds: dict[str, float] | None = None,
    served: fx.GraphModule | None = None,
) -> Plan:
    """The plan of the partitioned program ``gm`` for workers of the given sizes; ``x``
    the example features (per node type, for a program over a typed graph);
    ``compile_seconds`` the program's compile times by stage, to which the plan adds its own;
    ``served`` the program a prediction runs (the model's in eval mode; by default ``gm``),
    whose forward under ``torch.no_grad()`` sizes the inference estimate."""
    start = time.perf_counter()
    probe = _Probe(gm)
    shape = probe_for(gm, x)

    def inputs() -> tuple[list[Any], list[torch.Tensor]]:
        """Fresh probe arguments, and those of them counted under another name: node
        tables (parameters) and features (node data). A prediction's program takes the
        same arguments as training's."""
        args = shape.inputs()
        tables = [a for a, n in zip(args, (n for n in gm.graph.nodes if n.op == "placeholder")) if "table" in n.meta]
        return args, tables + shape.features(args)

    with offline():  # the probes run on this process alone
        probe.run_and_record(*inputs())
        args, counted = inputs()
        live = _LiveProbe(gm if served is None else served, counted)
        with torch.no_grad():
            live.run(*args)
    n = len(workers)
    ops, comm = [], []
    link_cache = [0] * n  # stale or pipelined sites keep their remote blocks across iterations
    for node in gm.graph.nodes:
        op = definition(node)
        if op is None:
            continue
        args = probe.seen[node.name]
        strategy = node.kwargs.get("strategy", Strategy.LOCAL)
        row = OpPlan(node.name, _layer(node), op.describe(args), strategy, node.meta.get("strategy_reason", ""), 0,
                     [0] * n, [0] * n, [0] * n, op.saved(args), rows=_rows(op, args))
        ops.append(row)
        if isinstance(op.exchange, AllReduce):  # a collective, no halo
            forward, backward = op.exchange.bytes(args)
            row.forward_bytes, row.backward_bytes, row.reason = [forward] * n, [backward] * n, "a reduction over all workers' rows"
            continue
        if op.exchange is None:
            row.saved = "no remote rows"
            continue
        row.relation = shape.relation(node)
        if isinstance(op.exchange, Halo):
            comm.append(_halo_traffic(row, node, op, args, shape.stats(node, workers), link_cache))
            row.saved += "; remote blocks kept" if strategy.keeps_blocks else "; no remote rows"
        elif isinstance(op.exchange, Push):
            comm.append(_push_traffic(row, op, args, shape.stats(node, workers)))

    params = sum(p.numel() * p.element_size() for p in gm.parameters())
    factor = _optimizer_factor(optimizer)
    estimates, inference, copy = [], [], []
    for r, w in enumerate(workers):
        remote = _remote_peak(comm, r, buffers=False)
        breakdown = {
            "node_data": shape.node_data_bytes(w),
            "graph": shape.graph_bytes(w, r),
            "parameters": params,
            "gradients": params,
            "optimizer": params * factor,
            "saved_activations": _scale_saved(probe.saved, shape.sizes(w)),
            "remote_blocks": remote,
            "exchange_buffers": _remote_peak(comm, r, buffers=True) - remote,
            "workspace": _workspace(comm, r),
            "kernel_code": KERNEL_CODE_BYTES,
        }
        if shape.tables:  # a worker's rows of each, their gradients and optimizer state
            breakdown["node_tables"] = shape.table_bytes(w) * (2 + factor)
        if any(link_cache):
            breakdown["link_cache"] = link_cache[r]
        estimates.append(MemoryEstimate(r, sum(breakdown.values()), breakdown))
        ids = sum(w.nodes.get(ntype, 0) for _, ntype, _ in shape.tables) * 8  # int64 global ids, per table
        copy.append((params if r == 0 else 0) * (1 + factor) + shape.table_bytes(w) * (1 + factor) + ids
                    + link_cache[r])
        forward = _remote_peak(comm, r, buffers=False, backward=False)
        predicting = {
            "node_data": breakdown["node_data"],
            "graph": breakdown["graph"],
            "parameters": params,
            "activations": live.peak(shape.sizes(w)),
            "remote_blocks": forward,
            "exchange_buffers": _remote_peak(comm, r, buffers=True, backward=False) - forward,
            "workspace": _workspace(comm, r, node_rows=False),
            "kernel_code": KERNEL_CODE_BYTES,
        }
        if shape.tables:
            predicting["node_tables"] = shape.table_bytes(w)
        inference.append(MemoryEstimate(r, sum(predicting.values()), predicting))
    kernels = [
        Kernel(node.name, role, spec.name, spec.render("cuda"), spec)
        for node in gm.graph.nodes
        if node.name in probe.seen
        for role, spec in definition(node).kernels(probe.seen[node.name])
    ]
    warned = [node.meta["comm_warning"] for node in gm.graph.nodes if "comm_warning" in node.meta]
    tables = [NodeTable(path, ntype, row, [w.nodes.get(ntype, 0) * row for w in workers])
              for path, ntype, row in shape.tables]
    seconds = {**(compile_seconds or {}), "plan": time.perf_counter() - start}
    in_flight = {node.kwargs["in_flight"] for node in gm.graph.nodes if "in_flight" in node.kwargs}
    plan = Plan(model_name, mode, n, workers, ops, list(stages), estimates, kernels, warned, tables, seconds,
                max(in_flight) if in_flight and n > 1 else None, inference, copy)
    if "plan" in logs.ON:
        peaks = ", ".join(f"{_size(e.peak_bytes)}" for e in estimates)
        logs.log("plan", f"{model_name} on {n} workers, mode={mode}: {len(ops)} ops, estimated peak per worker "
                 f"{peaks}; {plan.compile_summary()}" + (f"\n{plan}" if logs.verbose("plan") else ""))
    return plan


def _layer(node: fx.Node) -> str:
    """The layer an op came from: set by the lower pass for lowered layers, else the
    innermost module fx traced through (e.g. a BatchNorm)."""
    if node.meta.get("layer"):
        return node.meta["layer"]
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    return stack[-1][0] if stack else ""


def _halo_traffic(row: OpPlan, node: fx.Node, op: OpDef, args: dict[str, Any], workers: list[WorkerStats],
                  link_cache: list[int]) -> _Exchange:
    """Fill in the traffic of an op that exchanges halo rows, by its definition: which rows
    it sends, whether backward pushes gradients and reads the remote rows again, as the
    runtime decides it. Returns what the memory estimate needs of it."""
    n, strategy = len(workers), row.strategy
    wants = _wants(op, args)
    width = op.exchange.row_bytes(args)
    pushes = op.exchange.pushes_gradients(args, wants)
    refetch = strategy.refetches and op.exchange.reads_remote_in_backward(args, wants)
    wire_row = width
    row.reused = bool(node.kwargs.get("reuse")) and not wants
    policy = None if row.reused else node.meta.get("comm")  # (a kept result is made exactly, once)
    if policy is not None:  # bytes of a step that exchanges; stale caches stay for backward
        sent = args[op.exchange.sends[0]]
        wire_row = Wire(policy, 0).wire_bytes(1, width // sent.element_size(), sent.dtype) if policy.bits else width
        cached = bool(policy.staleness > 1 or policy.bounded)
        refetch = refetch and not cached
        row.comm = policy.describe()
        for r, w in enumerate(workers):
            link_cache[r] += sum(w.halo) * width if cached else 0
    recv = [sum(w.halo) * wire_row for w in workers]
    sent_rows = [sum(workers[p].halo[r] for p in range(n)) * wire_row for r in range(n)]
    blocks, sends = _round_bytes(workers, width)
    row.row_bytes = wire_row
    row.forward_bytes = recv
    if row.reused:  # (the first step's exchange still sizes the estimate)
        row.forward_bytes = [0] * n
        row.reason += "; the input is the call's and needs no grad: received in the first step only, then reused"
    row.backward_bytes = [(sent_rows[r] if pushes else 0) + (recv[r] if refetch else 0) for r in range(n)]
    row.round_bytes = [max(b, default=0) for b in blocks]
    over_block = refetch and policy is None and op.exchange.grads_over_block
    return _Exchange(blocks, sends, strategy.keeps_blocks, (True, False), (refetch, pushes), width,
                     op.temporaries(args, width), workers, node.kwargs.get("in_flight", 1), over_block)


def _round_bytes(workers: list[WorkerStats], width: int) -> tuple[list[list[int]], list[list[int]]]:
    """Per worker, in round order k = 1..N-1: the block received (from q = r-k) and the
    rows sent (to p = r+k), in bytes."""
    n = len(workers)
    blocks = [[workers[r].halo[(r - k) % n] * width for k in range(1, n)] for r in range(n)]
    sends = [[workers[(r + k) % n].halo[r] * width for k in range(1, n)] for r in range(n)]
    return blocks, sends


def _push_traffic(row: OpPlan, op: OpDef, args: dict[str, Any], workers: list[WorkerStats]) -> _Exchange:
    """An op that reduces onto source rows: forward, each worker receives the partial
    results for its rows that its peers hold (the rows it would send in a halo fetch);
    backward, the halo rows of the gradient, as a halo op's forward. As
    :func:`_halo_traffic`, returns what the memory estimate needs."""
    n, width = len(workers), op.exchange.row_bytes(args)
    halo = [sum(w.halo) * width for w in workers]
    owned = [sum(workers[p].halo[r] for p in range(n)) * width for r in range(n)]
    blocks, sends = _round_bytes(workers, width)
    row.row_bytes, row.forward_bytes, row.backward_bytes = width, owned, halo
    row.round_bytes = [max(b, default=0) for b in blocks]
    row.reason = "partial results for other workers' rows go to their owners"
    # Forward sends partial results for the halo rows (a push); backward fetches them.
    return _Exchange(blocks, sends, False, (False, True), (True, False), width, op.temporaries(args, width), workers)


def _workspace(comm: list[_Exchange], r: int, node_rows: bool = True) -> int:
    """Temporaries of the most demanding op at worker ``r`` -- an approximation: node-row
    gradient buffers (unless not ``node_rows``: a forward alone, whose node rows are its
    results, counted among the activations), per-edge temporaries of the largest block of
    the op's graph (kernels run one block at a time) and bounded per-edge chunks.

    Gradients on their way back to their owners are remote bytes (:func:`_round_peak`)."""
    return max(
        (e.temporaries.node_rows * e.stats[r].nodes * e.row_bytes * node_rows
         + e.stats[r].largest_block(r) * e.temporaries.edge_bytes + e.temporaries.chunk_bytes for e in comm),
        default=0,
    )
