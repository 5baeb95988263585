"""Reuse a partition made by DGL: turn ``dgl.distributed.partition_graph``'s output into a
sarcompile partition directory with exactly DGL's node-to-part assignment.

DGL writes a JSON config plus, per part, ``graph.dgl`` (the part's inner nodes, its halo
nodes and edges, with DGL's global ids in ``ndata[dgl.NID]`` / ``edata[dgl.EID]`` and the
``inner_node`` / ``inner_edge`` flags) and ``node_feat.dgl`` (the inner nodes' features
under keys ``"_N/<name>"``)::

    dgl.distributed.partition_graph(g, "mygraph", 4, "dgl_parts", part_method="metis")
    convert_dgl_partition("dgl_parts/mygraph.json", "parts")   # or on the command line:
    # sarcompile partition --dgl-partition dgl_parts/mygraph.json --out parts

The converted directory holds the same graph: every edge once (from the part where DGL
flags it inner), every node in the part where DGL flags it inner, and the node features
under their names without DGL's ``"_N/"`` prefix (bool tensors come back as ``uint8``:
DGL's files store them so). DGL's edge features are not carried over (a sarcompile
partition holds node tensors only).

Node ids. ``partition_graph`` renumbers nodes and edges so each part's are a contiguous
range (the "reshuffled" ids) and does not store the original ids: ``return_mapping=True``
only *returns* them (``orig_nids, orig_eids``). The converted directory uses

* the original ids, when ``orig_nids`` (and optionally ``orig_eids``) are passed -- the
  tensors ``partition_graph(..., return_mapping=True)`` returned, saved by the caller -- or
  when the part graphs carry an ``orig_id`` node field (as partitions of older DGL did);
* otherwise DGL's reshuffled ids, which ``dgl.distributed`` training also uses.

The manifest's ``name`` says which (``"<graph> (DGL metis partition, reshuffled ids)"``),
its ``method`` is ``"given"``. Edges are stored in original edge-id order when the original
edge ids are known, else in DGL's reshuffled edge-id order.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from sarcompile.errors import PartitionError
from sarcompile.graph.graph import Graph
from sarcompile.data.manifest import Manifest
from sarcompile.data.partitioning import partition

__all__ = ["convert_dgl_partition"]


def convert_dgl_partition(
    config_json_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    orig_nids: torch.Tensor | None = None,
    orig_eids: torch.Tensor | None = None,
    name: str | None = None,
    num_parts: int | None = None,
) -> Manifest:
    """Write the DGL partition described by ``config_json_path`` to ``out_dir`` as a
    sarcompile partition directory (same number of parts, same node assignment).

    ``orig_nids`` / ``orig_eids``: what ``partition_graph(..., return_mapping=True)``
    returned (``orig_nids[reshuffled id] = original id``); with them the directory uses the
    original node (and edge) ids. ``name`` replaces DGL's graph name in the manifest.
    ``num_parts``, if given, must be the partition's number of parts (checked first).
    Refuses heterogeneous graphs and missing or unreadable files with a
    :class:`~sarcompile.PartitionError` naming the file. Needs ``dgl`` to read DGL's files.
    """
    config_path = Path(config_json_path)
    config = _read_config(config_path)
    parts_in_config, num_nodes, num_edges, ntype = _check_homogeneous(config, config_path)
    if num_parts is not None and num_parts != parts_in_config:
        raise PartitionError(
            f"asked for {num_parts} parts but the DGL partition '{config_path}' has {parts_in_config}; "
            "convert it as it is, or repartition with DGL"
        )
    num_parts = parts_in_config
    load_graphs, load_tensors, nid_key, eid_key = _dgl_io()

    owner = torch.full((num_nodes,), -1, dtype=torch.long)
    src = torch.full((num_edges,), -1, dtype=torch.long)
    dst = torch.full((num_edges,), -1, dtype=torch.long)
    stored_orig: torch.Tensor | None = None  # an ``orig_id`` node field, if the parts carry one
    features: dict[str, torch.Tensor] = {}
    for p in range(num_parts):
        files = config.get(f"part-{p}")
        if not isinstance(files, dict) or "part_graph" not in files:
            raise PartitionError(f"DGL partition config '{config_path}' has no part_graph entry for part-{p}")
        graph_path = _existing(config_path, files["part_graph"], f"part {p}'s graph")
        pg = _read(graph_path, lambda path: load_graphs(path)[0][0])
        for key in ("inner_node", nid_key):
            if key not in pg.ndata:
                raise PartitionError(f"'{graph_path}' has no node field {key!r}: not a DGL partition graph")
        for key in ("inner_edge", eid_key):
            if key not in pg.edata:
                raise PartitionError(f"'{graph_path}' has no edge field {key!r}: not a DGL partition graph")
        nid = pg.ndata[nid_key].long()
        inner = pg.ndata["inner_node"].bool()
        inner_nid = nid[inner]
        _check_ids(inner_nid, num_nodes, "node", graph_path)
        if bool((owner[inner_nid] != -1).any()):
            raise PartitionError(f"'{graph_path}' claims nodes another part already owns: inconsistent partition")
        owner[inner_nid] = p
        if "orig_id" in pg.ndata:
            if stored_orig is None:
                stored_orig = torch.full((num_nodes,), -1, dtype=torch.long)
            stored_orig[inner_nid] = pg.ndata["orig_id"].long()[inner]

        u, v = pg.edges()
        inner_edge = pg.edata["inner_edge"].bool()
        eid = pg.edata[eid_key].long()[inner_edge]
        _check_ids(eid, num_edges, "edge", graph_path)
        if bool((src[eid] != -1).any()):
            raise PartitionError(f"'{graph_path}' claims edges another part already holds: inconsistent partition")
        src[eid] = nid[u.long()[inner_edge]]
        dst[eid] = nid[v.long()[inner_edge]]

        if "node_feats" in files:
            feat_path = _existing(config_path, files["node_feats"], f"part {p}'s node features")
            _add_features(features, _read(feat_path, load_tensors), ntype,
                          inner_nid, num_nodes, feat_path)

    if bool((owner == -1).any()) or bool((src == -1).any()):
        raise PartitionError(
            f"the parts of '{config_path}' leave {int((owner == -1).sum())} nodes and {int((src == -1).sum())} "
            "edges without an owner: incomplete DGL partition"
        )
    if orig_nids is None and stored_orig is not None and bool((stored_orig != -1).all()):
        orig_nids = stored_orig
    if orig_eids is not None and orig_nids is None:
        raise PartitionError("orig_eids needs orig_nids too (both come from partition_graph(return_mapping=True))")

    ids = "reshuffled ids"
    if orig_nids is not None:
        perm = _check_permutation(orig_nids, num_nodes, "orig_nids")
        src, dst = perm[src], perm[dst]
        owner = _scatter(owner, perm)
        features = {k: _scatter(t, perm) for k, t in features.items()}
        ids = "original ids"
        if orig_eids is not None:
            eperm = _check_permutation(orig_eids, num_edges, "orig_eids")
            src, dst = _scatter(src, eperm), _scatter(dst, eperm)

    graph_name = name or str(config.get("graph_name", config_path.stem))
    label = f"{graph_name} (DGL {config.get('part_method', '?')} partition, {ids})"
    g = Graph.from_edges(src, dst, num_nodes)
    return partition(g, num_parts, out_dir, node_data=features, method=owner, name=label)


# -- reading DGL's files ----------------------------------------------------------------------
def _dgl_io() -> tuple[Any, Any, str, str]:
    """DGL's graph and tensor readers and its id field names; a clear error without DGL."""
    try:
        import dgl
        from dgl.data.utils import load_graphs, load_tensors
    except ImportError as e:
        raise PartitionError(
            f"reading a DGL partition needs DGL, which cannot be imported ({e}); install dgl "
            "(scripts/dgl_env.sh makes an environment with it)"
        ) from None
    return load_graphs, load_tensors, dgl.NID, dgl.EID


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise PartitionError(
            f"DGL partition config '{path}' not found: pass the JSON file partition_graph wrote "
            "(OUT_PATH/GRAPH_NAME.json)"
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PartitionError(f"cannot read DGL partition config '{path}' ({e})") from None
    if not isinstance(config, dict):
        raise PartitionError(f"DGL partition config '{path}' is not a JSON object")
    return config


def _check_homogeneous(config: dict[str, Any], path: Path) -> tuple[int, int, int, str]:
    """``num_parts, num_nodes, num_edges`` and the one node type's name; refuses the rest."""
    missing = [k for k in ("num_parts", "num_nodes", "num_edges") if not isinstance(config.get(k), int)]
    if missing:
        raise PartitionError(f"DGL partition config '{path}' has no integer {', '.join(missing)}")
    ntypes = config.get("ntypes", {"_N": 0})
    etypes = config.get("etypes", {"_N:_E:_N": 0})
    if len(ntypes) != 1 or len(etypes) != 1:
        raise PartitionError(
            f"DGL partition '{path}' is of a heterogeneous graph ({len(ntypes)} node types, {len(etypes)} edge "
            "types); sarcompile converts homogeneous ones only: partition dgl.to_homogeneous(g) instead"
        )
    return config["num_parts"], config["num_nodes"], config["num_edges"], next(iter(ntypes))


def _existing(config_path: Path, relative: str, what: str) -> Path:
    path = config_path.parent / relative
    if not path.is_file():
        raise PartitionError(f"{what} '{path}' (named in '{config_path}') is missing")
    return path


def _read(path: Path, load: Any) -> Any:
    """``load(str(path))``, any failure a :class:`PartitionError` naming the file."""
    try:
        return load(str(path))
    except Exception as e:  # noqa: BLE001 -- DGL raises DGLError and others for a bad file
        raise PartitionError(f"cannot read '{path}' ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None


def _check_ids(ids: torch.Tensor, count: int, what: str, path: Path) -> None:
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= count):
        raise PartitionError(f"'{path}' holds {what} ids outside [0, {count}): not from this config")


def _add_features(
    features: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor], ntype: str,
    inner_nid: torch.Tensor, num_nodes: int, path: Path,
) -> None:
    """Scatter one part's feature rows (one per inner node, in inner-node order) into
    whole-graph tensors, named without DGL's ``"<ntype>/"`` prefix."""
    for key, rows in tensors.items():
        feat = key.removeprefix(f"{ntype}/")
        if rows.dim() == 0 or rows.shape[0] != inner_nid.numel():
            raise PartitionError(
                f"'{path}': {key!r} has shape {tuple(rows.shape)} but the part has {inner_nid.numel()} inner nodes"
            )
        if feat not in features:
            features[feat] = rows.new_zeros((num_nodes, *rows.shape[1:]))
        elif features[feat].shape[1:] != rows.shape[1:] or features[feat].dtype != rows.dtype:
            raise PartitionError(f"'{path}': {key!r} differs in shape or dtype from the other parts' {key!r}")
        features[feat][inner_nid] = rows


def _check_permutation(perm: Any, count: int, what: str) -> torch.Tensor:
    perm = torch.as_tensor(perm)
    if perm.is_floating_point() or perm.shape != (count,):
        raise PartitionError(f"{what} must be {count} integer ids (what return_mapping=True returned)")
    perm = perm.long()
    if not torch.equal(torch.sort(perm).values, torch.arange(count)):
        raise PartitionError(f"{what} is not a permutation of 0..{count - 1}: not the mapping of this partition")
    return perm


def _scatter(t: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``out[perm[i]] = t[i]``: rows by reshuffled id to rows by original id."""
    out = torch.empty_like(t)
    out[perm] = t
    return out
