"""The ``sarcompile`` command line (also ``python -m sarcompile``).

``sarcompile partition --edges FILE --parts N --out DIR`` cuts a graph into N parts for
N workers; ``--dataset ogbn-arxiv --root DIR`` in place of ``--edges`` reads an OGB dataset
instead (``--dataset ogbn-mag``: the heterogeneous one, a typed partition), ``--synthetic mag
--scale S`` generates a MAG-like typed graph, and ``--dgl-partition CONFIG.json --out DIR``
converts a partition made by DGL's ``partition_graph`` (keeping its assignment).
``sarcompile partition --help`` lists the edge file formats.
``sarcompile plan MODULE:FACTORY --parts DIR`` prints what a model will do on them, and
``sarcompile estimate MODULE:FACTORY --edges SRC.npy,DST.npy ...`` its memory per worker
for worker counts not yet partitioned, from the edge files alone.
``sarcompile allocator`` prints the path of tcmalloc's library, for
``LD_PRELOAD=$(sarcompile allocator) torchrun ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.text import Text

from sarcompile.codegen.gpu_compile import ARCHS
from sarcompile.data.datasets import MAG, SUPPORTED, HeteroDataset, load_ogb, load_ogb_mag
from sarcompile.compile.passes import PIPELINE
from sarcompile.errors import CompileError, DatasetError, GraphError, PartitionError, SarcompileError
from sarcompile.graph.graph import Graph
from sarcompile.graph.hetero import HeteroGraph
from sarcompile.data.outofcore.sources import csv_header
from sarcompile.data.partitioning import METHODS, partition, summary
from sarcompile.dist import memory
from sarcompile.data.synthetic import MAG_SIZES, mag_like, mag_like_sizes
from sarcompile.ir.vocab import Mode

__all__ = ["load_edge_file", "main"]

EDGE_FORMATS = """\
graph sources (exactly one):
  --edges FILE                 an edge file (formats below)
  --edges SRC.npy,DST.npy      two one-dimensional integer .npy arrays (edge i: SRC[i] ->
                               DST[i]) with --num-nodes N; node data as --node-data
                               NAME=FILE.npy (x, y, train_mask, ...). Read in chunks and
                               partitioned out of core within --memory-limit (the whole
                               process's peak RSS): METIS on the whole graph where that
                               fits the limit, else on a graph coarsened out of core.
                               An edge .csv with --num-nodes or --memory-limit is read so
                               too
  --dataset NAME --root DIR    an OGB dataset read from DIR/NAME-with-_ (e.g. DIR/ogbn_arxiv/)
                               as OGB's zip extracts; never downloaded. Node data: x, y
                               (-1 = unlabelled), train_mask, val_mask, test_mask. With
                               --memory-limit its raw files are read in chunks and it is
                               partitioned out of core (homogeneous datasets).
                               NAME: {datasets}, or {mag} (heterogeneous: a typed
                               partition, reverse relations rev_* added; node data of
                               type paper)
  --synthetic mag              a generated MAG-like typed graph (paper, author,
                               institution, field_of_study; sarcompile.data.synthetic.mag_like):
                               --scale S times {mag_nodes} nodes (default 1), --seed also
                               seeds the generator
  --dgl-partition CONFIG.json  a partition written by dgl.distributed.partition_graph
                               (homogeneous graphs; needs dgl): converted with DGL's
                               node-to-part assignment and node features. Node ids are
                               DGL's reshuffled ids, or the original ids with
                               --dgl-mapping FILE (a torch.save'd orig_nids tensor, or the
                               (orig_nids, orig_eids) pair return_mapping=True returns).
                               --parts is then optional (DGL's number of parts).

edge file formats:
  .pt   torch.save'd dict with 'src' and 'dst' (node ids of each edge u->v), optional
        'num_nodes', and any other tensors with one row per node (e.g. x, y, train_mask),
        which are split into the parts as node data
  .npz  numpy.savez'd arrays with the same keys
  .csv  two integer columns, one edge per line: src,dst, or as a header line
        names them (src,dst or dst,src); a line of numbers is never a header.
        With --own-ids the two columns are your own node ids, any 64-bit integers
        (kept as int64) or else strings (spaces around them stripped): the nodes
        the edges name are numbered 0..n-1 in sorted order of the ids (integers
        ascending, strings by code point), --node-data rows follow that order, and
        DIR/node_ids.npy keeps your id of every node (sc.read_node_ids(DIR);
        sc.read_predictions(PRED, ids=True) gives it with the predictions). A first
        line that is exactly src,dst (or dst,src) is then a header. Read in chunks,
        out of core

node data is checked before anything is written: x floating point [nodes, features]
with no NaN or infinity (--allow-nonfinite keeps them), y integer labels (-1 =
unlabelled), masks boolean (or 0/1 integers)
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for bad input, with a one-line message)."""
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except (SarcompileError, OSError) as e:
        message = " ".join(str(e).split())
        print(f"sarcompile {args.command}: error: {message}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sarcompile", description="Compile single-machine PyTorch GNNs into distributed full-batch training."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "partition",
        help="cut a graph into one part per worker",
        description="Cut a graph into one part per worker and write them, with a manifest, to a directory "
        "that sc.load_partition reads.",
        epilog=EDGE_FORMATS.format(datasets=", ".join(SUPPORTED), mag=MAG, mag_nodes=sum(MAG_SIZES.values())),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--edges", metavar="FILE", help="edge list (.pt, .npz or .csv; see below)")
    source.add_argument("--dataset", metavar="NAME", help="an OGB dataset under --root (see below)")
    source.add_argument("--synthetic", choices=("mag",), help="a generated MAG-like typed graph (see below)")
    source.add_argument(
        "--dgl-partition", metavar="CONFIG.json", help="convert a DGL partition_graph output (see below)"
    )
    p.add_argument(
        "--dgl-mapping",
        metavar="FILE",
        help="with --dgl-partition: the original ids partition_graph(return_mapping=True) returned, torch.save'd",
    )
    p.add_argument("--root", metavar="DIR", help="directory holding the OGB dataset folders (needed by --dataset)")
    p.add_argument(
        "--symmetrize",
        action=argparse.BooleanOptionalAction,
        help="with --dataset: add the reverse of every edge, each pair once (default: for the datasets "
        "OGB stores directed, arxiv and papers100M, as OGB's examples do)",
    )
    p.add_argument("--scale", type=float, metavar="S", help="with --synthetic: the graph's size, S times the default")
    p.add_argument(
        "--parts", type=_positive_int, metavar="N",
        help="number of parts (= workers); needed by --edges, --dataset, --synthetic",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write the parts and manifest.json to")
    p.add_argument("--num-nodes", type=_positive_int, metavar="N", help="with --edges SRC.npy,DST.npy: the node count")
    p.add_argument(
        "--node-data", action="append", metavar="NAME=FILE.npy",
        help="with --edges SRC.npy,DST.npy or FILE.csv: a node tensor (one row per node), repeatable",
    )
    p.add_argument(
        "--own-ids", action="store_true",
        help="with --edges FILE.csv: its ids are your own (sparse integers or strings), numbered 0..n-1 in sorted "
        "order and kept in the partition (see below)",
    )
    p.add_argument(
        "--memory-limit", metavar="SIZE",
        help="with --edges SRC.npy,DST.npy (default: 3/4 of the memory available) or --dataset: the peak "
        "RSS the run may reach, e.g. 8GiB; reads in chunks and partitions out of core",
    )
    p.add_argument(
        "--scratch", metavar="DIR",
        help="out of core: where scratch files go (default: a hidden folder in --out)",
    )
    p.add_argument(
        "--method", choices=METHODS, help="how nodes are assigned to parts (default: metis)"
    )
    p.add_argument("--seed", type=int, help="seed of the metis and random methods (default: 0)")
    p.add_argument("--name", help="name recorded in the manifest (default: the edge file's or dataset's name)")
    p.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="keep NaN or infinite values in floating-point node data (refused by default, naming the node)",
    )
    p.set_defaults(run=_partition)

    p = commands.add_parser(
        "plan",
        help="print what a model will do on a partition, and its memory per worker",
        description="Print the plan of a model on a partition directory: one row per graph op with its "
        "strategy, traffic and saved tensors, and the estimated memory per worker.",
        epilog=MODEL_SPEC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODULE:FACTORY", help="the model to plan (see below)")
    p.add_argument("--parts", required=True, metavar="DIR", help="partition directory (sarcompile partition --out)")
    p.add_argument("--args", default="{}", metavar="JSON", help="keyword arguments for FACTORY, as a JSON object")
    p.add_argument("--mode", choices=Mode.values(), default=str(Mode.SAR), help="execution mode (default: sar)")
    p.add_argument("--optimizer", choices=("adam", "sgd"), help="count this optimizer's state in the estimate")
    p.add_argument("--stage", metavar="PASS", help="also print the program after this pass: trace, "
                   + ", ".join(step.name for step in PIPELINE))
    p.add_argument(
        "--show-kernels",
        action="store_true",
        help="also print the source of every Triton kernel generated for the plan (as generated for CUDA)",
    )
    p.add_argument(
        "--gpu",
        choices=sorted(ARCHS),
        metavar="ARCH",
        help="with --show-kernels: also each kernel's registers, spills and shared memory on this GPU "
        f"architecture ({', '.join(sorted(ARCHS))}: A100, H100), compiled here with triton (no GPU needed)",
    )
    p.add_argument("--dot", metavar="FILE", help="also write the plan as Graphviz source to FILE")
    p.set_defaults(run=_plan)

    p = commands.add_parser(
        "explain",
        help="say how each layer of a model is lowered into graph ops, or why it is refused",
        description="Compile a model for 2 workers on a small generated graph and print, layer by layer, "
        "the graph ops it became, each with its strategy and why; or, for a model that cannot run "
        "distributed, the reason and the line (exit status 1). No partition is needed.",
        epilog=MODEL_SPEC.replace("sarcompile plan examples/train_sage.py:SAGE --parts parts",
                                  "sarcompile explain examples/train_sage.py:SAGE --features 32"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODULE:FACTORY", help="the model (see below)")
    p.add_argument("--args", default="{}", metavar="JSON", help="keyword arguments for FACTORY, as a JSON object")
    p.add_argument("--features", required=True, type=_positive_int, metavar="F", help="the width of x")
    p.add_argument("--mode", choices=Mode.values(), default=str(Mode.SAR), help="execution mode (default: sar)")
    p.set_defaults(run=_explain)

    p = commands.add_parser(
        "estimate",
        help="estimate the memory per worker of a model on a graph, for worker counts not yet partitioned",
        description="Print the estimated peak memory per worker of a model for each worker count: from a "
        "partition where one is given (--partition N=DIR), else from the random-partition model on the "
        "graph's degrees, read from its edge files in one pass (the graph is never loaded).",
        epilog=MODEL_SPEC.replace("sarcompile plan examples/train_sage.py:SAGE --parts parts",
                                  "sarcompile estimate examples/train_sage.py:SAGE --edges src.npy,dst.npy "
                                  "--num-nodes 1000000 --features 32 --workers 16 32 64"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODULE:FACTORY", help="the model (see below)")
    p.add_argument("--args", default="{}", metavar="JSON", help="keyword arguments for FACTORY, as a JSON object")
    p.add_argument("--edges", required=True, metavar="SRC.npy,DST.npy", help="the graph's edge arrays")
    p.add_argument("--num-nodes", required=True, type=_positive_int, metavar="N", help="the node count")
    p.add_argument("--features", required=True, type=_positive_int, metavar="F", help="the width of x (float32)")
    p.add_argument("--workers", type=_positive_int, nargs="+", default=[1, 2, 4, 8], metavar="N",
                   help="worker counts (default: 1 2 4 8)")
    p.add_argument("--partition", action="append", metavar="N=DIR",
                   help="a partition of this graph into N parts: that row from its plan (repeatable)")
    p.add_argument("--modes", nargs="+", choices=Mode.values(), default=[str(Mode.SAR)], help="(default: sar)")
    p.add_argument("--optimizer", choices=("adam", "sgd"), help="count this optimizer's state in the estimate")
    p.add_argument("--plot", metavar="FILE.png", help="also plot peak per worker against workers")
    p.set_defaults(run=_estimate)

    p = commands.add_parser(
        "allocator",
        help="print the path of an allocator library to LD_PRELOAD (less memory, faster epochs)",
        description="Print the path of tcmalloc's (or jemalloc's) shared library, for "
        "LD_PRELOAD=$(sarcompile allocator) torchrun ... : glibc's allocator keeps freed tensors' memory "
        "resident in holes of its heap; tcmalloc reuses it (see docs/benchmarks.md).",
    )
    p.add_argument("name", nargs="?", choices=tuple(memory.ALLOCATORS), default="tcmalloc",
                   help="which allocator (default: tcmalloc)")
    p.set_defaults(run=_allocator)
    return parser


def _allocator(args: argparse.Namespace) -> int:
    path = memory.find_allocator(args.name)
    if path is None:
        raise SarcompileError(f"{args.name} is not installed here; install it "
                              f"({memory.ALLOCATORS[args.name].install}), or run without LD_PRELOAD "
                              "(glibc's allocator: more memory held, same results)")
    print(path)
    return 0


MODEL_SPEC = """\
naming a model:
  MODULE:FACTORY   FACTORY is a function or class in MODULE that returns the torch.nn.Module,
                   called with the keyword arguments of --args; MODULE is an importable
                   module (my_package.models) or a path to a Python file (models/gat.py),
                   whose folder is then importable, as when the file is run
example:
  sarcompile plan examples/train_sage.py:SAGE --parts parts \\
      --args '{"in_dim": 32, "hidden": 64, "num_classes": 8, "dropout": 0.5}'
"""


def _plan(args: argparse.Namespace) -> int:
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


def _explain(args: argparse.Namespace) -> int:
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


def _estimate(args: argparse.Namespace) -> int:
    from sarcompile.compile.estimate import estimate
    from sarcompile.train.factory import build_from_factory, factory_kwargs
    from sarcompile.data.outofcore import edge_stats, open_edges
    from sarcompile.data.partitioning import read_manifest

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


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _partition(args: argparse.Namespace) -> int:
    """Load, partition, write; a spinner per phase on stderr, the summary and timings on stdout."""
    if args.dgl_partition is not None:
        return _convert_dgl(args)
    if args.parts is None:
        raise PartitionError("--parts N is needed with --edges, --dataset or --synthetic")
    if args.dgl_mapping is not None:
        raise PartitionError("--dgl-mapping applies only to --dgl-partition")
    args.method = args.method or "metis"
    args.seed = 0 if args.seed is None else args.seed
    if args.own_ids and (args.edges is None or not args.edges.lower().endswith(".csv")):
        raise PartitionError("--own-ids applies only to --edges FILE.csv (OGB datasets keep their mapping/ ids "
                             "by themselves)")
    if args.edges is not None and ("," in args.edges or (args.edges.lower().endswith(".csv") and (
            args.memory_limit is not None or args.num_nodes is not None or args.own_ids))):
        return _partition_files(args)
    if args.dataset is not None and args.memory_limit is not None:
        return _partition_ogb(args)
    streamed = [f"--{k.replace('_', '-')}" for k in ("num_nodes", "node_data", "memory_limit", "scratch")
                if getattr(args, k) is not None]
    if streamed:
        raise PartitionError(f"{', '.join(streamed)} apply only to --edges SRC.npy,DST.npy, or --memory-limit "
                             "and --scratch to --dataset (read out of core); other sources are read whole")
    start = time.perf_counter()
    # Only a terminal shows the (transient) spinner, so logs and pipes see stderr only on error.
    console = Console(stderr=True, highlight=False)
    times: dict[str, float] = {}
    with _phase(console, times, "load", f"loading {args.dataset or args.edges or args.synthetic}"):
        g, node_data, name, described, node_ids = _load_source(args)
    with _phase(console, times, "partition + write", f"partitioning ({args.method}) and writing to {args.out}"):
        manifest = partition(
            g, args.parts, args.out, node_data=node_data, method=args.method, seed=args.seed, name=args.name or name,
            allow_nonfinite=args.allow_nonfinite, node_ids=node_ids,
        )
    if described:
        print(described)
    print(summary(manifest))
    print("time: " + ", ".join(f"{phase} {seconds:.2f} s" for phase, seconds in times.items()))
    print(f"wrote {args.parts} parts to {args.out} in {time.perf_counter() - start:.2f} s")
    return 0


def _partition_files(args: argparse.Namespace) -> int:
    """``--edges SRC.npy,DST.npy``: partition out of core (:mod:`sarcompile.data.outofcore`)."""
    from sarcompile.data.outofcore import open_edges, partition_files
    from sarcompile.data.outofcore.budget import peak_rss

    paths = args.edges.split(",")
    if len(paths) > 2 or not all(paths):
        raise GraphError(f"--edges {args.edges}: give two .npy files, SRC.npy,DST.npy")
    if args.own_ids and args.num_nodes is not None:
        raise GraphError("--own-ids numbers the nodes the CSV names itself: drop --num-nodes")
    if args.num_nodes is None and not args.own_ids:
        raise GraphError(f"--edges {args.edges} out of core needs --num-nodes N (node ids are 0..N-1), or "
                         "--own-ids for a CSV of your own ids")
    given = [f"--{k}" for k in ("root", "symmetrize", "scale") if getattr(args, k) is not None]
    if given:
        raise DatasetError(f"{', '.join(given)} do not apply to --edges")
    node_data = {}
    for item in args.node_data or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise GraphError(f"--node-data {item}: write NAME=FILE.npy, e.g. --node-data x=features.npy")
        node_data[name] = path
    start = time.perf_counter()
    console = Console(stderr=True, highlight=False)
    edges = open_edges(paths[0], paths[1], args.num_nodes) if len(paths) == 2 else paths[0]  # or a CSV
    manifest = partition_files(
        edges, args.parts, args.out, node_data, num_nodes=args.num_nodes, method=args.method, seed=args.seed,
        name=args.name or Path(paths[0]).stem, memory_limit=args.memory_limit, scratch_dir=args.scratch,
        allow_nonfinite=args.allow_nonfinite, own_ids=args.own_ids,
        log=lambda line: console.print(f"[{time.perf_counter() - start:7.1f} s] {line}", markup=False),
    )
    print(summary(manifest))
    print(f"wrote {args.parts} parts to {args.out} in {time.perf_counter() - start:.2f} s; "
          f"peak RSS {peak_rss() / 2**20:.0f} MiB")
    return 0


def _partition_ogb(args: argparse.Namespace) -> int:
    """``--dataset NAME --memory-limit SIZE``: read the raw files in chunks, partition out of core."""
    from sarcompile.data.outofcore.budget import peak_rss
    from sarcompile.data.outofcore.ogb import partition_ogb

    if args.root is None:
        raise DatasetError(f"--dataset {args.dataset} needs --root DIR, the directory that holds its folder")
    if args.dataset == MAG:
        raise DatasetError(f"{MAG} is partitioned in memory (typed graphs are not streamed yet): drop --memory-limit")
    given = [f"--{k.replace('_', '-')}" for k in ("num_nodes", "node_data") if getattr(args, k) is not None]
    if given:
        raise DatasetError(f"{', '.join(given)} apply only to --edges SRC.npy,DST.npy")
    start = time.perf_counter()
    console = Console(stderr=True, highlight=False)
    manifest, ds = partition_ogb(
        args.dataset, args.root, args.parts, args.out, symmetrize=args.symmetrize, method=args.method,
        seed=args.seed, memory_limit=args.memory_limit, scratch_dir=args.scratch,
        log=lambda line: console.print(f"[{time.perf_counter() - start:7.1f} s] {line}", markup=False),
    )
    edges = "symmetrized (both directions, each pair once)" if ds.symmetrized else "edges as OGB stores them"
    print(f"dataset {ds.name}: {edges}; {ds.num_classes} classes; read out of core")
    print(summary(manifest))
    print(f"wrote {args.parts} parts to {args.out} in {time.perf_counter() - start:.2f} s; "
          f"peak RSS {peak_rss() / 2**20:.0f} MiB")
    return 0


def _convert_dgl(args: argparse.Namespace) -> int:
    """Convert a DGL partition, keeping its assignment; print the summary and which ids it uses."""
    from sarcompile.data.dgl_import import convert_dgl_partition

    given = [f"--{k.replace('_', '-')}" for k in ("root", "symmetrize", "method", "seed", "scale", "num_nodes",
                                                  "node_data", "memory_limit", "scratch") if getattr(args, k) is not None]
    given += ["--allow-nonfinite"] if args.allow_nonfinite else []
    given += ["--own-ids"] if args.own_ids else []
    if given:
        raise PartitionError(
            f"{', '.join(given)} apply only to --edges/--dataset: a DGL partition keeps DGL's assignment"
        )
    start = time.perf_counter()
    orig_nids, orig_eids = _read_dgl_mapping(args.dgl_mapping) if args.dgl_mapping else (None, None)
    console = Console(stderr=True, highlight=False)
    times: dict[str, float] = {}
    with _phase(console, times, "convert + write", f"converting {args.dgl_partition} to {args.out}"):
        manifest = convert_dgl_partition(
            args.dgl_partition, args.out, orig_nids, orig_eids, name=args.name, num_parts=args.parts
        )
    print(summary(manifest))
    ids = "original node ids" if manifest.name.endswith("original ids)") else "DGL's reshuffled node ids"
    print(f"node ids: {ids}; DGL's node-to-part assignment kept")
    print(f"converted {manifest.num_parts} parts to {args.out} in {time.perf_counter() - start:.2f} s")
    return 0


def _read_dgl_mapping(path: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``orig_nids`` (and ``orig_eids`` if present) from a torch.save'd tensor, pair or dict."""
    data = _read_any(Path(path), lambda: torch.load(path, map_location="cpu", weights_only=True))
    if isinstance(data, dict):
        data = (data.get("orig_nids"), data.get("orig_eids"))
    if isinstance(data, torch.Tensor):
        return data, None
    pair = isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], torch.Tensor)
    if pair and (data[1] is None or isinstance(data[1], torch.Tensor)):
        return data[0], data[1]
    raise PartitionError(
        f"'{path}' holds no id mapping: save orig_nids, or the (orig_nids, orig_eids) pair, with torch.save"
    )


@contextlib.contextmanager
def _phase(console: Console, times: dict[str, float], phase: str, message: str) -> Iterator[None]:
    """Show ``message`` with a spinner while the block runs; record its seconds in ``times[phase]``."""
    start = time.perf_counter()
    with console.status(Text(message)):  # Text: paths may hold [brackets] rich would read as markup
        yield
    times[phase] = time.perf_counter() - start


def _load_source(args: argparse.Namespace) -> tuple[Graph | HeteroGraph, dict[str, Any], str, str, Any]:
    """The graph, its node tensors, its default name, a line describing a dataset ('' for an
    edge file) and the dataset's own node ids (None where it has none)."""
    if args.scale is not None and args.synthetic is None:
        raise DatasetError("--scale applies only to --synthetic")
    if args.edges is not None or args.synthetic is not None:
        if args.root is not None or args.symmetrize is not None:
            raise DatasetError("--root and --symmetrize/--no-symmetrize apply only to --dataset")
        if args.synthetic is not None:
            return _synthetic(args)
        g, node_data = load_edge_file(args.edges)
        return g, node_data, Path(args.edges).stem, "", None
    if args.root is None:
        raise DatasetError(f"--dataset {args.dataset} needs --root DIR, the directory that holds its folder")
    if args.dataset not in (*SUPPORTED, MAG):
        raise DatasetError(f"dataset {args.dataset!r} is not supported; choose one of {', '.join((*SUPPORTED, MAG))}")
    if args.dataset == MAG:
        if args.symmetrize is not None:
            raise DatasetError(f"--symmetrize applies to the homogeneous datasets; {MAG} gets a reverse relation "
                               "(rev_*) for every relation between two types, and keeps cites as stored")
        mag = load_ogb_mag(args.root)
        return *_typed_source(mag, "reverse relations added"), mag.node_ids
    ds = load_ogb(args.dataset, args.root, symmetrize=args.symmetrize)
    splits = ("train", "val", "test")
    masks = ", ".join(f"{int(ds.node_data[f'{s}_mask'].sum())} {s}" for s in splits)
    edges = "symmetrized (both directions, each pair once)" if ds.symmetrized else "edges as OGB stores them"
    described = f"dataset {ds.name}: {edges}; {ds.num_classes} classes; {masks} nodes"
    return ds.graph, ds.node_data, ds.name, described, ds.node_ids


def _synthetic(args: argparse.Namespace) -> tuple[HeteroGraph, dict[str, Any], str, str, None]:
    """``--synthetic mag``: :func:`~sarcompile.data.synthetic.mag_like` at ``--scale``, seeded by ``--seed``."""
    sizes = mag_like_sizes(1.0 if args.scale is None else args.scale)
    return *_typed_source(mag_like(**sizes, seed=args.seed), f"generated, seed {args.seed}"), None


def _typed_source(ds: HeteroDataset, how: str) -> tuple[HeteroGraph, dict[str, Any], str, str]:
    g, target = ds.graph, ds.target_type
    counts = ", ".join(f"{g.num_nodes(t)} {t}" for t in g.node_types)
    masks = ", ".join(f"{int(ds.node_data[target][f'{s}_mask'].sum())} {s}" for s in ("train", "val", "test"))
    described = (f"dataset {ds.name} ({how}): {counts} nodes; {len(g.edge_types)} relations; "
                 f"{ds.num_classes} classes of {target}; {masks} {target} nodes")
    return g, ds.node_data, ds.name, described


# -- edge files ------------------------------------------------------------------------------
def load_edge_file(path: str | Path) -> tuple[Graph, dict[str, torch.Tensor]]:
    """Read a graph and its node tensors from a ``.pt``, ``.npz`` or ``.csv`` edge file.

    Without ``num_nodes`` in the file the graph has as many nodes as the node tensors have
    rows, or else the largest node id + 1.
    """
    path = Path(path)
    if not path.is_file():
        raise GraphError(f"edge file '{path}' not found")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        src, dst = _read_csv(path)
        return Graph.from_edges(src, dst, _num_nodes(None, src, dst, {}, path)), {}
    if suffix == ".pt":
        arrays = _read(path, lambda: torch.load(path, map_location="cpu", weights_only=True))
    elif suffix == ".npz":
        arrays = _read(path, lambda: _load_npz(path))
    else:
        raise GraphError(f"edge file '{path}' has an unknown type; use .pt, .npz or .csv")
    return _graph_from_dict(arrays, path)


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as npz:
        return dict(npz)


def _read(path: Path, load: Callable[[], Any]) -> dict:
    data = _read_any(path, load)
    if not isinstance(data, dict):
        raise GraphError(f"'{path}' holds a {type(data).__name__}; expected a dict with 'src' and 'dst'")
    return data


def _read_any(path: Path, load: Callable[[], Any]) -> Any:
    if not path.is_file():
        raise GraphError(f"file '{path}' not found")
    try:
        return load()
    except Exception as e:  # noqa: BLE001 -- torch.load and np.load raise many types for a bad file
        reason = " ".join(str(e).split())
        if len(reason) > 200:  # torch's unpickling errors run to a paragraph
            reason = reason[:200] + "..."
        raise GraphError(f"cannot read '{path}' ({type(e).__name__}: {reason})") from None


def _graph_from_dict(arrays: dict, path: Path) -> tuple[Graph, dict[str, torch.Tensor]]:
    missing = [k for k in ("src", "dst") if k not in arrays]
    if missing:
        raise GraphError(f"'{path}' has no {' or '.join(repr(k) for k in missing)}; found keys {sorted(arrays)}")
    tensors = {}
    for key, value in arrays.items():
        if key == "num_nodes":
            continue
        if not isinstance(value, (torch.Tensor, np.ndarray)):
            raise GraphError(f"'{path}': {key!r} is a {type(value).__name__}, expected a tensor or array")
        tensors[key] = torch.as_tensor(value)
    src, dst = tensors.pop("src"), tensors.pop("dst")
    num_nodes = _num_nodes(arrays.get("num_nodes"), src, dst, tensors, path)
    return Graph.from_edges(src, dst, num_nodes), tensors


def _num_nodes(
    given: Any, src: torch.Tensor, dst: torch.Tensor, node_data: dict[str, torch.Tensor], path: Path
) -> int:
    if given is not None:
        try:
            return int(given)
        except (TypeError, ValueError, RuntimeError):
            raise GraphError(f"'{path}': 'num_nodes' must be one integer, got {given!r}") from None
    for t in node_data.values():
        if t.dim() > 0:
            return t.shape[0]
    return int(max(src.max(), dst.max())) + 1 if src.numel() else 0




def _read_csv(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    with open(path, encoding="utf-8-sig") as f:  # -sig: a byte-order mark is not part of the first name
        first = f.readline()
    order = csv_header(first, path)
    try:
        with warnings.catch_warnings():  # numpy warns on an empty file; we raise instead
            warnings.simplefilter("ignore", UserWarning)
            edges = np.loadtxt(
                path, delimiter=",", dtype=np.int64, skiprows=int(order is not None), ndmin=2, encoding="utf-8-sig"
            )
    except ValueError as e:
        raise GraphError(f"'{path}' is not a CSV of integer src,dst pairs ({e})") from None
    if edges.size == 0:
        raise GraphError(f"'{path}' has no edges")
    if edges.shape[1] != 2:
        raise GraphError(f"'{path}' has {edges.shape[1]} columns; expected two: src,dst")
    edges = torch.from_numpy(edges)
    src, dst = (0, 1) if order is None else (order.index("src"), order.index("dst"))
    return edges[:, src].contiguous(), edges[:, dst].contiguous()


