"""DGL heterographs while tracing: the DGL API of a typed graph, one graph input per relation.

A DGL model over a heterograph takes ``(g, feat_dict)``. Compiled, it gets a typed graph
(``sc.HeteroGraph.from_dgl(hg)`` on one machine, ``part.graph`` in a worker), which is traced
leaf by leaf (:mod:`sarcompile.compile.leaves`): one graph input per relation. While tracing, ``g`` is
a :class:`HeteroGraphProxy`, whose relations are each the one-type graph proxy
(:class:`~sarcompile.frontends.dgl.graph.GraphProxy`), bipartite where they join two node
types, all sharing one set of frames. So DGL code runs as it is:

* ``g.ntypes``, ``g.etypes``, ``g.canonical_etypes``; ``g[etype]`` / ``g[(src, name, dst)]``,
  a relation DGL's layers take; ``g.num_nodes(ntype)``, ``g.num_edges(etype)`` (row counts);
  ``g.nodes(ntype)`` (the type's node ids: on a worker, those of its rows);
  ``g.nodes[ntype].data``, ``g.edges[etype].data``, and ``g.ndata`` / ``srcdata`` /
  ``dstdata`` / ``edata`` as DGL has them on a heterograph (``{ntype: tensor}``);
  ``local_scope()`` / ``local_var()``;
* ``g.multi_update_all({etype: (message, reduce)}, cross_reducer)``, and ``update_all`` /
  ``apply_edges`` on one relation or on all, as DGL runs them;
* ``dgl.nn.functional.edge_softmax(g, {etype: logits})``: each node's softmax over its
  in-edges of every relation;
* ``dgl.nn.HeteroGraphConv``: DGL's forward, with the relations' outputs combined
  elementwise. DGL stacks them along a new first axis and reduces it, which the compiler
  cannot tell from mixing the rows of one tensor; the values are the same.

Cross-relation reductions give what DGL gives, gradients included: ``max`` / ``min`` send
the gradient to the first relation reaching the extreme (``torch.max(stacked, 0)``'s
choice); in ``multi_update_all`` a relation reduced with ``max`` (``min``) gives ``-inf``
(``inf``) to a node with none of its in-edges before the relations are combined, and
infinities become 0 after (DGL's ``replace_inf_with_zero``).
"""

from __future__ import annotations

import contextlib
import functools
from types import SimpleNamespace
from typing import Any, Callable, Iterable

import dgl.nn.functional
import dgl.ops
import torch
import torch.fx as fx
from dgl.nn.pytorch import HeteroGraphConv
from dgl.nn.pytorch import hetero as dgl_hetero
from torch import nn

from sarcompile.errors import CompileError, GraphError
from sarcompile.graph.hetero import Relation, TracedHetero
from sarcompile.compile.leaves import frame_inputs
from sarcompile.ir.lowering import register_function_lowering, register_graph_view, register_lowering
from sarcompile.ir.ops import edge_reduce, edge_softmax, gather_dst
from sarcompile.frontends.dgl.frames import Frames, refusal
from sarcompile.frontends.dgl.graph import GraphProxy
from sarcompile.frontends.dgl.messages import _ALL, _is_all, _reduce_of

__all__ = ["HeteroGraphProxy", "cross_reduce"]

_CROSS = ("sum", "mean", "max", "min", "stack")


class HeteroGraphProxy(TracedHetero):
    """A typed graph while a DGL model is traced (see the module docstring): DGL's
    heterograph API over :class:`~sarcompile.graph.hetero.TracedHetero`, each relation a
    :class:`~sarcompile.frontends.dgl.graph.GraphProxy` of the relation's graph input."""

    is_block = False
    batch_size = 1

    def __init__(self, traced: TracedHetero, tracer: fx.Tracer, frames: Frames | None = None):
        self._frames = frames if frames is not None else Frames(traced.node_types, traced.edge_types)
        self._tracer = tracer
        relations = {rel: GraphProxy(graph.node, tracer, self._frames, rel) for rel, graph in traced.relations.items()}
        super().__init__(traced.node_types, relations)

    # -- types ---------------------------------------------------------------------------------
    @property
    def ntypes(self) -> list[str]:
        return list(self.node_types)

    srctypes = dsttypes = ntypes

    @property
    def etypes(self) -> list[str]:
        return [rel[1] for rel in self.edge_types]

    @property
    def canonical_etypes(self) -> list[Relation]:
        return list(self.edge_types)

    @property
    def is_homogeneous(self) -> bool:
        return len(self.node_types) == 1 and len(self.edge_types) == 1

    def to_canonical_etype(self, etype: Any) -> Relation:
        return self.relation(etype)

    @property
    def device(self):
        return next(iter(self.relations.values())).device

    # -- sizes ---------------------------------------------------------------------------------
    def num_nodes(self, ntype: str | None = None):
        """Rows of ``ntype`` (a worker's own), read off a relation at one of its ends."""
        if ntype is None:
            if len(self.node_types) != 1:
                raise self._refusal(f"g.num_nodes() of a graph with node types {list(self.node_types)} adds up the "
                                    "row counts of several types; count one type: g.num_nodes('paper')")
            ntype = self.node_types[0]
        graph, dst = self._end(ntype)
        return graph.num_dst_nodes() if dst else graph.num_src_nodes()

    num_src_nodes = num_dst_nodes = number_of_nodes = number_of_src_nodes = number_of_dst_nodes = num_nodes

    def num_edges(self, etype: Any = None):
        return self._one(etype, "g.num_edges()").num_edges()

    number_of_edges = num_edges

    def in_degrees(self, v=_ALL, etype: Any = None):
        return self._one(etype, "g.in_degrees()").in_degrees(v)

    def out_degrees(self, u=_ALL, etype: Any = None):
        return self._one(etype, "g.out_degrees()").out_degrees(u)

    def _refusal(self, message: str) -> CompileError:
        return refusal(message, self._tracer)

    def _one(self, etype: Any, what: str) -> GraphProxy:
        """The relation ``etype`` names, or the only one."""
        if etype is not None:
            return self[etype]
        if len(self.edge_types) != 1:
            raise self._refusal(f"{what} on a graph with relations {list(self.edge_types)}: name one, as DGL asks "
                                "(etype='writes')")
        return self.relations[self.edge_types[0]]

    # -- frames and ids --------------------------------------------------------------------------
    @property
    def nodes(self) -> "_NodeView":
        return _NodeView(self)

    srcnodes = dstnodes = nodes

    @property
    def edges(self) -> "_EdgeView":
        return _EdgeView(self)

    @property
    def ndata(self) -> "_TypedFields":
        return _TypedFields(self._frames.nodes, self.node_types, self._node_type)

    srcdata = dstdata = ndata

    @property
    def edata(self) -> "_TypedFields":
        return _TypedFields(self._frames.edges, self.edge_types, self.relation)

    def _node_type(self, ntype: Any) -> str:
        if ntype not in self.node_types:
            raise GraphError(f"no node type {ntype!r}; the graph has {list(self.node_types)}")
        return ntype

    @contextlib.contextmanager
    def local_scope(self):
        """Writes inside the block are dropped at its end, as in DGL."""
        with self._frames.scope():
            yield self

    def local_var(self) -> "HeteroGraphProxy":
        """The same graph with frames of its own: writes to it are not seen here, as in DGL."""
        return HeteroGraphProxy(self, self._tracer, self._frames.copy())

    # -- message passing -------------------------------------------------------------------------
    def update_all(self, message_func, reduce_func, apply_node_func=None, etype: Any = None) -> None:
        """On one relation; on all, as DGL runs it: builtins only, the relations into a type
        combined with the same reduction (``multi_update_all``)."""
        if etype is not None or len(self.edge_types) == 1:
            self._one(etype, "update_all").update_all(message_func, reduce_func, apply_node_func)
            return
        builtin = type(message_func).__module__.startswith("dgl") and hasattr(reduce_func, "msg_field")
        reduce = _reduce_of(reduce_func, self._tracer)[1] if builtin else None
        if reduce is None or reduce == "mean":
            raise self._refusal("g.update_all over several relations takes builtin functions and not mean, as DGL; "
                                "use g.multi_update_all({etype: (message, reduce)}, cross_reducer)")
        self.multi_update_all({rel: (message_func, reduce_func) for rel in self.edge_types}, reduce, apply_node_func)

    def apply_edges(self, func, edges=_ALL, etype: Any = None) -> None:
        """On one relation; on all for a builtin function, as DGL."""
        if etype is not None or len(self.edge_types) == 1:
            self._one(etype, "apply_edges").apply_edges(func, edges)
            return
        if not type(func).__module__.startswith("dgl"):
            raise self._refusal("g.apply_edges(f) with a function of yours on a graph with several relations is "
                                "refused by DGL too: name the relation (etype=...)")
        for rel in self.edge_types:
            self.relations[rel].apply_edges(func, edges)

    def multi_update_all(self, etype_dict: dict, cross_reducer: str | Callable, apply_node_func=None) -> None:
        """DGL's ``multi_update_all``: ``update_all`` on each relation given, then per
        destination type the relations' results combined by ``cross_reducer`` (``sum``,
        ``mean``, ``max``, ``min``, ``stack`` along dim 1 in relation order, or a function
        of the list), field by field."""
        if apply_node_func is not None:
            raise self._refusal("multi_update_all(..., apply_node_func) is not supported yet; apply it to the "
                                "node fields after")
        results: dict[str, list[tuple[int, dict]]] = {}
        last_reduce = None
        for etype, funcs in etype_dict.items():
            funcs = tuple(funcs)
            if len(funcs) not in (2, 3) or (len(funcs) == 3 and funcs[2] is not None):
                raise self._refusal(f"multi_update_all: give each relation (message, reduce), got {funcs!r} for "
                                    f"{etype!r} (an apply_node_func is not supported yet)")
            rel = self.relation(etype)
            graph = self.relations[rel]
            value = graph.aggregate(funcs[0], funcs[1])
            last_reduce = _reduce_of(funcs[1], self._tracer)[1]
            if last_reduce in ("max", "min"):  # DGL's max of no in-edge is -inf (min: inf) until combined
                has = graph.in_degrees() > 0
                empty = float("-inf") if last_reduce == "max" else float("inf")
                value = torch.where(has.reshape(-1, *([1] * (value.dim() - 1))), value, empty)
            results.setdefault(rel[2], []).append((self.edge_types.index(rel), {funcs[1].out_field: value}))
        for ntype, frames in results.items():
            merged = _merge(frames, cross_reducer)
            if last_reduce in ("max", "min"):  # (DGL looks at the reduce of the last relation given)
                merged = {k: v.masked_fill(v.abs() == float("inf"), 0.0) for k, v in merged.items()}
            self._frames.nodes(ntype).update(merged)


def _merge(frames: list[tuple[int, dict]], reducer: str | Callable) -> dict:
    """DGL's ``reduce_dict_data``: per field, the values of the relations that set it,
    combined (``stack`` in relation order)."""
    if len(frames) == 1 and reducer != "stack":
        return frames[0][1]
    if reducer == "stack":
        frames = sorted(frames, key=lambda f: f[0])
    fields = {k for _, frame in frames for k in frame}
    out = {}
    for k in fields:
        values = [frame[k] for _, frame in frames if k in frame]
        out[k] = reducer(values) if callable(reducer) else (values[0] if len(values) == 1 and reducer != "stack"
                                                            else cross_reduce(values, reducer))
    return out


def cross_reduce(xs: list[torch.Tensor], how: str) -> torch.Tensor:
    """Tensors of one type's rows combined as ``torch.<how>(torch.stack(xs), dim=0)``
    does (``stack``: ``torch.stack(xs, dim=1)``), elementwise: the same values, and for
    ``max`` / ``min`` the gradient to the first tensor reaching the extreme, as torch sends
    it to the index it returns."""
    if how not in _CROSS:
        raise refusal(f"cross-relation reduction {how!r} is not supported; use one of {_CROSS} or a function")
    if how == "stack":
        return torch.stack(xs, dim=1)
    if how == "max":
        return functools.reduce(lambda a, b: torch.where(b > a, b, a), xs)
    if how == "min":
        return functools.reduce(lambda a, b: torch.where(b < a, b, a), xs)
    total = functools.reduce(torch.add, xs)
    return total / len(xs) if how == "mean" else total


# -- views -------------------------------------------------------------------------------------
class _TypedFields:
    """``g.ndata`` (``srcdata``, ``dstdata``) or ``g.edata`` of a heterograph, as DGL has them:
    ``g.ndata["h"] = {"paper": x, ...}`` sets a field per type, ``g.ndata["h"]`` is the dict of
    the types that have it (the tensor itself when there is one type)."""

    def __init__(self, frame: Callable[[Any], dict], keys: Iterable[Any], key: Callable[[Any], Any]):
        self._frame, self._keys, self._key = frame, tuple(keys), key

    def _frames(self) -> dict[Any, dict]:
        return {k: self._frame(k) for k in self._keys}

    def __getitem__(self, field: str):
        frames = self._frames()
        if len(frames) == 1:
            return next(iter(frames.values()))[field]
        found = {k: f[field] for k, f in frames.items() if field in f}
        if not found:
            raise KeyError(field)
        return found

    def __setitem__(self, field: str, value: Any) -> None:
        if not isinstance(value, dict):
            if len(self._keys) != 1:
                raise refusal(f"on a graph of several types, set a field per type: g.ndata[{field!r}] = "
                              "{ntype: tensor} (g.edata: {etype: tensor})")
            value = {self._keys[0]: value}
        for k, v in value.items():
            self._frame(self._key(k))[field] = v

    def __delitem__(self, field: str) -> None:
        for frame in self._frames().values():
            frame.pop(field, None)

    def __contains__(self, field: str) -> bool:
        return any(field in f for f in self._frames().values())

    def pop(self, field: str):
        value = self[field]
        del self[field]
        return value

    def keys(self) -> list[str]:
        return sorted({k for f in self._frames().values() for k in f})

    def update(self, fields: dict) -> None:
        for k, v in fields.items():
            self[k] = v


class _NodeView:
    """``g.nodes``: ``g.nodes("paper")`` the type's node ids (a worker's own rows'),
    ``g.nodes["paper"].data`` its fields."""

    def __init__(self, graph: HeteroGraphProxy):
        self._graph = graph

    def __call__(self, ntype: str | None = None):
        if ntype is None:
            if len(self._graph.node_types) != 1:
                raise refusal(f"g.nodes() of a graph with node types {list(self._graph.node_types)}: name the "
                              "type, g.nodes('paper')", self._graph._tracer)
            ntype = self._graph.node_types[0]
        return self._graph.global_ids[self._graph._node_type(ntype)]

    def __getitem__(self, ntype: str) -> SimpleNamespace:
        return SimpleNamespace(data=self._graph._frames.nodes(self._graph._node_type(ntype)))


class _EdgeView:
    """``g.edges[etype].data``: a relation's edge fields."""

    def __init__(self, graph: HeteroGraphProxy):
        self._graph = graph

    def __call__(self, *args, **kwargs):
        raise refusal("g.edges() gives each edge's end nodes by position, which differ between workers; "
                      "compute per edge with g.apply_edges or move rows with update_all", self._graph._tracer)

    def __getitem__(self, etype: Any) -> SimpleNamespace:
        return SimpleNamespace(data=self._graph._frames.edges(self._graph.relation(etype)))


# -- functions and layers DGL code calls ---------------------------------------------------------
def dgl_edge_softmax(graph, logits, eids=_ALL, norm_by="dst"):
    """``dgl.nn.functional.edge_softmax``: the softmax over each node's in-edges, the IR's
    ``edge_softmax``; on a heterograph, over the in-edges of every relation into the node's
    type (see :func:`_typed_edge_softmax`)."""
    tracer = graph._tracer if isinstance(graph, HeteroGraphProxy) else getattr(graph, "tracer", None)
    if not _is_all(eids) or norm_by != "dst":
        raise refusal(
            f"dgl edge_softmax(eids=..., norm_by={norm_by!r}) is not supported: sarcompile normalises over "
            "all in-edges of each node (norm_by='dst', every edge)", tracer
        )
    if isinstance(graph, HeteroGraphProxy):
        if not isinstance(logits, dict):  # DGL: a graph of one relation takes its logits as they are
            return edge_softmax(graph._one(None, "edge_softmax with one tensor of logits"), logits)
        return _typed_edge_softmax(graph, logits)
    if isinstance(logits, dict):
        raise refusal("dgl edge_softmax got a dict of logits on a graph of one relation; pass the tensor", tracer)
    return edge_softmax(graph, logits)


def _typed_edge_softmax(graph: HeteroGraphProxy, logits: dict) -> dict:
    """Per destination node, the softmax over its in-edges of all relations into its type:
    the IR's ``edge_softmax`` where one relation enters the type, else the running maximum
    over the relations, the exponentials and their sum, as DGL computes it."""
    given = {graph.relation(k): v for k, v in logits.items()}
    missing = [rel for rel in graph.edge_types if rel not in given]
    if missing:
        raise graph._refusal(f"dgl edge_softmax on a heterograph takes logits for every relation (DGL raises too); "
                             f"missing {missing}")
    out = {}
    for ntype in dict.fromkeys(rel[2] for rel in graph.edge_types):
        rels = [rel for rel in graph.edge_types if rel[2] == ntype]
        if len(rels) == 1:
            out[rels[0]] = edge_softmax(graph.relations[rels[0]], given[rels[0]])
            continue
        peaks = []
        for rel in rels:  # the largest logit into each node (-inf where a relation has none)
            rg, e = graph.relations[rel], given[rel]
            has = (rg.in_degrees() > 0).reshape(-1, *([1] * (e.dim() - 1)))
            peaks.append(torch.where(has, edge_reduce(rg, e.detach(), "max"), float("-inf")))
        peak = functools.reduce(torch.maximum, peaks)
        z = {rel: torch.exp(given[rel] - gather_dst(graph.relations[rel], peak)) for rel in rels}
        total = functools.reduce(torch.add, [edge_reduce(graph.relations[rel], z[rel], "sum") for rel in rels])
        for rel in rels:
            out[rel] = z[rel] / gather_dst(graph.relations[rel], total)
    return {rel: out[rel] for rel in graph.edge_types}


register_function_lowering(dgl.ops.edge_softmax, dgl_edge_softmax, homes=(dgl.ops, dgl.nn.functional))

# HeteroGraphConv's aggregate functions, as DGL builds them (a partial of _agg_func, or stack)
_AGGREGATES = {dgl_hetero._sum_reduce_func: "sum", dgl_hetero._mean_reduce_func: "mean",
               dgl_hetero._max_reduce_func: "max", dgl_hetero._min_reduce_func: "min"}


class DGLHeteroGraphConv(nn.Module):
    """``dgl.nn.HeteroGraphConv``, traced in its place: each relation's module on the
    relation with ``(x_src, x_dst)``, as DGL calls it, and the results into a destination
    type combined by :func:`cross_reduce` (DGL's ``sum``, ``mean``, ``max``, ``min``,
    ``stack``), or by the user's aggregate function as written."""

    def __init__(self, m: HeteroGraphConv):
        super().__init__()
        self.m = m  # its modules, called through it: their paths and parameters stay the user's

    def forward(self, g, inputs, mod_args=None, mod_kwargs=None):
        m, mod_args, mod_kwargs = self.m, mod_args or {}, mod_kwargs or {}
        pair = isinstance(inputs, tuple)
        src_inputs, dst_inputs = inputs if pair else (inputs, inputs)
        outputs: dict[str, list] = {t: [] for t in g.dsttypes}
        for stype, etype, dtype in g.canonical_etypes:
            if stype not in src_inputs or (pair and dtype not in dst_inputs):
                continue
            module = m._get_module((stype, etype, dtype))
            outputs[dtype].append(module(g[stype, etype, dtype], (src_inputs[stype], dst_inputs[dtype]),
                                         *mod_args.get(etype, ()), **mod_kwargs.get(etype, {})))
        return {t: self._aggregate(xs, t) for t, xs in outputs.items() if xs}

    def _aggregate(self, xs: list, ntype: str):
        agg = self.m.agg_fn
        if agg is dgl_hetero._stack_agg_func:
            return cross_reduce(xs, "stack")
        how = _AGGREGATES.get(agg.keywords.get("fn")) if isinstance(agg, functools.partial) else None
        if how is not None and agg.func is dgl_hetero._agg_func:
            return cross_reduce(xs, how)
        return agg(xs, ntype)  # the user's own function: traced as written


register_lowering(HeteroGraphConv, DGLHeteroGraphConv)


def _dgl_values(tracer: Any, value: Any) -> Any:
    """``value`` (an argument rebuilt from its leaves, or a container of them) with each
    graph in it as DGL code reads it: a typed graph as a DGL heterograph, a one-type
    graph leaf as a DGL graph, each with the fields of its frames the call gave."""
    if isinstance(value, TracedHetero):
        return HeteroGraphProxy(value, tracer, Frames(value.node_types, value.edge_types, frame_inputs(value)))
    if isinstance(value, fx.Proxy) and value.node.target in tracer.graph_leaves:
        return GraphProxy(value.node, tracer, Frames(initial=frame_inputs(value)))
    if isinstance(value, (list, tuple)):
        return type(value)(_dgl_values(tracer, v) for v in value)
    if isinstance(value, dict):
        return {k: _dgl_values(tracer, v) for k, v in value.items()}
    return value


# The tracer reads graph inputs through this view wherever dgl is imported (this module is
# loaded then: sarcompile.compile.frontends), without importing a front-end itself.
register_graph_view(_dgl_values, lambda tracer, node: GraphProxy(node, tracer))
