"""Cut a graph into one piece per worker and write the pieces to a directory.

:func:`partition` assigns every node a part (:mod:`sarcompile.data.assign`), splits the
edges and node data by it (:func:`sarcompile.graph.shard.split_graph`) and writes the
parts and the manifest (:mod:`sarcompile.data.part_files`, :mod:`sarcompile.data.manifest`);
:func:`sarcompile.data.loading.load_partition` reads one part back::

    >>> import tempfile
    >>> g = Graph.from_edges(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0]), num_nodes=4)
    >>> out = tempfile.mkdtemp()
    >>> m = partition(g, 2, out, method="contiguous")
    >>> m.edge_cut, m.halo_sizes
    (2, [[0, 1], [1, 0]])
    >>> p = sc.load_partition(out, rank=1, world_size=2)
    >>> p.global_ids.tolist(), p.graph.in_degrees().tolist()
    ([2, 3], [1, 1])

Node data is checked before anything is written (:mod:`sarcompile.data.validate`):
features ``x`` floating point ``[nodes, features]`` and finite, labels ``y`` integers,
masks boolean. A typed graph goes to :func:`sarcompile.data.typed_partition.partition_typed`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sarcompile.graph.graph import Graph
from sarcompile.graph.hetero import HeteroGraph
from sarcompile.graph.shard import PartData, split_graph
from sarcompile.data.assign import _check_graph, _check_num_parts, assign
from sarcompile.data.manifest import Manifest, PartInfo, describe_node_data, graph_sha256, now, part_self_loops
from sarcompile.data.node_ids import check_ids
from sarcompile.data.part_files import write_directory
from sarcompile.data.typed_partition import partition_typed
from sarcompile.data.validate import check_node_data, check_node_tensors

__all__ = ["partition"]


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
        return partition_typed(g, num_parts, out_dir, node_data, method, seed, name, allow_nonfinite, node_ids)
    _check_graph(g)
    ids = None if node_ids is None else check_ids(node_ids, g.num_nodes, "node_ids")
    _check_num_parts(num_parts)
    node_data = check_node_tensors(node_data, g.num_nodes)
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
