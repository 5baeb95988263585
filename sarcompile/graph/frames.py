"""Graph frames: per-node and per-edge tensors kept on a sarcompile graph, as DGL keeps them.

DGL scripts store a graph's data on it (``g.ndata["feat"] = x``, ``g.edata[dgl.ETYPE] = t``,
``G.nodes["paper"].data["inp"] = x``) and call ``model(g)``, whose forward reads them. Every
sarcompile graph has such frames: :class:`~sarcompile.graph.graph.Graph` and a worker's
:class:`~sarcompile.graph.shard.ShardGraph` ``ndata`` / ``edata``; the typed graphs
(:class:`~sarcompile.graph.hetero.HeteroGraph`, :class:`~sarcompile.graph.hetero.HeteroShard`)
``G.nodes[t].data``, ``G.edges[rel].data`` and ``G.ndata`` / ``G.edata`` by type, as DGL
has them. A field has one row per node (of its type) or per edge (of its relation): on a
worker, its own nodes and its shard's edges, in the shard's order. The compiled model reads
the fields of the graph it is called with as inputs of the program (see
:mod:`sarcompile.compile.leaves`).

>>> import torch
>>> g = sc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
>>> g.ndata["feat"] = torch.ones(3, 4)
>>> sorted(g.ndata), tuple(g.ndata["feat"].shape)
(['feat'], (3, 4))
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Iterator

import torch

from sarcompile.errors import GraphError

__all__ = ["Frame", "FramesMixin", "TypedFramesMixin", "frame_keys", "frame_of", "copy_dgl_frames"]


class Frame(MutableMapping):
    """One frame: a tensor per field name, each with ``rows`` rows (``what`` says whose,
    e.g. ``g.ndata``, for the message when they do not fit)."""

    def __init__(self, rows: int, what: str, unit: str):
        self._rows, self._what, self._unit = rows, what, unit
        self._data: dict[str, torch.Tensor] = {}

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            raise GraphError(f"{self._what}[{key!r}] takes a tensor with a row per {self._unit[:-1]}, got "
                             f"{type(value).__name__ if not isinstance(value, torch.Tensor) else 'a 0-dim tensor'}")
        if value.shape[0] != self._rows:
            raise GraphError(f"{self._what}[{key!r}] has {value.shape[0]} rows but the graph has {self._rows} "
                             f"{self._unit}: give one row per {self._unit[:-1]} (on a worker, its own, in part.graph's "
                             "order)")
        self._data[key] = value

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._data[key]

    def __delitem__(self, key: str) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"{self._what}({', '.join(f'{k}: {tuple(v.shape)}' for k, v in self._data.items())})"


def _frame(owner: Any, slot: str, rows: int, what: str, unit: str) -> Frame:
    """``owner``'s frame ``slot``, made on first use."""
    frame = owner.__dict__.get(slot)
    if frame is None:
        frame = owner.__dict__[slot] = Frame(rows, what, unit)
    return frame


class FramesMixin:
    """``ndata`` (a row per node: the destination nodes of a bipartite graph, a worker's own)
    and ``edata`` (a row per edge) of a one-type graph."""

    @property
    def ndata(self) -> Frame:
        return _frame(self, "_ndata", self.num_nodes, "g.ndata", "nodes")

    @property
    def edata(self) -> Frame:
        return _frame(self, "_edata", self.num_edges, "g.edata", "edges")


class _Data:
    def __init__(self, data: Frame):
        self.data = data


class _TypeView:
    """``G.nodes`` / ``G.edges``: ``G.nodes["paper"].data`` is the frame of that type."""

    def __init__(self, frame: Any):
        self._frame = frame

    def __getitem__(self, key: Any) -> _Data:
        return _Data(self._frame(key))


class _ByType(MutableMapping):
    """``G.ndata`` / ``G.edata`` of a typed graph, as DGL has them: ``G.ndata["h"]`` is
    ``{type: tensor}`` over the types that have the field, ``G.ndata["h"] = {type: tensor}``
    sets it per type."""

    def __init__(self, frames: dict[Any, Frame]):
        self._frames = frames

    def __getitem__(self, field: str) -> dict[Any, torch.Tensor]:
        found = {k: f[field] for k, f in self._frames.items() if field in f}
        if not found:
            raise KeyError(field)
        return found

    def __setitem__(self, field: str, value: dict[Any, torch.Tensor]) -> None:
        if not isinstance(value, dict):
            raise GraphError(f"on a graph of several types, set a field per type: G.ndata[{field!r}] = "
                             "{ntype: tensor} (G.edata: {relation: tensor}), or G.nodes[ntype].data[field] = tensor")
        for k, v in value.items():
            self._frames[k][field] = v

    def __delitem__(self, field: str) -> None:
        for f in self._frames.values():
            f.pop(field, None)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(k for f in self._frames.values() for k in f))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class TypedFramesMixin:
    """Frames of a typed graph: one per node type (rows of that type, a worker's own) and
    the frames of each relation's graph (``G.edges[rel].data is G[rel].edata``)."""

    def _node_frame(self, ntype: str) -> Frame:
        frames = self.__dict__.setdefault("_node_frames", {})
        if ntype not in frames:
            if ntype not in self.node_types:
                raise GraphError(f"no node type {ntype!r}; the graph has {list(self.node_types)}")
            frames[ntype] = Frame(self.num_nodes(ntype), f"G.nodes[{ntype!r}].data", "nodes")
        return frames[ntype]

    def _edge_frame(self, etype: Any) -> Frame:
        return self[etype].edata

    @property
    def nodes(self) -> _TypeView:
        return _TypeView(self._node_frame)

    @property
    def edges(self) -> _TypeView:
        return _TypeView(self._edge_frame)

    @property
    def ndata(self) -> _ByType:
        return _ByType({t: self._node_frame(t) for t in self.node_types})

    @property
    def edata(self) -> _ByType:
        return _ByType({rel: self._edge_frame(rel) for rel in self.edge_types})


def frame_of(graph: Any, end: str, of: Any) -> Frame:
    """The frame of ``graph`` at ``end`` (``ndata`` or ``edata``), of node type or relation
    ``of`` on a typed graph (None on a one-type graph)."""
    if of is None:
        return getattr(graph, end)
    return graph._node_frame(of) if end == "ndata" else graph._edge_frame(of)


def frame_keys(graph: Any) -> tuple[tuple[str, Any, str], ...]:
    """Every field on ``graph``'s frames, as ``(end, type or relation or None, field)``."""
    if isinstance(graph, TypedFramesMixin):
        return (*(("ndata", t, f) for t in graph.node_types for f in graph._node_frame(t)),
                *(("edata", r, f) for r in graph.edge_types for f in graph._edge_frame(r)))
    return (*(("ndata", None, f) for f in graph.ndata), *(("edata", None, f) for f in graph.edata))


def copy_dgl_frames(source: Any, graph: Any) -> Any:
    """``graph`` with the frames of DGL graph ``source``, in place of its own: what ``from_dgl`` copies, and a DGL graph given again is refreshed
    with, as a script may set its fields between calls."""
    if isinstance(graph, TypedFramesMixin):
        pairs = [(graph.nodes[t].data, source.nodes[t].data) for t in source.ntypes]
        pairs += [(graph.edges[tuple(rel)].data, source.edges[rel].data) for rel in source.canonical_etypes]
    else:
        pairs = [(graph.ndata, source.ndata), (graph.edata, source.edata)]
    for ours, theirs in pairs:
        ours.clear()
        ours.update(dict(theirs))
    return graph
