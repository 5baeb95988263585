"""Cut a graph into one piece per worker, write the pieces to a directory, load one back.

A partition directory holds ``part-{r}.pt`` for every worker ``r`` and a ``manifest.json``
that names the graph, the method, the sizes and the sha256 of every part file::

    >>> import tempfile
    >>> g = Graph.from_edges(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0]), num_nodes=4)
    >>> out = tempfile.mkdtemp()
    >>> m = partition(g, 2, out, method="contiguous")
    >>> m.edge_cut, m.halo_sizes
    (2, [[0, 1], [1, 0]])
    >>> p = load_partition(out, rank=1, world_size=2)
    >>> p.global_ids.tolist(), p.graph.in_degrees().tolist()
    ([2, 3], [1, 1])

Every file is written to a temporary name and renamed into place, and the manifest is
removed before any part changes and written last: a run that dies half-way leaves a
directory that refuses to load rather than one that mixes two partitionings. A partition
run locks the directory (``.lock``, see :mod:`sarcompile.data.rundir`), so a second one on the
same directory is refused, and deletes the temporary files a killed run left there.

A worker memory-maps its part file (copy-on-write): the edge lists are read once into
its shard and unmapped, and only the node rows it uses become resident.

Node data is checked when it is partitioned and again when a part is loaded
(:mod:`sarcompile.data.validate`): features ``x`` floating point ``[nodes, features]`` and
finite, labels ``y`` integers, masks boolean. The manifest records ``graph_sha256``, a
hash of the whole graph and its node data that does not depend on the number of parts:
a checkpoint keeps it to recognise the graph it was trained on.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sarcompile.errors import GraphError, PartitionError
from sarcompile.graph.graph import Graph
from sarcompile.graph.hetero import HeteroGraph, HeteroShard
from sarcompile.data.rundir import _atomic_write, _create_temp, _fsync_dir, _sha256, lock_dir, remove_stale_temps
from sarcompile.dist.memory import release_free
from sarcompile.data.node_ids import IDS_FILES, check_ids, open_ids, write_node_ids
from sarcompile.graph.shard import PartData, ShardGraph, split_graph
from sarcompile.data.validate import check_node_data

__all__ = [
    "METHODS",
    "FORMAT_VERSION",
    "PartInfo",
    "Manifest",
    "Partition",
    "assign",
    "graph_sha256",
    "read_node_ids",
    "partition",
    "read_manifest",
    "load_partition",
    "load_whole_graph",
    "read_part",
    "summary",
]

METHODS = ("metis", "random", "contiguous")
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


@dataclass
class TypedHooks:
    """Where typed graphs go: :mod:`sarcompile.data.typed_partition` builds on this module
    (its writing, reading and checks), so it cannot be imported from here; it registers
    its functions when the package is imported, as the runtime registers op kernels."""

    partition: Callable[..., "Manifest"] | None = None
    load: Callable[..., "Partition"] | None = None
    load_whole: Callable[..., tuple] | None = None


typed = TypedHooks()


# -- node assignment -------------------------------------------------------------------------
def assign(g: Graph, num_parts: int, method: str | torch.Tensor = "metis", seed: int = 0) -> torch.Tensor:
    """The part of every node: a LongTensor of ``g.num_nodes`` values in ``[0, num_parts)``.

    ``method`` is one of :data:`METHODS` or an integer tensor that *is* the assignment
    (one part id per node; e.g. another partitioner's, see
    :func:`sarcompile.data.dgl_import.convert_dgl_partition`), which is checked
    and returned as a LongTensor; ``seed`` is then unused.

    * ``"metis"`` -- METIS k-way on the undirected simple graph behind ``g`` (edge
      directions dropped, self-loops and duplicates removed), seeded with ``seed``.
      A graph without edges, or with fewer nodes than parts, gives METIS nothing to
      optimise (and it can misbehave there), so those fall back to ``"contiguous"``.
    * ``"random"`` -- every node uniformly at random, reproducible from ``seed``.
    * ``"contiguous"`` -- node ``v`` goes to ``v * num_parts // num_nodes``: equal runs of ids.

    Parts may come out empty (e.g. more parts than nodes); the rest of the pipeline allows it.
    """
    _check_graph(g)
    _check_num_parts(num_parts)
    if isinstance(method, torch.Tensor):
        return _given_assignment(method, g.num_nodes, num_parts)
    if method not in METHODS:
        raise PartitionError(f"unknown partition method {method!r}; choose one of {', '.join(METHODS)}")
    n = g.num_nodes
    if num_parts == 1 or n == 0:
        return torch.zeros(n, dtype=torch.long)
    if method == "random":
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(num_parts, (n,), generator=gen)
    if method == "metis":
        return _metis(g, num_parts, seed)
    return _contiguous(n, num_parts)


def _given_assignment(parts: torch.Tensor, num_nodes: int, num_parts: int) -> torch.Tensor:
    """A caller's assignment, checked: one integer part id in ``[0, num_parts)`` per node."""
    if parts.is_floating_point() or parts.is_complex() or parts.dtype == torch.bool:
        raise PartitionError(f"an assignment must hold integer part ids, got dtype {parts.dtype}")
    if parts.shape != (num_nodes,):
        raise PartitionError(
            f"an assignment must hold one part id per node ({num_nodes}), got shape {tuple(parts.shape)}"
        )
    parts = parts.detach().cpu().long()
    if num_nodes and (int(parts.min()) < 0 or int(parts.max()) >= num_parts):
        raise PartitionError(
            f"assignment part ids must lie in [0, {num_parts}), got [{int(parts.min())}, {int(parts.max())}]"
        )
    return parts


def _contiguous(num_nodes: int, num_parts: int) -> torch.Tensor:
    return torch.arange(num_nodes) * num_parts // num_nodes


def _symmetric_csr(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """CSR (``xadj``, ``adjncy``) of the undirected simple graph METIS expects.

    METIS requires both directions of every edge, no self-loops and no repeated neighbours.
    """
    n = g.num_nodes
    keep = g.src != g.dst
    u = torch.cat([g.src[keep], g.dst[keep]])
    v = torch.cat([g.dst[keep], g.src[keep]])
    # One sorted, de-duplicated key per (u, v) pair is already the CSR order.
    key = torch.unique(u * n + v)
    u, v = key // n, key % n
    xadj = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(torch.bincount(u, minlength=n), 0)])
    return xadj.numpy(), v.numpy()


def _metis(g: Graph, num_parts: int, seed: int) -> torch.Tensor:
    import pymetis

    xadj, adjncy = _symmetric_csr(g)
    if adjncy.size == 0 or g.num_nodes < num_parts:
        return _contiguous(g.num_nodes, num_parts)
    options = pymetis.Options(seed=seed)
    # pymetis >= 2025.2 takes a CSRAdjacency and deprecates xadj/adjncy; older ones only have those.
    if hasattr(pymetis, "CSRAdjacency"):
        result = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(xadj, adjncy), options=options)
    else:
        result = pymetis.part_graph(num_parts, xadj=xadj, adjncy=adjncy, options=options)
    parts = torch.as_tensor(np.asarray(result[1], dtype=np.int64))
    if parts.shape != (g.num_nodes,) or int(parts.min()) < 0 or int(parts.max()) >= num_parts:
        raise PartitionError(f"METIS returned an invalid assignment for {num_parts} parts; try method='random'")
    return parts


# -- the manifest ----------------------------------------------------------------------------
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


@dataclass
class Partition:
    """One worker's share of a partitioned graph, as :func:`load_partition` returns it.
    Of a typed partition: ``graph`` is a :class:`~sarcompile.graph.hetero.HeteroShard`, and
    ``node_data`` and ``global_ids`` are dicts by node type (``node_data["paper"]["x"]``).
    The graph's frames hold the node data, as a DGL script's graph does (``graph.ndata["x"]``;
    typed, ``graph.nodes["paper"].data["x"]``; see :mod:`sarcompile.graph.frames`): a model
    reading them runs as ``model(part.graph)``.

    Example:

    >>> import tempfile
    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> d = tempfile.mkdtemp()
    >>> _ = sc.partition(g, 2, d, node_data={"x": torch.ones(3, 2)})
    >>> parts = [sc.load_partition(d, rank=r, world_size=2) for r in range(2)]
    >>> sum(p.graph.num_nodes for p in parts)   # every node in exactly one part
    3
    """

    graph: ShardGraph | HeteroShard
    node_data: dict[str, Any] = field(repr=False)  # local rows, local order
    global_ids: torch.Tensor | dict[str, torch.Tensor] = field(repr=False)  # original id of every local row
    rank: int
    manifest: Manifest = field(repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.graph, HeteroShard):
            for t, data in self.node_data.items():
                self.graph.nodes[t].data.update(data)
        else:
            self.graph.ndata.update(self.node_data)


# -- writing ---------------------------------------------------------------------------------
def partition(
    g: Graph | HeteroGraph,
    num_parts: int,
    out_dir: str | os.PathLike,
    node_data: dict[str, Any] | None = None,
    method: str | torch.Tensor | dict[str, torch.Tensor] = "metis",
    seed: int = 0,
    name: str = "graph",
    allow_nonfinite: bool = False,
    node_ids: Any = None,
) -> Manifest:
    """Split ``g`` (and the node tensors in ``node_data``) into ``num_parts`` files under ``out_dir``.

    Worker ``r`` later reads its piece with :func:`load_partition`. Returns the manifest
    that is also written to ``out_dir/manifest.json``. ``method`` is as in :func:`assign`:
    a method name, or a tensor of part ids per node, recorded as method ``"given"``.

    The node tensors are checked first (:mod:`sarcompile.data.validate`: ``x`` floating point
    ``[nodes, features]``, ``y`` integer labels, boolean masks, no NaN or infinity in any
    floating-point tensor unless ``allow_nonfinite``); a violation raises
    :class:`GraphError` naming the node and column. While it writes, the directory is
    locked: another partition run on it raises :class:`~sarcompile.errors.RunDirError`.

    A :class:`~sarcompile.graph.hetero.HeteroGraph` takes ``node_data`` per node type
    (``{"paper": {"x": X, "y": Y}}``) and splits every type across all parts (see
    :mod:`sarcompile.data.typed_partition`).

    ``node_ids`` records the user's own id of every node (an array of integers or strings,
    ``node_ids[i]`` the id of node ``i``; per node type for a typed graph) in the directory,
    for :func:`read_node_ids` and the predictions read back by
    ``sc.read_predictions(DIR, ids=True)``.

    Example:

    >>> import tempfile
    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> manifest = sc.partition(g, 2, tempfile.mkdtemp(), node_data={"x": torch.ones(3, 2)})
    >>> manifest.num_parts, manifest.num_nodes, sum(p.num_nodes for p in manifest.parts)
    (2, 3, 3)
    """
    if isinstance(g, HeteroGraph):
        return typed.partition(g, num_parts, out_dir, node_data, method, seed, name, allow_nonfinite, node_ids)
    _check_graph(g)
    ids = None if node_ids is None else check_ids(node_ids, g.num_nodes, "node_ids")
    _check_num_parts(num_parts)
    node_data = _check_node_data(node_data, g.num_nodes)
    check_node_data(node_data, allow_nonfinite=allow_nonfinite)
    assignment = assign(g, num_parts, method, seed)
    parts = split_graph(g, assignment, num_parts, node_data)

    def manifest(infos: list[PartInfo]) -> Manifest:
        return Manifest(
            num_parts=num_parts,
            num_nodes=g.num_nodes,
            num_edges=g.num_edges,
            method="given" if isinstance(method, torch.Tensor) else method,
            seed=seed,
            name=name,
            parts=infos,
            halo_sizes=[[len(parts[q].send_index[r]) for q in range(num_parts)] for r in range(num_parts)],
            edge_cut=int((assignment[g.src] != assignment[g.dst]).sum()),
            node_data=describe_node_data(node_data),
            created=now(),
            graph_sha256=graph_sha256(g, node_data),
        )

    return write_directory(Path(out_dir), [(part.to_dict(), _part_info(part)) for part in parts], manifest, ids)


def write_directory(
    out: Path, parts: Sequence[tuple[dict, Callable[[int], PartInfo]]],
    manifest_of: Callable[[list[PartInfo]], Manifest], node_ids: Any = None,
) -> Manifest:
    """Write every part (its saved dict, and what makes its manifest entry once written),
    the user's node ids where given (see :mod:`.node_ids`) and then the manifest, atomically and under the directory's lock
    (see the module docstring); returns the manifest."""
    with lock_dir(out, "partition run"):  # creates out
        return write_locked(out, len(parts), iter(parts), manifest_of, node_ids)


def write_locked(
    out: Path, num_parts: int, parts: Iterator[tuple[dict, Callable[[int], PartInfo]]],
    manifest_of: Callable[[list[PartInfo]], Manifest], node_ids: Any = None,
) -> Manifest:
    """:func:`write_directory` for a caller that holds ``out``'s lock already, with the
    parts made one at a time as ``parts`` yields them (only one is ever in memory)."""
    # Temporary files of a killed run can go: nobody else writes here while we hold the lock.
    remove_stale_temps(out, ["part-*.pt", MANIFEST, IDS_FILES])
    # From here until the new manifest lands the directory must not load: drop the old
    # manifest first (durably) so old and new part files can never be read as one set.
    (out / MANIFEST).unlink(missing_ok=True)
    _fsync_dir(out)
    _remove_stale_parts(out, num_parts)
    for stale in out.glob(IDS_FILES):  # another graph's ids must not outlive its manifest
        stale.unlink()
    infos = []
    for r, (payload, info) in enumerate(parts):
        path = _write_part(out, r, payload)
        del payload  # a part can be large: drop it before the next is made
        infos.append(replace(info(r), file=path.name, sha256=_sha256(path), bytes=path.stat().st_size))
    if len(infos) != num_parts:
        raise PartitionError(f"internal error: {len(infos)} parts written of {num_parts}")
    manifest = manifest_of(infos)
    if node_ids is not None:
        manifest = replace(manifest, node_ids=write_node_ids(out, node_ids))
    _atomic_write(out / MANIFEST, lambda f: f.write(manifest.to_json().encode()))
    return manifest


def _write_part(out: Path, rank: int, payload: dict) -> Path:
    """Write ``part-{rank}.pt`` atomically; its path."""
    path = out / f"part-{rank}.pt"
    _atomic_write(path, lambda f: torch.save(payload, f))
    return path


def describe_node_data(node_data: dict[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    """The manifest's record of node tensors: dtype and trailing shape by name."""
    return {k: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape[1:])} for k, t in node_data.items()}


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _check_graph(g: Graph) -> None:
    if not isinstance(g, Graph):
        raise GraphError(
            f"expected a sarcompile Graph, got {type(g).__name__}; build one with Graph.from_edges or Graph.from_pyg"
        )


def _check_num_parts(num_parts: int) -> None:
    if isinstance(num_parts, bool) or not isinstance(num_parts, int) or num_parts < 1:
        raise PartitionError(f"num_parts must be an integer >= 1, got {num_parts!r}")


def _check_node_data(
    node_data: dict[str, torch.Tensor] | None, num_nodes: int, where: str = "node_data", owner: str = "the graph"
) -> dict[str, torch.Tensor]:
    """Node tensors as detached CPU tensors with one row per node, checked before any work.
    ``where`` names the container in messages, ``owner`` what has ``num_nodes`` nodes."""
    checked = {}
    for key, t in (node_data or {}).items():
        if not isinstance(key, str):
            raise GraphError(f"{where} keys must be strings, got {key!r}")
        if not isinstance(t, torch.Tensor):
            raise GraphError(f"{where}[{key!r}] must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() == 0 or t.shape[0] != num_nodes:
            raise GraphError(
                f"{where}[{key!r}] has shape {tuple(t.shape)} but {owner} has {num_nodes} nodes; "
                "node tensors need one row per node"
            )
        checked[key] = t.detach().cpu()
    return checked


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


def _remove_stale_parts(out: Path, num_parts: int) -> None:
    """Delete part files of an earlier partitioning into more parts (they may be large)."""
    for path in out.glob("part-*.pt"):
        index = path.stem.removeprefix("part-")
        if index.isdigit() and int(index) >= num_parts:
            path.unlink()


def _part_info(part: PartData) -> Callable[[int], PartInfo]:
    """What the manifest records of a part, given its rank (file and checksum come once written)."""
    return lambda rank: PartInfo(
        file="",
        num_nodes=part.global_ids.numel(),
        num_edges=part.edge_ids.numel(),
        sha256="",
        bytes=0,
        self_loops=part_self_loops(part, rank),
        block_edges=torch.bincount(part.edge_src_part, minlength=len(part.send_index)).tolist(),
    )


def part_self_loops(part: PartData, rank: int) -> int:
    """The self-loops among a part's in-edges (they sit in its local block)."""
    return int(((part.edge_src_part == rank) & (part.edge_src_local == part.edge_dst_local)).sum())


# -- reading ---------------------------------------------------------------------------------
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


def read_node_ids(directory: str | os.PathLike) -> np.ndarray | dict[str, np.ndarray]:
    """The user's id of every global node id of the partition in ``directory`` (see the
    module docstring): an array memory-mapped read-only, ``ids[i]`` the id of node ``i``; a
    dict of them per node type for a typed partition (the types that have ids).

    A partition made without the user's ids, or whose id file is missing or damaged,
    raises :class:`PartitionError` saying what to do.

    Example:

    >>> import tempfile
    >>> g = sc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    >>> d = tempfile.mkdtemp()
    >>> _ = sc.partition(g, 1, d, node_ids=np.array([10**12, 7]))
    >>> sc.read_node_ids(d).tolist()
    [1000000000000, 7]
    """
    manifest = read_manifest(directory)
    if manifest.node_ids is None:
        raise PartitionError(f"partition '{directory}' was made from node ids 0..n-1 (no ids of the user's are "
                             "recorded): global node id i is the graph's node i")
    redo = "re-run sarcompile partition"
    if manifest.typed:
        return {t: open_ids(Path(directory), r, PartitionError, redo) for t, r in manifest.node_ids.items()}
    return open_ids(Path(directory), manifest.node_ids, PartitionError, redo)


def load_partition(
    out_dir: str | os.PathLike,
    rank: int | None = None,
    world_size: int | None = None,
    allow_nonfinite: bool = False,
) -> Partition:
    """Load worker ``rank``'s part of the partition in ``out_dir``.

    ``rank`` and ``world_size`` default to torch.distributed's when a process group is
    up, else to 0 and 1. The part file is checked against the manifest's checksum and
    halo sizes before it is used, and its node data as :func:`partition` checks it
    (a partition written by an older version may hold NaN features or float labels):
    a :class:`PartitionError` names the node and column.

    Example:

    >>> import tempfile
    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> d = tempfile.mkdtemp()
    >>> _ = sc.partition(g, 2, d, node_data={"x": torch.arange(6.).reshape(3, 2)})
    >>> part = sc.load_partition(d, rank=0, world_size=2)   # in a worker: sc.load_partition(d)
    >>> part.graph.num_nodes == part.node_data["x"].shape[0]
    True
    """
    rank, world_size = _rank_and_world(rank, world_size)
    manifest = read_manifest(out_dir)
    if manifest.num_parts != world_size:
        raise PartitionError(
            f"partition '{out_dir}' has {manifest.num_parts} parts but this run has {world_size} workers: "
            f"start {manifest.num_parts} workers in all (torchrun's --nnodes x --nproc-per-node), "
            f"or repartition with --parts {world_size}"
        )
    if not 0 <= rank < world_size:
        raise PartitionError(f"rank {rank} is outside [0, {world_size})")
    if manifest.typed:
        return typed.load(out_dir, manifest, rank, allow_nonfinite)
    part = read_part(out_dir, manifest, rank, mmap=True)
    graph = ShardGraph.from_part(part, rank, world_size, manifest.num_nodes, manifest.num_edges)
    # The part file is mapped, not read: a worker's pages are only those it touches. Its
    # edge lists were touched to build the shard, which holds copies; dropping every
    # tensor of that mapping unmaps them. The node data comes from a second mapping of
    # the same (already checked) file, so only its node-data pages become resident.
    path = Path(out_dir) / manifest.parts[rank].file
    del part
    node_data = _as_part(_load_part(path, mmap=True), path).node_data
    check_node_data(
        node_data, ids=graph.global_ids, allow_nonfinite=allow_nonfinite, error=PartitionError,
        where=f"part file '{path}': node_data", fix="re-run partition with corrected node data",
    )
    release_free()
    return Partition(graph, node_data, graph.global_ids, rank, manifest)


def load_whole_graph(out_dir: str | os.PathLike) -> tuple[Graph | HeteroGraph, dict[str, Any]]:
    """Reassemble the original graph (edges in their original order) and node tensors
    from every part of a partition directory: the single-machine reference of a run.
    A typed partition gives a :class:`~sarcompile.graph.hetero.HeteroGraph` and node tensors per type.

    Example:

    >>> import tempfile
    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    >>> d = tempfile.mkdtemp()
    >>> _ = sc.partition(g, 2, d, node_data={"x": torch.ones(3, 2)})
    >>> whole, data = sc.load_whole_graph(d)
    >>> whole.num_nodes, whole.num_edges, list(data)
    (3, 4, ['x'])
    """
    manifest = read_manifest(out_dir)
    if manifest.typed:
        return typed.load_whole(out_dir, manifest)
    parts = [read_part(out_dir, manifest, r) for r in range(manifest.num_parts)]
    src = torch.empty(manifest.num_edges, dtype=torch.long)
    dst = torch.empty(manifest.num_edges, dtype=torch.long)
    node_data: dict[str, torch.Tensor] = {}
    for part in parts:
        src[part.edge_ids] = part.edge_src_gid
        dst[part.edge_ids] = part.global_ids[part.edge_dst_local]
        for key, rows in part.node_data.items():
            if key not in node_data:
                node_data[key] = rows.new_empty((manifest.num_nodes, *rows.shape[1:]))
            node_data[key][part.global_ids] = rows
    return Graph(src, dst, manifest.num_nodes), node_data


def read_part(out_dir: str | os.PathLike, manifest: Manifest, rank: int, mmap: bool = False) -> PartData:
    """Part ``rank``, after checking it exists and matches the manifest's checksum and halos.
    With ``mmap``, its tensors are copy-on-write views of the mapped file."""
    path, saved = read_part_file(out_dir, manifest, rank, mmap)
    part = _as_part(saved, path)
    _check_halos(part, manifest.halo_sizes, rank, path)
    return part


def read_part_file(
    out_dir: str | os.PathLike, manifest: Manifest, rank: int, mmap: bool = False,
) -> tuple[Path, dict]:
    """The path and saved contents of part ``rank``'s file, after checking it exists and
    matches the manifest's checksum."""
    info = manifest.parts[rank]
    path = Path(out_dir) / info.file
    if not path.is_file():
        raise PartitionError(f"part file '{path}' is missing; re-run partition")
    if _sha256(path) != info.sha256:
        raise PartitionError(
            f"part file '{path}' does not match the manifest's checksum: "
            "file corrupt or from another partitioning; re-run partition"
        )
    return path, _load_part(path, mmap)


def _load_part(path: Path, mmap: bool) -> dict:
    try:
        # weights_only (in every torch >= 2.2 this package supports) refuses arbitrary pickles.
        # (a str: torch 2.2 maps only a file named by one)
        saved = torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # unpickling raises many types; every one means the same here
        if mmap:  # a file system that cannot map files: read it whole (a damaged file fails there too)
            return _load_part(path, mmap=False)
        raise PartitionError(f"cannot read part file '{path}' ({type(e).__name__}: {e}); re-run partition") from None
    if not isinstance(saved, dict):
        raise PartitionError(f"part file '{path}' holds a {type(saved).__name__}, not a part; re-run partition")
    return saved


def _as_part(saved: dict, path: Path) -> PartData:
    try:
        return PartData(**saved)
    except TypeError as e:
        raise PartitionError(f"part file '{path}' is not a part of this format ({e}); re-run partition") from None


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    dist = torch.distributed
    running = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if running else 0
    if world_size is None:
        world_size = dist.get_world_size() if running else 1
    return rank, world_size


def _check_halos(part: PartData, halo_sizes: list[list[int]], rank: int, path: Path, what: str = "") -> None:
    """The rows this part sends to each peer must be the halo sizes the manifest promises."""
    sent = [len(s) for s in part.send_index]
    promised = [halo_sizes[q][rank] for q in range(len(halo_sizes))]
    if sent != promised:
        raise PartitionError(
            f"part file '{path}' sends {sent} rows{what} to its peers but the manifest says {promised}; "
            "re-run partition"
        )


# -- reporting -------------------------------------------------------------------------------
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
