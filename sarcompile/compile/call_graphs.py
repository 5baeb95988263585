"""The graphs of a call: found in its arguments (a graph, a list of them, a DGL graph or a
``torch.sparse`` adjacency, converted once and kept) and on the model itself (``self.g``,
a list of graphs), each an input of the program."""

from __future__ import annotations


from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sarcompile.compile.data_argument import data_graph, is_data, with_graph
from sarcompile.errors import CompileError
from sarcompile.graph.frames import copy_dgl_frames
from sarcompile.graph.graph import Graph
from sarcompile.graph.hetero import HeteroGraph, HeteroShard
from sarcompile.graph.shard import ShardGraph


GRAPHS = (Graph, ShardGraph, HeteroGraph, HeteroShard)


def is_graph(value: Any) -> bool:
    """Whether ``value`` is a graph, or a non-empty list or tuple of graphs (DGL's
    ``blocks``, a list of metapath graphs)."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(isinstance(v, GRAPHS) for v in value)
    return isinstance(value, GRAPHS)


def first_graph(value: Any) -> Any:
    """``value`` if it is a graph, its first if it is a list of them, the graph of a PyG
    ``Data`` (its ``edge_index``), else None."""
    if is_data(value):
        return data_graph(value)
    if not is_graph(value):
        return None
    return value[0] if isinstance(value, (list, tuple)) else value


def _dgl_graph(value: Any) -> bool:
    return type(value).__module__.startswith("dgl.") and hasattr(value, "canonical_etypes")


def _adjacency(value: Any) -> bool:
    """Whether ``value`` is a square sparse adjacency (PyG's ``adj_t`` as ``ToSparseTensor``
    makes it without torch_sparse: a ``torch.sparse_csr`` or ``sparse_coo`` tensor)."""
    return (isinstance(value, torch.Tensor) and value.layout in (torch.sparse_csr, torch.sparse_coo)
            and value.dim() == 2 and value.shape[0] == value.shape[1])


def _convertible(value: Any) -> bool:
    """A DGL graph or a sparse adjacency, or a non-empty list or tuple of them: what the
    compiler converts to sarcompile graphs (see :func:`_converted`)."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(_dgl_graph(v) or _adjacency(v) for v in value)
    return _dgl_graph(value) or _adjacency(value)


@dataclass
class _Graphs:
    """Where a call's graphs are: the argument holding one (a position or keyword; None if
    none does) and those the model keeps (``kept``: by attribute path); ``partitioned``
    whether they are a worker's shards."""

    where: int | str | None
    kept: dict[str, Any]
    partitioned: bool
    first: Any  # the first graph found (a typed shard's node tables are sharded by it)
    args: tuple  # the call's arguments, each DGL graph or sparse adjacency converted
    kwargs: dict


def find_graphs(model: nn.Module, args: tuple, kwargs: dict, converted: dict[int, tuple[Any, Any]]) -> _Graphs:
    """The graphs of ``model(*args, **kwargs)``: in an argument (a graph, or a list or tuple
    of graphs), and kept on the model's modules as attributes (``self.g = g``, or a list of
    graphs) -- a DGL graph or a sparse adjacency in either place is converted (once,
    ``converted`` keeps it, see :func:`_converted`) to the sarcompile graph of the same
    nodes and edges, and the call's arguments are given with it in its place. All of them
    are whole graphs (one machine) or all a worker's shards. A PyG ``Data`` argument holds its
    graph as ``edge_index`` (a tensor there is converted, see :mod:`sarcompile.compile.data_argument`)."""
    args = tuple(_converted(v, converted) if _convertible(v) else with_graph(v, converted, _CONVERTED_KEPT)
                 for v in args)
    kwargs = {k: _converted(v, converted) if _convertible(v) else with_graph(v, converted, _CONVERTED_KEPT)
              for k, v in kwargs.items()}
    where = next((w for w, v in [*enumerate(args), *kwargs.items()] if is_graph(v) or data_graph(v) is not None),
                 None)
    kept = kept_graphs(model, converted)
    held = None if where is None else args[where] if isinstance(where, int) else kwargs[where]
    found = {} if held is None else {f"argument {where!r}": data_graph(held) if is_data(held) else held}
    found |= {f"self.{path}": v for path, v in kept.items()}
    if not found:
        raise CompileError(
            "no graph: sarcompile looked in forward's arguments (a graph, or a list or tuple of graphs) and in the "
            "model's attributes (self.g = g, kept by any of its modules), and found none. Call the model with a graph "
            "(model(g, x): a sarcompile Graph or HeteroGraph, a DGL graph or a sparse adjacency on one machine, a "
            "worker's part.graph), or keep it on the model: self.g = g in __init__, and on a worker model.g = "
            "part.graph"
        )
    shards = {what: all(isinstance(g, (ShardGraph, HeteroShard)) for g in (v if isinstance(v, (list, tuple)) else [v]))
              for what, v in found.items()}
    if len(set(shards.values())) > 1:
        whole = [what for what, shard in shards.items() if not shard]
        raise CompileError(
            f"the model's graphs are a worker's shards ({', '.join(w for w in shards if shards[w])}) and whole graphs "
            f"({', '.join(whole)}) at once; on a worker give every graph as its shard: part.graph, e.g. "
            f"model.{whole[0][5:] if whole[0].startswith('self.') else 'g'} = part.graph"
        )
    return _Graphs(where, kept, next(iter(shards.values())), first_graph(next(iter(found.values()))), args, kwargs)


def kept_graphs(model: nn.Module, converted: dict[int, tuple[Any, Any]]) -> dict[str, Any]:
    """The graphs ``model``'s modules keep as public attributes (a graph or a list or tuple
    of graphs), by path; a DGL graph as its sarcompile graph (see :func:`find_graphs`)."""
    kept: dict[str, Any] = {}
    for prefix, module in model.named_modules():
        for name, value in vars(module).items():
            if name.startswith("_"):
                continue
            if _convertible(value):
                value = _converted(value, converted)
            if is_graph(value):
                kept[f"{prefix}.{name}" if prefix else name] = value
    return kept


# DGL graphs and adjacencies a model was given, kept converted (the last few: a model called
# with a new graph each time converts each once).
_CONVERTED_KEPT = 8


def _converted(value: Any, converted: dict[int, tuple[Any, Any]]) -> Any:
    """The sarcompile graph of ``value`` (or of each in a list or tuple): a DGL graph's
    (``Graph.from_dgl``, ``HeteroGraph.from_dgl`` for a heterograph) or a sparse
    adjacency's (rows the destinations, as PyG's ``adj_t``). Converted once: ``converted``
    keeps the last few by id, with the object, so an id reused by another is not mistaken;
    a DGL graph's frames are copied again each time (a script sets its fields between calls)."""
    if isinstance(value, (list, tuple)):
        return type(value)(_converted(v, converted) for v in value)
    kept = converted.get(id(value))
    if kept is None or kept[0] is not value:
        kept = (value, _adjacency_graph(value) if isinstance(value, torch.Tensor) else _dgl_to_graph(value))
        converted[id(value)] = kept
        while len(converted) > _CONVERTED_KEPT:
            del converted[next(iter(converted))]
    elif not isinstance(value, torch.Tensor):
        copy_dgl_frames(value, kept[1])
    return kept[1]


def _dgl_to_graph(g: Any) -> Graph | HeteroGraph:
    if g.is_block:
        raise CompileError(
            "a DGL block (a sampled minibatch's, dgl.to_block) was given: sarcompile trains on the whole graph, "
            "split across workers. Give the graph itself (a list [g, g] where the model takes one block per layer)"
        )
    homogeneous = len(g.ntypes) == 1 and len(g.canonical_etypes) == 1
    return Graph.from_dgl(g) if homogeneous else HeteroGraph.from_dgl(g)


def _adjacency_graph(adj: torch.Tensor) -> Graph:
    """The graph of sparse adjacency ``adj`` (:meth:`Graph.from_adjacency`: its edges, and its
    values where they are not all ones or it has self-loops, which PyG's layers read as they
    read the matrix). Values that require grad are refused: the program takes them as data."""
    if adj.requires_grad:
        raise CompileError(
            "a sparse adjacency whose values require grad was given as the graph; sarcompile takes the adjacency's "
            "values as data and gives them no gradient. Give adj_t.detach(), or the graph and a weight per edge "
            "(model(x, g, edge_weight=w), w in the graph's edge order) where the weights are learned"
        )
    return Graph.from_adjacency(adj)
