"""Reading a graph from one edge file (``.pt``, ``.npz`` or ``.csv``) whole, for
``sarcompile partition --edges FILE``.

A CSV is read by the out-of-core converter's reader
(:func:`sarcompile.data.outofcore.convert.csv_edge_arrays`), so that a CSV means the
same, header rules and errors included, whichever way it is partitioned.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sarcompile.errors import GraphError
from sarcompile.graph.graph import Graph
from sarcompile.data.outofcore.convert import csv_edge_arrays

__all__ = ["load_edge_file"]


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
        src, dst = map(torch.from_numpy, csv_edge_arrays(path))
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
