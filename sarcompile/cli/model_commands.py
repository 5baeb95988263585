"""``sarcompile plan``, ``explain`` and ``estimate``: what a model will do distributed, and
its memory per worker."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from sarcompile.errors import CompileError, GraphError, PartitionError
from sarcompile.graph.graph import Graph

__all__ = ["run_estimate", "run_explain", "run_plan"]


def run_plan(args: argparse.Namespace) -> int:
    from sarcompile.compile.distribute import distribute
    from sarcompile.train.factory import build_from_factory, factory_kwargs

    if args.gpu and not args.show_kernels:
        raise CompileError("--gpu lists the resources of the kernels --show-kernels prints: add --show-kernels")
    model = distribute(build_from_factory(args.model, factory_kwargs(args.args)), mode=args.mode)
    plan = model.plan(args.parts, optimizer=args.optimizer)
    stages = [name for name, _ in plan.stages]
    if args.stage and args.stage not in stages:
        raise CompileError(f"--stage {args.stage}: no such pass; the passes are {', '.join(stages)}")
    print(plan)
    print(plan.compile_summary())
    if args.stage:
        print(f"\nprogram after {args.stage}:\n{plan.stage(args.stage)}")
    if args.show_kernels:
        print(f"\n{plan.kernel_sources(args.gpu)}")
    if args.dot:
        Path(args.dot).write_text(plan.to_dot())
    return 0


def run_explain(args: argparse.Namespace) -> int:
    from sarcompile.compile.distribute import distribute
    from sarcompile.train.factory import build_from_factory, factory_kwargs

    net = build_from_factory(args.model, factory_kwargs(args.args))
    # A small graph with every shape a layer meets: self-loops, an isolated node, edges across the two parts.
    n = 16
    src = torch.cat([torch.arange(n - 1), torch.arange(n - 1), torch.tensor([0, 5])])
    dst = torch.cat([torch.arange(1, n), torch.arange(n - 1).flip(0), torch.tensor([0, 5])])
    graph = Graph.from_edges(src, dst, n)
    try:
        plan = distribute(net, mode=args.mode).plan(graph, 2, x=torch.randn(n, args.features), method="contiguous")
    except CompileError as e:
        print(f"{type(net).__name__} cannot run distributed: {e}")
        return 1
    print(f"{type(net).__name__}, mode={args.mode}: {len(plan.ops)} graph ops; every other module and "
          "tensor operation runs as written, on each worker's own rows")
    layers: dict[str, list[Any]] = {}
    for op in plan.ops:
        layers.setdefault(op.layer or "(the model's own forward)", []).append(op)
    for layer, ops in layers.items():
        print(f"{layer}:")
        for op in ops:
            print(f"  {op.op} [{op.rows}]: {op.strategy}{', reused' if op.reused else ''}"
                  + (f" -- {op.reason}" if op.reason else ""))
    return 0


def run_estimate(args: argparse.Namespace) -> int:
    from sarcompile.compile.estimate import estimate
    from sarcompile.train.factory import build_from_factory, factory_kwargs
    from sarcompile.data.outofcore import edge_stats, open_edges
    from sarcompile.data.manifest import read_manifest

    kwargs = factory_kwargs(args.args)
    paths = args.edges.split(",")
    if len(paths) != 2 or not all(paths):
        raise GraphError(f"--edges {args.edges}: give two .npy files, SRC.npy,DST.npy")
    stats = edge_stats(open_edges(paths[0], paths[1], args.num_nodes))
    partitions = {}
    for item in args.partition or []:
        count, sep, directory = item.partition("=")
        if not sep or not count.isdigit() or not directory:
            raise PartitionError(f"--partition {item}: write N=DIR, e.g. --partition 16=parts16")
        manifest = read_manifest(directory)
        if (manifest.num_nodes, manifest.num_edges, manifest.num_parts) != (stats.num_nodes, stats.num_edges, int(count)):
            raise PartitionError(
                f"--partition {item}: '{directory}' holds {manifest.num_parts} parts of a graph of "
                f"{manifest.num_nodes} nodes and {manifest.num_edges} edges, not {count} parts of this one "
                f"({stats.num_nodes} nodes, {stats.num_edges} edges)"
            )
        partitions[int(count)] = directory
    workers = sorted(set(args.workers) | set(partitions))
    print(f"graph: {stats.num_nodes} nodes, {stats.num_edges} edges ({stats.self_loops} self-loops), "
          f"x of {args.features} float32 features")
    table = estimate(build_from_factory(args.model, kwargs), stats, num_parts=workers, modes=args.modes,
                     x=torch.zeros(1, args.features), partitions=partitions, optimizer=args.optimizer)
    if args.plot:
        table.plot(args.plot)
    return 0
