"""What ``manifest.json`` records about a partition directory, reading it, and the table
that shows it.

A partition directory holds ``part-{r}.pt`` for every worker ``r`` and a ``manifest.json``
that names the graph, the method, the sizes and the sha256 of every part file. The
manifest records ``graph_sha256``, a hash of the whole graph and its node data that does
not depend on the number of parts: a checkpoint keeps it to recognise the graph it was
trained on.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from sarcompile.errors import PartitionError
from sarcompile.graph.graph import Graph
from sarcompile.graph.shard import PartData

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "PartInfo",
    "Manifest",
    "read_manifest",
    "graph_sha256",
    "chunked_graph_sha256",
    "part_self_loops",
    "summary",
]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


@dataclass
class PartInfo:
    """One part file as the manifest records it."""

    file: str
    num_nodes: int
    num_edges: int
    sha256: str
    bytes: int
    # What a plan needs besides the halos, so that planning reads no part file (None in
    # manifests written before they were recorded: the plan then reads the parts).
    self_loops: int | None = None  # edges u -> u among its in-edges
    block_edges: list[int] | None = None  # of its in-edges, how many come from each part
    type_nodes: dict[str, int] | None = None  # a typed partition's nodes per type
    # ... and per relation key its in-edges here, their self-loops and block_edges (as above)
    relations: dict[str, dict[str, Any]] | None = None


@dataclass
class Manifest:
    """What ``manifest.json`` says about a partition directory.

    ``halo_sizes[r][q]`` is the number of part ``q``'s nodes with an edge into part ``r``
    (the rows ``r`` receives from ``q`` in every aggregation); the diagonal is 0.
    ``node_data`` maps each node tensor's name to its ``dtype`` and trailing ``shape``.
    ``graph_sha256`` identifies the graph and its node data whatever the number of parts
    (see :func:`graph_sha256`); manifests written before it existed have None.

    Example:

    >>> import tempfile
    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> manifest = sc.partition(g, 2, tempfile.mkdtemp())
    >>> manifest.num_edges, len(manifest.parts), manifest.edge_cut <= manifest.num_edges
    (4, 2, True)
    """

    num_parts: int
    num_nodes: int
    num_edges: int
    method: str
    seed: int
    name: str
    parts: list[PartInfo]
    halo_sizes: list[list[int]]
    edge_cut: int
    node_data: dict[str, dict[str, Any]]
    created: str
    format_version: int = FORMAT_VERSION
    graph_sha256: str | None = None
    # A typed partition (sarcompile.graph.hetero): per node type its node count and node data
    # ({"num_nodes", "node_data"}), per relation key (src__name__dst) its edge count, halo
    # sizes and edge cut ({"num_edges", "halo_sizes", "edge_cut"}); None for one type.
    node_types: dict[str, dict[str, Any]] | None = None
    edge_types: dict[str, dict[str, Any]] | None = None
    # The user's own ids of the nodes, where the graph came with them (sarcompile.data.node_ids):
    # the id file's record ({"file", "sha256", "kind", "dtype", "num_nodes"}), per
    # node type for a typed partition; None where the global node ids are the user's.
    node_ids: dict[str, Any] | None = None

    @property
    def typed(self) -> bool:
        return self.node_types is not None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        """Parse a manifest; anything unreadable or of another format raises :class:`PartitionError`."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PartitionError(f"manifest is not valid JSON ({e}); re-run partition") from None
        if not isinstance(d, dict):
            raise PartitionError("manifest is not a JSON object; re-run partition")
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise PartitionError(
                f"manifest has format_version {version!r}, this sarcompile reads {FORMAT_VERSION}; "
                "re-run partition with this version"
            )
        try:
            d["parts"] = [PartInfo(**p) for p in d["parts"]]
            return cls(**d)
        except (KeyError, TypeError) as e:
            raise PartitionError(f"manifest is missing or has unexpected fields ({e}); re-run partition") from None


def read_manifest(out_dir: str | os.PathLike) -> Manifest:
    """The manifest of a partition directory, or a :class:`PartitionError` saying what to do."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PartitionError(f"'{out}' is a file, not a partition directory: give the directory "
                             "`sarcompile partition --out` (or sc.partition) wrote")
    if not out.is_dir():
        raise PartitionError(
            f"partition directory '{out}' does not exist: run `sarcompile partition` or sc.partition first"
        )
    path = out / MANIFEST
    if not path.is_file():
        raise PartitionError(
            f"'{out}' has no {MANIFEST} (never partitioned, or a partition run did not finish): "
            "run `sarcompile partition` or sc.partition first"
        )
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise PartitionError(f"cannot read '{path}' ({e}); re-run partition") from None
    return Manifest.from_json(text)


def describe_node_data(node_data: dict[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    """The manifest's record of node tensors: dtype and trailing shape by name."""
    return {k: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape[1:])} for k, t in node_data.items()}


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def graph_sha256(g: Graph, node_data: dict[str, torch.Tensor] | None = None) -> str:
    """The sha256 of a graph (its node count and edges, in order; a sparse adjacency's
    values, ``g.adj_values``, where it has them) and its node tensors (by name: dtype,
    shape and values): the same for any number of parts, different for any change that
    changes what training computes."""
    node_data = node_data or {}
    return chunked_graph_sha256(
        g.num_nodes, g.num_edges, [g.src], [g.dst], {k: (t.dtype, tuple(t.shape), [t]) for k, t in node_data.items()},
        None if g.adj_values is None else (g.adj_values.dtype, [g.adj_values]),
    )


def chunked_graph_sha256(
    num_nodes: int, num_edges: int, src: Iterable[torch.Tensor], dst: Iterable[torch.Tensor],
    node_data: dict[str, tuple[torch.dtype, tuple[int, ...], Iterable[torch.Tensor]]],
    edge_values: tuple[torch.dtype, Iterable[torch.Tensor]] | None = None,
) -> str:
    """:func:`graph_sha256` of a graph given as consecutive chunks (all of ``src``, then all
    of ``dst``, then each node tensor's rows as ``(dtype, shape, chunks)``, then the edge
    values if any, as ``(dtype, chunks)``), as the out-of-core partitioner reads it: the
    same digest as the whole tensors give. A graph without edge values hashes as before
    they were hashed."""
    h = hashlib.sha256(b"sarcompile-graph 1\n")
    h.update(json.dumps([num_nodes, num_edges]).encode())
    for chunks in (src, dst):
        for t in chunks:
            _hash_tensor(h, t.to(torch.int64))
    for key in sorted(node_data):
        dtype, shape, chunks = node_data[key]
        h.update(json.dumps([key, str(dtype), list(shape)]).encode())
        for t in chunks:
            _hash_tensor(h, t)
    if edge_values is not None:
        h.update(json.dumps(["adj_values", str(edge_values[0])]).encode())
        for t in edge_values[1]:
            _hash_tensor(h, t)
    return h.hexdigest()


def _hash_tensor(h: Any, t: torch.Tensor) -> None:
    flat = t.detach().cpu().contiguous().reshape(-1)
    if flat.numel():
        h.update(memoryview(flat.view(torch.uint8).numpy()))


def part_self_loops(part: PartData, rank: int) -> int:
    """The self-loops among a part's in-edges (they sit in its local block)."""
    return int(((part.edge_src_part == rank) & (part.edge_src_local == part.edge_dst_local)).sum())


def summary(manifest: Manifest, max_matrix: int = 8) -> str:
    """A plain-text table of a partition: nodes, edges and halo per part, and the edge cut.

    ``halo in`` is the number of remote rows a part receives per aggregation, ``halo out``
    the rows it sends. The full ``num_parts x num_parts`` halo matrix follows when it has
    at most ``max_matrix`` parts.
    """
    m = manifest
    halo_in = [sum(row) for row in m.halo_sizes]
    halo_out = [sum(m.halo_sizes[r][q] for r in range(m.num_parts)) for q in range(m.num_parts)]
    header = ("part", "nodes", "edges", "halo in", "halo out", "MiB")
    rows = [
        (str(r), str(p.num_nodes), str(p.num_edges), str(halo_in[r]), str(halo_out[r]), f"{p.bytes / 2**20:.2f}")
        for r, p in enumerate(m.parts)
    ]
    lines = [
        f"partition '{m.name}': {m.num_nodes} nodes, {m.num_edges} edges, "
        f"{m.num_parts} parts ({m.method}, seed {m.seed})",
        *_table(header, rows),
    ]
    cut = 100.0 * m.edge_cut / m.num_edges if m.num_edges else 0.0
    lines.append(f"edge cut: {m.edge_cut} of {m.num_edges} edges ({cut:.1f}%)")
    if m.node_ids is not None:  # where the user's id of every node is (sc.read_node_ids)
        records = m.node_ids.items() if m.typed else [(None, m.node_ids)]
        lines.append("node ids of your own: " + ", ".join(
            f"{'' if t is None else t + ' '}{r['kind']}s in {r['file']}" for t, r in records))
    if m.typed:  # every type is split across all parts: how evenly
        lines.append("nodes of each type per part:")
        lines += _table(("type", *map(str, range(m.num_parts))),
                        [(t, *(str(p.type_nodes[t]) for p in m.parts)) for t in m.node_types])
    if 1 < m.num_parts <= max_matrix:
        lines.append("halo sizes (row r: nodes of part q that r receives):")
        matrix = [(str(r), *map(str, row)) for r, row in enumerate(m.halo_sizes)]
        lines += _table(("r\\q", *map(str, range(m.num_parts))), matrix)
    return "\n".join(lines)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    return ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in (header, *rows)]
