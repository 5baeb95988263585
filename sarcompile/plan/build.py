"""Building a :class:`~sarcompile.plan.plan.Plan`: :func:`build_plan`.

Row widths, which inputs need gradients and what autograd keeps for backward come from
running the compiled program once on a small synthetic graph (a one-worker shard,
:func:`~sarcompile.plan.probe.probe_for`): widths do not depend on the number of nodes, and
every saved tensor is scaled by the size it is proportional to (nodes, or edges of the graph
variant it belongs to). The inference estimate's live activations come from a second probe
run of the eval-mode program (:class:`_LiveProbe`). Every figure comes from the ops'
definitions (:class:`~sarcompile.ir.opdef.OpDef`): traffic from :mod:`sarcompile.plan.traffic`,
memory from :mod:`sarcompile.plan.memory`, with no rule of its own for any op.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves

from sarcompile import logs
from sarcompile.ir.node_info import info
from sarcompile.ir.opdef import AllReduce, Halo, OpDef, Push, definition
from sarcompile.ir.probe import Recorder
from sarcompile.ir.vocab import Strategy
from sarcompile.dist.collectives import offline
from sarcompile.plan.memory import KERNEL_CODE_BYTES, optimizer_factor, remote_peak, scale_saved, workspace
from sarcompile.plan.plan import Kernel, MemoryEstimate, NodeTable, OpPlan, Plan, _size
from sarcompile.plan.probe import probe_for
from sarcompile.plan.sizes import TypedWorkerStats, WorkerStats
from sarcompile.plan.traffic import halo_traffic, push_traffic

__all__ = ["build_plan"]


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
        tables = [a for a, n in zip(args, (n for n in gm.graph.nodes if n.op == "placeholder"))
                  if info(n).table is not None]
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
        args = probe.ir_args[node]
        strategy = node.kwargs.get("strategy", Strategy.LOCAL)
        row = OpPlan(node.name, _layer(node), op.describe(args), strategy, info(node).strategy_reason or "", 0,
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
            comm.append(halo_traffic(row, node, op, args, shape.stats(node, workers), link_cache))
            row.saved += "; remote blocks kept" if strategy.keeps_blocks else "; no remote rows"
        elif isinstance(op.exchange, Push):
            comm.append(push_traffic(row, op, args, shape.stats(node, workers)))

    params = sum(p.numel() * p.element_size() for p in gm.parameters())
    factor = optimizer_factor(optimizer)
    estimates, inference, copy = [], [], []
    for r, w in enumerate(workers):
        remote = remote_peak(comm, r, buffers=False)
        breakdown = {
            "node_data": shape.node_data_bytes(w),
            "graph": shape.graph_bytes(w, r),
            "parameters": params,
            "gradients": params,
            "optimizer": params * factor,
            "saved_activations": scale_saved(probe.saved, shape.sizes(w)),
            "remote_blocks": remote,
            "exchange_buffers": remote_peak(comm, r, buffers=True) - remote,
            "workspace": workspace(comm, r),
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
        forward = remote_peak(comm, r, buffers=False, backward=False)
        predicting = {
            "node_data": breakdown["node_data"],
            "graph": breakdown["graph"],
            "parameters": params,
            "activations": live.peak(shape.sizes(w)),
            "remote_blocks": forward,
            "exchange_buffers": remote_peak(comm, r, buffers=True, backward=False) - forward,
            "workspace": workspace(comm, r, node_rows=False),
            "kernel_code": KERNEL_CODE_BYTES,
        }
        if shape.tables:
            predicting["node_tables"] = shape.table_bytes(w)
        inference.append(MemoryEstimate(r, sum(predicting.values()), predicting))
    kernels = [
        Kernel(node.name, role, spec.name, spec.render("cuda"), spec)
        for node in gm.graph.nodes
        if node in probe.ir_args
        for role, spec in definition(node).kernels(probe.ir_args[node])
    ]
    warned = [info(node).comm_warning for node in gm.graph.nodes if info(node).comm_warning is not None]
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
    if info(node).layer:
        return info(node).layer
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    return stack[-1][0] if stack else ""


def _rows(op: OpDef, args: dict[str, Any]) -> str:
    """``node -> edge``: the residency of the op's row arguments given, and of its result."""
    given = sorted({str(r) for name, r in op.inputs.items() if args.get(name) is not None})
    return f"{'+'.join(given)} -> {op.output}"


class _Probe(Recorder):
    """Runs the program once on a small shard; records each IR op's bound arguments
    (:class:`~sarcompile.ir.probe.Recorder`'s ``ir_args``) and every tensor autograd saves
    for backward (by storage, so shared ones count once)."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.saved: dict[int, tuple[int, tuple[int, ...]]] = {}  # storage -> (bytes, shape)

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
        return max((scale_saved(live, sizes) for live in self.moments), default=0)
