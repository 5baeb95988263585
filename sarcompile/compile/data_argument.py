"""A PyG ``Data`` argument (``forward(self, data)`` reading ``data.x``, ``data.edge_index``).

The compiled model is called with the ``Data`` the model takes, its ``edge_index`` the graph:
``model(Data(x=x, edge_index=g))`` with ``g`` a :class:`~sarcompile.Graph` (or, on one
machine, the ``Data`` as PyG gives it, whose ``edge_index`` tensor is converted once, as
``Graph.from_pyg(data)``), and on a worker ``Data(x=part.node_data["x"], edge_index=part.graph)``.
The ``Data``'s tensors and its graph are leaves of the call (see :mod:`sarcompile.compile.leaves`):
each tensor a per-node, per-edge or constant input by its rows, as any argument; while
tracing, forward gets a ``Data`` holding the program's inputs.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import torch

from sarcompile.graph.graph import Graph

__all__ = ["data_graph", "data_keys", "is_data", "rebuilt_data", "with_graph"]


def is_data(value: Any) -> bool:
    """Whether ``value`` is a PyG ``Data`` (PyG imported; a ``HeteroData`` is not one)."""
    module = sys.modules.get("torch_geometric.data")
    return module is not None and isinstance(value, module.Data)


def data_graph(value: Any) -> Any:
    """The graph a ``Data`` holds as its ``edge_index`` (anything but a tensor or None), else None."""
    graph = getattr(value, "edge_index", None) if is_data(value) else None
    return None if graph is None or isinstance(graph, torch.Tensor) else graph


def data_keys(value: Any) -> tuple[str, ...]:
    """The attributes of a ``Data`` that are inputs of the program: its tensors and its graph."""
    return tuple(k for k, v in value.to_dict().items() if isinstance(v, torch.Tensor) or k == "edge_index")


def rebuilt_data(keys: tuple[str, ...], leaves: list[Any]) -> Any:
    """The ``Data`` forward sees while tracing: the program's inputs under the call's keys."""
    from torch_geometric.data import Data

    return Data(**dict(zip(keys, leaves)))


def with_graph(value: Any, converted: dict[int, tuple[Any, Any]], keep: int) -> Any:
    """``value`` where it holds a graph; a ``Data`` whose ``edge_index`` is a tensor (as PyG
    gives it, on one machine), a shallow copy holding ``Graph.from_pyg(value)`` instead,
    converted once per ``edge_index`` tensor (``converted`` keeps the last ``keep`` by id,
    with the tensor, so an id reused by another is not mistaken)."""
    if not is_data(value) or not isinstance(value.edge_index, torch.Tensor):
        return value
    kept = converted.get(id(value.edge_index))
    if kept is None or kept[0] is not value.edge_index:
        kept = (value.edge_index, Graph.from_pyg(value))
        converted[id(value.edge_index)] = kept
        while len(converted) > keep:
            del converted[next(iter(converted))]
    out = copy.copy(value)
    out.edge_index = kept[1]
    return out
