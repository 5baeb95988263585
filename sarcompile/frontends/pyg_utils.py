"""PyG's graph utilities as IR ops, while a PyG layer is traced.

PyG layers compute with ``edge_index`` itself: ``index`` (``edge_index[1]``) goes into
``scatter``, ``softmax`` and ``degree``; ``gcn_norm`` and the self-loop helpers rebuild
the edge list. Under sarcompile the graph is a :class:`~sarcompile.Graph` or a worker's
shard, so those calls cannot run as written. While a layer is traced
(:func:`intercepting`), every ``torch_geometric`` module sees, in place of each such
function, a dispatcher that turns a call on the traced graph into IR ops and leaves any
other call to PyG. The rules are registered with :func:`handles`, one per PyG function.

The graph a layer gets is an :class:`EdgeIndex` proxy: ``edge_index[0]`` and
``edge_index[1]`` (also ``row, col = edge_index``) are :class:`EdgeEnd` markers, the
source or destination node of every edge. A marker only means something to the rules
here; any other use of it (``x[col]``, arithmetic) is refused at compile time, since on
a worker the edges index rows that live elsewhere.

===============================================  ===========================================
PyG call                                         becomes
===============================================  ===========================================
``scatter(e, edge_index[1], reduce=r)``          ``edge_reduce(g, e, r)`` (sum, mean, max,
                                                 min, mul)
``softmax(e, edge_index[1])``                    ``edge_softmax(g, e)``
``degree(edge_index[1])``                        the in-degree of every node
``edge_index[:, mask]``                          ``edge_subset(g, mask)``, a graph
===============================================  ===========================================
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.fx
from torch import nn
from torch_geometric import utils as pyg_utils
from torch_geometric.nn.aggr import Aggregation, MultiAggregation

from ..errors import CompileError
from ..lowering import declare
from ..ops import edge_reduce, edge_softmax, edge_subset
from ..vocab import Residency

__all__ = ["EdgeEnd", "EdgeIndex", "handles", "intercepting", "as_edge_index"]


@dataclass(frozen=True)
class EdgeEnd:
    """``edge_index[0]`` (``end="src"``) or ``edge_index[1]`` (``end="dst"``) of the
    traced graph ``graph``: the source or destination of every edge, in the graph's edge
    order. ``graph`` is the traced graph, or a real one while the layer runs on example
    inputs (the rules then run the IR ops eagerly)."""

    graph: Any
    end: str

    def refusal(self) -> CompileError:
        name = "edge_index[0] (the source of every edge)" if self.end == "src" else "edge_index[1] (the destination)"
        return CompileError(
            f"{name} is used as a tensor; on N workers a worker holds only its own nodes' rows, so indexing or "
            "computing with edge_index directly would not match one machine. sarcompile lowers PyG's "
            "scatter/softmax/degree over it and gcn_norm / self-loop utilities; write the rest with message "
            "arguments (x_j, x_i, index) or sarcompile's ops"
        )

    def __fx_create_arg__(self, tracer: torch.fx.Tracer) -> Any:
        raise self.refusal()  # fx asks this when the marker reaches a traced op

    def __getattr__(self, name: str) -> Any:  # index.unsqueeze(...), index.max(), ...
        if name.startswith("__"):
            raise AttributeError(name)
        raise self.refusal()


class EdgeIndex(torch.fx.Proxy):
    """The traced graph where a PyG layer takes ``edge_index``: an fx Proxy (IR ops take it
    as their graph) that also answers what PyG code asks an ``edge_index`` tensor."""

    def __getitem__(self, i: Any) -> "EdgeEnd | EdgeIndex":
        if isinstance(i, int) and i in (0, 1, -1, -2):
            return EdgeEnd(self, "src" if i % 2 == 0 else "dst")
        if isinstance(i, tuple) and len(i) == 2 and isinstance(i[0], slice) and i[0] == slice(None) \
                and isinstance(i[1], torch.fx.Proxy):
            return as_edge_index(edge_subset(self, i[1]))  # edge_index[:, mask]: the edges of a mask
        raise CompileError(
            f"edge_index[{i!r}] is not supported: sarcompile lowers edge_index[0] and edge_index[1] (source and "
            "destination) as arguments of PyG's graph utilities, and edge_index[:, mask] (a bool per edge)"
        )

    def __iter__(self) -> Iterator[EdgeEnd]:
        return iter((self[0], self[1]))

    def dim(self) -> int:
        return 2


def as_edge_index(value: Any) -> Any:
    """``value`` as an :class:`EdgeIndex` where it is the traced graph (an fx Proxy)."""
    if isinstance(value, torch.fx.Proxy) and not isinstance(value, EdgeIndex):
        return EdgeIndex(value.node, value.tracer)
    return value


# -- the dispatch ------------------------------------------------------------------------------
_RULES: dict[int, tuple[Callable, Callable]] = {}  # id(PyG function) -> (it, its dispatcher)


def handles(original: Callable) -> Callable[[Callable], Callable]:
    """Register ``rule(original, *args, **kwargs)`` for the PyG function ``original``: it
    returns the IR-op result for a call on the traced graph, or calls ``original``."""

    def register(rule: Callable) -> Callable:
        def dispatch(*args: Any, **kwargs: Any) -> Any:
            return rule(original, *args, **kwargs)

        dispatch.__wrapped__ = original  # type: ignore[attr-defined]
        _RULES[id(original)] = (original, dispatch)
        return rule

    return register


_active = False


def _namespaces(extra: tuple[dict, ...]) -> list[dict]:
    pyg = [vars(m) for name, m in list(sys.modules.items())
           if m is not None and (name == "torch_geometric" or name.startswith("torch_geometric."))]
    return pyg + [ns for ns in extra if all(ns is not p for p in pyg)]


@contextlib.contextmanager
def intercepting(*namespaces: dict) -> Iterator[None]:
    """For the duration, every global name bound to a PyG function with a rule -- in the
    ``torch_geometric`` modules and in ``namespaces`` (the traced layer's own module
    globals) -- is bound to its dispatcher, and aggregations take an :class:`EdgeEnd`
    index. Restored afterwards; nesting is a no-op."""
    global _active
    if _active:
        yield
        return
    swapped: list[tuple[dict, str, Callable]] = []
    for namespace in _namespaces(namespaces):
        for key, value in list(namespace.items()):
            rule = _RULES.get(id(value))
            if rule is not None and rule[0] is value:
                swapped.append((namespace, key, value))
                namespace[key] = rule[1]
    Aggregation.__call__ = _aggregation_call
    _active = True
    try:
        yield
    finally:
        _active = False
        Aggregation.__call__ = _aggregation_call_of_pyg
        for namespace, key, value in swapped:
            namespace[key] = value


_aggregation_call_of_pyg = Aggregation.__call__


def _aggregation_call(self: Aggregation, x: Any, index: Any = None, ptr: Any = None, dim_size: Any = None,
                      dim: int = -2, **kwargs: Any) -> Any:
    if not isinstance(index, EdgeEnd):
        return _aggregation_call_of_pyg(self, x, index, ptr, dim_size, dim, **kwargs)
    if isinstance(self, MultiAggregation):
        # Its fused path indexes with `index` itself; the plain path computes the same.
        return self.combine([aggr(x, index, dim_size=dim_size, dim=dim) for aggr in self.aggrs])
    # PyG's __call__ checks index.max() against dim_size; an EdgeEnd is right by construction.
    return nn.Module.__call__(self, x, index, ptr=None, dim_size=dim_size, dim=dim, **kwargs)


# -- run-time helpers (one node each in the program) -------------------------------------------
@torch.fx.wrap
def _edge_axis(e: torch.Tensor, dim: int, what: str) -> torch.Tensor:
    """``e``, after checking that ``dim`` is its edge axis (axis 0)."""
    if e.dim() == 0 or dim % e.dim() != 0:
        raise CompileError(
            f"{what} over dim={dim} of a per-edge tensor of shape {tuple(e.shape)} is not supported: sarcompile "
            "reduces over axis 0 (one row per edge)"
        )
    return e


@torch.fx.wrap
def _in_degree(graph: Any, dtype: torch.dtype | None) -> torch.Tensor:
    """PyG's ``degree(edge_index[1], dtype=dtype)``: the in-degree of every node (all of a
    node's in-edges live on its worker)."""
    return graph.in_degrees().to(dtype or torch.get_default_dtype())


declare(_edge_axis, "e")
declare(_in_degree, Residency.NODE)


def _on_graph(index: Any, what: str) -> EdgeEnd | None:
    """``index`` if it is the destination marker, None if it is no marker; refuses the source."""
    if not isinstance(index, EdgeEnd):
        return None
    if index.end != "dst":
        raise CompileError(
            f"{what} over edge_index[0] (onto the source nodes) is not supported yet: a node's out-edges live on "
            "other workers; reduce onto destinations (edge_index[1]) or reverse the graph"
        )
    return index


# -- the rules ---------------------------------------------------------------------------------
_PYG_REDUCES = {"sum": "sum", "add": "sum", "mean": "mean", "max": "max", "amax": "max", "min": "min",
                "amin": "min", "mul": "mul"}


@handles(pyg_utils.scatter)
def _scatter(original, src, index, dim=0, dim_size=None, reduce="sum"):
    end = _on_graph(index, "scatter")
    if end is None:
        return original(src, index, dim, dim_size, reduce)
    if reduce not in _PYG_REDUCES:
        raise CompileError(f"scatter(reduce={reduce!r}) over edges is not supported; use one of {sorted(_PYG_REDUCES)}")
    return edge_reduce(end.graph, src, _PYG_REDUCES[reduce], dim)


@handles(pyg_utils.softmax)
def _softmax(original, src, index=None, ptr=None, num_nodes=None, dim=0):
    end = _on_graph(index, "softmax")
    if end is None:
        return original(src, index, ptr, num_nodes, dim)
    # PyG adds 1e-16 to the denominator, which is at least 1 (the largest score gives
    # exp(0)): a difference below float rounding.
    return edge_softmax(end.graph, _edge_axis(src, dim, "softmax"))


@handles(pyg_utils.degree)
def _degree(original, index, num_nodes=None, dtype=None):
    end = _on_graph(index, "degree")
    if end is None:
        return original(index, num_nodes, dtype)
    return _in_degree(end.graph, dtype)
