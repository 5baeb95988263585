"""Any other PyG ``MessagePassing`` layer (:func:`_lower_message_passing`): its ``forward``
traced as written, PyG's graph utilities over ``edge_index`` as IR ops (:mod:`.utils`), and
``propagate`` as either the fused ``message_passing`` op (one node tensor, sum/mean/max)
or ``message`` / ``aggregate`` / ``update`` traced inline on per-edge tensors (several
node tensors, ``index`` and PyG's softmax, aggregation modules, an overridden
``aggregate``). A subclass of a layer with a rule of its own that overrides what the
layer computes takes this lowering too (:func:`_unless_overridden`).

``RGCNConv``, ``FastRGCNConv``, ``RGATConv`` and ``FiLMConv(num_relations > 1)`` take it,
the edges of one relation (``edge_index[:, edge_type == i]``) being the ``edge_subset``
op (:mod:`.edge_types`). What cannot be lowered exactly -- options a rule does not cover,
code that mixes rows -- fails at compile time with a :class:`~sarcompile.CompileError`
naming the layer.
"""

from __future__ import annotations

import builtins
import copy
import functools
import inspect
import sys

import torch
import torch.fx
from torch import nn
from torch_geometric import nn as gnn
from torch_geometric.nn.conv import MessagePassing

from sarcompile.errors import CompileError
from sarcompile.compile.trace_errors import user_line
from sarcompile.ir.ops import gather_dst, gather_src, gather_table, message_passing
from sarcompile.ir.lowering import declare, register_lowering
from sarcompile.frontends.pyg.adjacency import _no_adjacency_values
from sarcompile.frontends.pyg.assign import assignments_settled
from sarcompile.frontends.pyg.standin import _DEFINING, _check_common, _name, _name_of, _plain_call, _reduce, _refuse
from sarcompile.frontends.edge_index import EdgeEnd, EdgeIndex, as_edge_index
from sarcompile.frontends.pyg.utils import intercepting

torch.fx.wrap("_plain_call")  # the stand-ins' run-time check, one node here too


@torch.fx.wrap
def _one_node_set(value, graph, size, layer: str):
    """``value``, after checking at run time that ``size`` (PyG's ``(sources,
    destinations)``) is None or the graph's own nodes on both sides, as a layer that
    passes ``size=(x.size(0), x.size(0))`` gives it: then it changes nothing."""
    if size is not None and tuple(size) != (graph.num_nodes, graph.num_nodes):
        raise CompileError(
            f"{layer} was called with size={tuple(size)!r} on a graph of {graph.num_nodes} nodes; sarcompile "
            "supports one node set (size None, or the number of nodes twice): leave size out"
        )
    return value


class _Message(nn.Module):
    """A MessagePassing layer's ``message`` as ``fn(x_j, x_i, edge)`` for the
    ``message_passing`` IR op: maps the per-edge rows to ``message``'s own argument names.
    The layer is a submodule, so its parameters get their gradients through the op."""

    def __init__(self, layer: MessagePassing, node: str, edge: str | None, names: list[str]):
        super().__init__()
        self.layer = layer
        self.node, self.edge, self.names = node, edge, names

    def forward(self, x_j, x_i, edge):
        given = {f"{self.node}_j": x_j, f"{self.node}_i": x_i, self.edge: edge}
        return self.layer.message(**{k: given[k] for k in self.names})


# Message arguments that PyG fills in from the graph rather than from propagate's kwargs.
_GRAPH_ARGS = ("index", "ptr", "size_i", "size_j", "dim_size", "size", "edge_index_i", "edge_index_j", "edge_index")


def _fused_signature(m: MessagePassing, names: list[str]) -> tuple[str, str | None] | None:
    """(node tensor name, edge tensor name or None) where ``message`` fits the fused
    ``message_passing`` op -- one node tensor as ``<name>_j`` / ``<name>_i``, at most one
    edge tensor, nothing from the graph, PyG's own aggregate with a sum, mean or max --
    else None."""
    nodes = {k[:-2] for k in names if k.endswith(("_i", "_j"))}
    edges = [k for k in names if not k.endswith(("_i", "_j"))]
    aggr = m.aggr if isinstance(m.aggr, str) else None
    overridden = type(m).aggregate is not MessagePassing.aggregate
    if len(nodes) != 1 or len(edges) > 1 or set(edges) & set(_GRAPH_ARGS) or overridden:
        return None
    if aggr not in ("add", "sum", "mean", "max"):
        return None
    return nodes.pop(), (edges[0] if edges else None)


def _collect(names: list[str], graph: EdgeIndex, kwargs: dict) -> dict:
    """What PyG's ``_collect`` hands ``message`` / ``aggregate`` / ``edge_update``, as IR
    values: ``x_j`` and ``x_i`` gathered onto the edges (``x`` may be a pair (source,
    destination) of node tensors), ``index`` / ``edge_index_i`` / ``edge_index_j`` as
    edge-end markers, sizes and ``ptr`` as None, anything else as given (edge tensors)."""
    out = {}
    for name in names:
        if name in ("index", "edge_index_i"):
            out[name] = EdgeEnd(graph, "dst")  # (not graph[1]: the graph is a real one when run on examples)
        elif name == "edge_index_j":
            out[name] = EdgeEnd(graph, "src")
        elif name == "edge_index":
            out[name] = graph
        elif name in _GRAPH_ARGS:
            out[name] = None
        elif name.endswith(("_i", "_j")) and name[:-2] in kwargs:
            value = kwargs[name[:-2]]
            if isinstance(value, (tuple, list)):
                value = value[0] if name.endswith("_j") else value[1]
            if _is_parameter(value):  # a row per node of the whole graph, on every worker (LINKX)
                value = gather_table(graph, value, "src" if name.endswith("_j") else "dst")
            elif value is not None:
                value = gather_src(graph, value) if name.endswith("_j") else gather_dst(graph, value)
            out[name] = value
        else:
            out[name] = kwargs.get(name)
    return out


def _is_parameter(value) -> bool:
    return isinstance(value, torch.fx.Proxy) and value.node.op == "get_attr"


def _arguments(fn) -> list[str]:
    return [k for k, p in inspect.signature(fn).parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _lower_message_passing(m: MessagePassing) -> nn.Module:
    """Any other MessagePassing layer: its ``forward`` traced as written, with PyG's graph
    utilities as IR ops (:mod:`.utils`) and ``propagate`` as one of two lowerings:

    * a message of one node tensor and at most one edge tensor, aggregated by sum, mean or
      max: the fused ``message_passing`` op around the layer's own ``message``
      (recomputed per block in backward, no per-edge tensor kept);
    * anything else: ``message``, ``aggregate`` (its aggregation module or an overridden
      ``aggregate``) and ``edge_update`` traced inline on per-edge tensors -- node tensors
      gathered onto the edges (``gather_src`` / ``gather_dst``), PyG's ``scatter`` and
      ``softmax`` over ``index`` lowered to ``edge_reduce`` / ``edge_softmax``. Exact, as
      every in-edge of a node lives on its worker; it keeps per-edge tensors as PyG does.

    Then the layer's ``update``."""
    # (message_and_aggregate only runs for SparseTensor adjacencies, never here.)
    _check_common(m, type(m))
    if isinstance(m, gnn.ARMAConv):
        raise CompileError(
            f"{_name(m)} is not supported yet: it keeps its {m.num_stacks} stacks as one [stacks, nodes, channels] "
            "tensor and aggregates over axis node_dim=-2, while sarcompile keeps the node axis first (axis 0) so "
            "that each worker's rows are its own nodes; stack GCN-normalised layers (e.g. torch_geometric.nn.SGConv "
            "with K=1) per stack instead"
        )
    if getattr(m, "decomposed_layers", 1) != 1:
        raise _refuse(m, "decomposed_layers", m.decomposed_layers, "use decomposed_layers=1")
    view = copy.copy(m)  # shares parameters and submodules; gets its own submodule table below
    view._modules = dict(m._modules)
    names = _arguments(m.message)
    fused = _fused_signature(m, names)
    update_args = _arguments(m.update)[1:]
    layer = type(m).__name__
    if fused is not None:
        view._sc_message = _Message(m, *fused, names)
        reduce = _reduce(m.aggr)

    def propagate(edge_index, size=None, **kwargs):
        if _GRAD_AT_ENTRY and _GRAD_AT_ENTRY[-1] and not torch.is_grad_enabled():
            raise CompileError(
                f"{_name(m)} propagates under torch.no_grad() (its forward, or part of it, is decorated or wrapped "
                "so): a traced program does not keep grad modes, so it would give gradients where PyG gives none; "
                "not supported yet: call the model under torch.no_grad(), or detach what goes into the layer"
            )
        graph = as_edge_index(edge_index)
        x = kwargs.get(fused[0]) if fused is not None else None
        if isinstance(x, (tuple, list)) and len(x) == 2 and x[0] is x[1]:
            x = x[0]  # PyG's idiom for a plain graph: x = (x, x)
        if fused is not None and not isinstance(x, (tuple, list)) and not _is_parameter(x):
            x = _plain_call(_one_node_set(x, graph, size, layer), layer)
            out = message_passing(graph, view._sc_message, x, kwargs.get(fused[1]) if fused[1] else None, reduce)
        else:  # (a pair of different node tensors, e.g. GMMConv's (x @ g, x), goes this way too)
            # The view's methods: what they store on self (RGATConv's _alpha) is the view's,
            # where its forward reads it, and never reaches the user's layer.
            msg = view.message(**_collect(names, graph, kwargs))
            if size is not None:
                msg = _one_node_set(msg, graph, size, layer)
            aggregate_args = _collect(_arguments(m.aggregate)[1:], graph, kwargs)
            out = view.aggregate(msg, **aggregate_args)
        return view.update(out, **{k: kwargs[k] for k in update_args})

    def edge_updater(edge_index, size=None, **kwargs):
        graph = as_edge_index(edge_index)
        return view.edge_update(**_collect(_arguments(m.edge_update), graph, kwargs))

    object.__setattr__(view, "propagate", propagate)
    object.__setattr__(view, "edge_updater", edge_updater)
    view.__class__ = _tracing_type(type(m))
    return view


_real_isinstance = builtins.isinstance
# Whether grad was enabled when each layer being traced was called (innermost last): a
# propagate that finds it off was put under torch.no_grad() by the layer itself.
_GRAD_AT_ENTRY: list[bool] = []


def _isinstance_seeing_proxies_as_tensors(obj, cls) -> bool:
    """``isinstance``, except that outside torch's own code an fx Proxy counts as a Tensor."""
    if _real_isinstance(obj, torch.fx.Proxy) and (
        cls is torch.Tensor or (_real_isinstance(cls, tuple) and torch.Tensor in cls)
    ):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller != "torch" and not caller.startswith("torch."):  # fx itself must see a Proxy
            return True
    return _real_isinstance(obj, cls)


def _tracing_type(cls: type) -> type:
    """A subclass of ``cls`` whose forward, while it is traced, sees the features as the
    tensors they stand for. Layers start with ``if isinstance(x, Tensor): x = (x, x)``;
    under fx the features are a Proxy, the branch would be skipped and a later ``x[1]``
    would silently take row 1 instead of x. So for the duration of the trace,
    ``isinstance(proxy, Tensor)`` is True in code that is not torch's (fx's own checks are
    unchanged). Errors of the layer's code become a CompileError naming it and the line."""
    original = cls.forward
    layer_name = _name_of(cls)
    signature = inspect.signature(original)

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        if "edge_index" in bound.arguments:  # the traced graph, answering what PyG asks of edge_index
            _no_adjacency_values(layer_name, bound.arguments["edge_index"])
            bound.arguments["edge_index"] = as_edge_index(bound.arguments["edge_index"])
        builtins.isinstance = _isinstance_seeing_proxies_as_tensors
        _GRAD_AT_ENTRY.append(torch.is_grad_enabled())
        try:
            with intercepting():
                return assignments_settled(lambda: original(*bound.args, **bound.kwargs))
        except CompileError:
            raise
        except Exception as e:  # whatever the layer's own code raised: say which layer and where
            raise CompileError(
                f"{layer_name} could not be lowered: its forward failed while traced with symbolic tensors and "
                f"a graph in place of edge_index ({type(e).__name__}: {e}{user_line(e)}). Layers that compute with "
                "edge_index in ways sarcompile does not lower, or branch on tensor values, are not supported yet"
            ) from None
        finally:
            builtins.isinstance = _real_isinstance
            _GRAD_AT_ENTRY.pop()

    return type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__})


def _unless_overridden(rule, base: type):
    """``rule`` for ``base`` itself; a subclass that overrides what ``base`` computes with
    (``forward``, ``message``, ...), or a layer aggregating with a list of aggregations or
    an aggregation module, gets the general MessagePassing lowering instead."""

    def lower(m: nn.Module) -> nn.Module:
        if type(m) is not base and any(getattr(type(m), k, None) is not getattr(base, k, None) for k in _DEFINING):
            return _lower_message_passing(m)
        if not isinstance(getattr(m, "aggr", ""), str):  # a list of aggregations, or a module
            return _lower_message_passing(m)
        return rule(m)

    return lower


register_lowering(MessagePassing, _lower_message_passing)
declare(_one_node_set, "value")  # row-local (the residency pass cannot look inside it)
