"""``sarcompile partition``: load a graph (edge file, OGB dataset, generated MAG-like
graph), partition it in memory or out of core, or convert a DGL partition; print the
summary and the timings."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.text import Text

from sarcompile.cli.edge_files import _read_any, load_edge_file
from sarcompile.data.datasets import MAG, SUPPORTED, HeteroDataset, load_ogb, load_ogb_mag
from sarcompile.data.manifest import summary
from sarcompile.data.partitioning import partition
from sarcompile.data.synthetic import mag_like, mag_like_sizes
from sarcompile.errors import DatasetError, GraphError, PartitionError
from sarcompile.graph.graph import Graph
from sarcompile.graph.hetero import HeteroGraph

__all__ = ["run_partition"]


def run_partition(args: argparse.Namespace) -> int:
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
