"""What a compiled model will do on N workers, before it runs: ``model.plan(...)``.

A :class:`Plan` has one row per op that touches the graph: its layer, the op, the
strategy and why it was chosen, the bytes each worker receives per round and in total in
forward and backward, and what the op keeps for backward. Communication is derived from
the partition's halo sizes and the width of each op's rows, so it is exact: it equals
what the runtime's byte counters (:data:`sarcompile.runtime.comm.stats`) record.

Row widths and which inputs need gradients come from running the compiled program once
on a small synthetic graph (widths do not depend on the number of nodes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from .graph import Graph
from .ops import OpDef

__all__ = ["OpPlan", "Plan", "halo_matrix", "build_plan"]


@dataclass
class OpPlan:
    """One op of the plan. Byte lists have one entry per worker (what it receives)."""

    name: str  # the fx node
    layer: str  # the layer it came from ("" for ops written in the model itself)
    op: str  # e.g. "spmm(mean)", "attention", "edge_softmax"
    strategy: str  # direct | remat | stash | oneshot | local
    reason: str
    row_bytes: int  # bytes of one node's row that crosses workers
    forward_bytes: list[int] = field(default_factory=list)
    backward_bytes: list[int] = field(default_factory=list)
    round_bytes: list[int] = field(default_factory=list)  # largest block a worker receives in one round
    saved: str = ""  # what the op keeps for backward


@dataclass
class Plan:
    """The plan of a compiled model on a partitioned graph; ``print(plan)`` shows it."""

    model: str
    mode: str
    num_parts: int
    halo: list[list[int]]  # halo[r][q]: rows worker r receives from q per aggregation
    ops: list[OpPlan]
    stages: list[tuple[str, str]]  # (pass, code after it): every stage as readable Python

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
        header = ("#", "layer", "op", "strategy", "round (max)", "fwd recv (max)", "bwd recv (max)", "saved for backward")
        rows = [
            (
                str(i),
                op.layer or "-",
                op.op,
                op.strategy,
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
        return "\n".join([head, *_table(header, rows), "why:", *why, "received per step:", *per_worker])

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


def halo_matrix(
    source: Any, num_parts: int | None = None, method: str | torch.Tensor = "metis", seed: int = 0
) -> list[list[int]]:
    """Halo sizes from a partition directory, or from partitioning a graph in memory with
    ``method`` (a partition method, or an explicit part-per-node tensor)."""
    from .errors import CompileError
    from .partitioning import assign, read_manifest
    from .runtime.shard import split_graph

    if isinstance(source, Graph):
        if num_parts is None:
            raise CompileError("plan(graph, num_parts=N): give the number of workers to plan for")
        assignment = method if isinstance(method, torch.Tensor) else assign(source, num_parts, method, seed)
        parts = split_graph(source, assignment, num_parts)
        return [[len(parts[q].send_index[r]) for q in range(num_parts)] for r in range(num_parts)]
    return read_manifest(Path(source)).halo_sizes


class _Probe(fx.Interpreter):
    """Runs the program on a small graph and records, per IR op node, its bound arguments."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.seen: dict[str, dict[str, Any]] = {}

    def run_node(self, n: fx.Node) -> Any:
        if "ir_op" in n.meta:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            self.seen[n.name] = n.meta["ir_op"].bind(args, kwargs)
        return super().run_node(n)


def _probe_graph() -> Graph:
    gen = torch.Generator().manual_seed(0)
    return Graph.from_edges(torch.randint(0, 17, (40,), generator=gen), torch.randint(0, 17, (40,), generator=gen), 17)


def _row_bytes(t: torch.Tensor) -> int:
    return math.prod(t.shape[1:]) * t.element_size()


def _traffic(op: OpDef, args: dict[str, Any], strategy: str) -> tuple[int, bool, bool, str]:
    """(row bytes, pushes gradients back, fetches again in backward, saved) for one op,
    following what :mod:`sarcompile.runtime.ops` does."""
    kept = strategy in ("stash", "oneshot")
    keeps = "remote blocks kept" if kept else "no remote rows"
    if op.name == "spmm":
        x, w = args["x"], args["edge_weight"]
        want_w = w is not None and w.requires_grad
        saved = "argmax [n, F] int64" if args["reduce"] == "max" else "inputs (references)"
        return _row_bytes(x), x.requires_grad, want_w and not kept, f"{saved}; {keeps}"
    if op.name == "sddmm":
        a, b = args["a"], args["b"]
        reads = args["op"] in ("mul", "dot") and b.requires_grad
        return _row_bytes(a), a.requires_grad, reads and not kept, f"inputs (references); {keeps}"
    # attention: h and a_src travel together; backward re-fetches every block unless kept
    h, a_src = args["h"], args["a_src"]
    heads = a_src.shape[1] if a_src.dim() == 2 else 1
    row = _row_bytes(h) + heads * a_src.element_size()
    backward = any(t.requires_grad for t in (h, a_src, args["a_dst"]))
    return row, backward, backward and not kept, f"out + log-sum-exp per node; {keeps}"


def build_plan(model_name: str, mode: str, gm: fx.GraphModule, stages, halo: list[list[int]], x: torch.Tensor) -> Plan:
    """The plan of the partitioned program ``gm`` for workers whose halos are ``halo``."""
    probe = _Probe(gm)
    g = _probe_graph()
    probe.run(g, x.new_zeros((g.num_nodes, *x.shape[1:])).requires_grad_(x.requires_grad))
    n = len(halo)
    ops = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        layer = node.meta.get("layer", "")
        if "ir_op" not in node.meta:
            name = getattr(node.target, "__name__", "")
            if name in ("edge_softmax", "edge_dropout"):
                ops.append(OpPlan(node.name, layer, name, "local", "", 0, [0] * n, [0] * n, [0] * n, "no remote rows"))
            continue
        op: OpDef = node.meta["ir_op"]
        args = probe.seen[node.name]
        row, pushes, refetch, saved = _traffic(op, args, node.kwargs["strategy"])
        recv = [sum(halo[r][q] for q in range(n) if q != r) * row for r in range(n)]
        sent = [sum(halo[p][r] for p in range(n) if p != r) * row for r in range(n)]
        backward = [(sent[r] if pushes else 0) + (recv[r] if refetch else 0) for r in range(n)]
        rounds = [max((halo[r][q] for q in range(n) if q != r), default=0) * row for r in range(n)]
        label = f"{op.name}({args['reduce']})" if op.name == "spmm" else (
            f"sddmm({args['op']})" if op.name == "sddmm" else op.name
        )
        ops.append(OpPlan(node.name, layer, label, node.kwargs["strategy"], node.meta.get("strategy_reason", ""),
                          row, recv, backward, rounds, saved))
    return Plan(model_name, mode, n, halo, ops, list(stages))
