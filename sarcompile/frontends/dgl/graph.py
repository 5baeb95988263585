"""A stand-in for a ``DGLGraph`` while a model is traced, so user code that calls
``g.update_all`` / ``g.apply_edges`` becomes IR ops.

DGL user code stores tensors in the graph's frames and runs message passing on them::

    with g.local_scope():
        g.ndata["h"] = x
        g.edata["w"] = w
        g.update_all(fn.u_mul_e("h", "w", "m"), fn.sum("m", "h"))
        return g.ndata["h"]

When the compiled model is traced, the graph argument is a :class:`GraphProxy`: an fx
proxy of the graph input (so IR ops and lowered DGL layers receive the graph) with the
frames as plain dicts of traced values. Each relation of a typed graph is one too
(:mod:`sarcompile.frontends.dgl.hetero`), bipartite when it joins two node types:
``srcdata`` then holds rows of the source type, ``dstdata`` of the destination type.
``update_all`` and ``apply_edges`` lower to IR ops as
:mod:`sarcompile.frontends.dgl.messages` says.

The counts DGL code reads (``g.num_edges()``, ``g.num_nodes()``, ...) are the graph's row
counts, so ``torch.ones(g.num_edges())`` is a per-edge tensor; ``g.out_degrees()`` and
``g.device`` are answered by row-local helpers. What is not supported is refused with a
:class:`~sarcompile.CompileError` naming the layer and the line.
"""

from __future__ import annotations

import builtins
import contextlib
from typing import Any, Callable

import dgl
import torch.fx as fx

from sarcompile.errors import CompileError
from sarcompile.ir.lowering import register_function_lowering
from sarcompile.frontends.dgl.frames import Frames, refusal
from sarcompile.frontends.dgl.layers import check_in_edges, graph_device, out_degrees
from sarcompile.frontends.dgl.messages import _ALL, MessagePassingMethods, _is_all

__all__ = ["GraphProxy"]


class GraphProxy(fx.Proxy, MessagePassingMethods):
    """The graph input of a traced DGL-style model, or one relation of a typed graph
    (``rel``, its ``(src_type, name, dst_type)``): an fx proxy with DGL's frames. A relation
    between two types is bipartite: ``srcdata`` holds rows of its source type, ``dstdata``
    of its destination type; a relation within one type and a one-type graph have one node
    set (``ndata``)."""

    def __init__(self, node: fx.Node, tracer: fx.Tracer, frames: Frames | None = None, rel: Any = None):
        super().__init__(node, tracer)
        self._rel = rel
        self._src, self._dst = (rel[0], rel[2]) if rel is not None else (None, None)
        self._frames = frames if frames is not None else Frames((self._dst,), (rel,))
        self._origin: GraphProxy | None = None  # after remove_self_loop(): the graph it came from

    @property
    def bipartite(self) -> bool:
        """Whether sources and destinations are nodes of two types."""
        return self._src != self._dst

    # -- frames ------------------------------------------------------------------------------
    @property
    def ndata(self) -> dict:
        if self.bipartite:
            raise self._refusal(f"g[{self._rel}].ndata: this relation joins two node types ({self._src!r} and "
                                f"{self._dst!r}); use srcdata (rows of {self._src!r}) and dstdata (rows of "
                                f"{self._dst!r})")
        return self._frames.nodes(self._dst)

    @property
    def srcdata(self) -> dict:
        return self._frames.nodes(self._src)

    @property
    def dstdata(self) -> dict:
        return self._frames.nodes(self._dst)

    @property
    def edata(self) -> dict:
        return self._frames.edges(self._rel)

    # What DGL's layers ask of the graph before they compute (expand_as_pair, asserts):
    # known when compiling, since sarcompile graphs are whole (never blocks).
    is_block = False
    batch_size = 1

    @property
    def is_homogeneous(self) -> bool:
        return not self.bipartite

    @property
    def srctypes(self) -> list:
        return [self._src if self._rel is not None else "_N"]

    @property
    def dsttypes(self) -> list:
        return [self._dst if self._rel is not None else "_N"]

    @property
    def ntypes(self) -> list:
        return self.srctypes + self.dsttypes if self.bipartite else self.dsttypes

    @property
    def canonical_etypes(self) -> list:
        return [self._rel if self._rel is not None else ("_N", "_E", "_N")]

    @property
    def etypes(self) -> list:
        return [rel[1] for rel in self.canonical_etypes]

    # -- self-loops: sarcompile's graphs have none removed, or exactly one per node --------
    def remove_self_loop(self, etype=None) -> "GraphProxy":
        return self._derived("remove_self_loops", self, loop_free=True)

    def add_self_loop(self, edge_feat_names=None, fill_data=1.0, etype=None) -> "GraphProxy":
        """One self-loop per node, after ``remove_self_loop()`` (DGL appends them last, as
        ``with_self_loops`` does). On a graph that may have self-loops DGL adds a second one,
        which sarcompile's graphs do not express: refused."""
        if self._origin is None:
            raise self._refusal(
                "g.add_self_loop() on a graph that may have self-loops gives those nodes two, which sarcompile does "
                "not compile: call g.remove_self_loop() first, or add the loops before sc.Graph.from_dgl"
            )
        return self._derived("with_self_loops", self._origin, loop_free=False)

    def _derived(self, method: str, base: "GraphProxy", loop_free: bool) -> "GraphProxy":
        if self.bipartite:
            raise self._refusal(f"g[{self._rel}].{method}(): a relation between two node types has no self-loops")
        if self.edata:
            raise self._refusal(f"g.{method}() with edge fields set ({sorted(self.edata)}) is not supported; set "
                                "them on the graph it returns")
        node = self.tracer.create_proxy("call_method", method, (base,), {}).node
        frames = Frames((self._dst,), (self._rel,))
        frames.nodes(self._dst).update(self.ndata)
        graph = GraphProxy(node, self.tracer, frames, self._rel)
        graph._origin = base if loop_free else None
        return graph

    def local_var(self) -> "GraphProxy":
        """The same graph with frames of its own: writes to it are not seen here, as in DGL."""
        view = GraphProxy(self.node, self.tracer, self._frames.copy(), self._rel)
        view._origin = self._origin
        return view

    @contextlib.contextmanager
    def local_scope(self):
        """Writes inside the block are dropped at its end, as in DGL."""
        with self._frames.scope():
            yield self

    # -- sizes and degrees: row counts and per-node values --------------------------------
    def _count(self, attr: str):
        return self.tracer.create_proxy("call_function", builtins.getattr, (self, attr), {})

    def num_edges(self, etype=None):
        """This graph's edge count (a worker's own edges): a row count, so
        ``torch.ones(g.num_edges())`` has one row per edge."""
        return self._count("num_edges")

    def num_nodes(self, ntype=None):
        """The node count (a worker's own nodes): a row count. A relation between two types
        counts the nodes of ``ntype``, one of them."""
        if not self.bipartite or ntype == self._dst:
            return self._count("num_nodes")
        if ntype == self._src:
            return self._count("num_src_nodes")
        raise self._refusal(f"g[{self._rel}].num_nodes({ntype!r}): this relation joins {self._src!r} and "
                            f"{self._dst!r}; count one of them (num_src_nodes(), num_dst_nodes())")

    def num_src_nodes(self, ntype=None):
        return self._count("num_src_nodes") if self.bipartite else self._count("num_nodes")

    def num_dst_nodes(self, ntype=None):
        return self._count("num_nodes")

    number_of_edges = num_edges
    number_of_nodes = num_nodes
    number_of_src_nodes = num_src_nodes
    number_of_dst_nodes = num_dst_nodes

    def in_degrees(self, v=_ALL, etype=None):
        """The in-degree of every destination node; ``(g.in_degrees() == 0).any()`` in an
        ``if`` becomes the check DGL's layers make with it (see :class:`_InDegrees`)."""
        if not _is_all(v):
            raise self._refusal("g.in_degrees(v) of some nodes is not supported; use g.in_degrees() of all")
        return _InDegrees(self.tracer.create_proxy("call_method", "in_degrees", (self,), {}).node, self.tracer, self)

    def out_degrees(self, u=_ALL, etype=None):
        """The out-degree of every source node."""
        if not _is_all(u):
            raise self._refusal("g.out_degrees(u) of some nodes is not supported; use g.out_degrees() of all")
        return self.tracer.create_proxy("call_function", out_degrees, (self, self._count("src_global_ids")), {})

    @property
    def device(self):
        return self.tracer.create_proxy("call_function", graph_device, (self,), {})

    # -- helpers ---------------------------------------------------------------------------
    def _refusal(self, message: str) -> CompileError:
        return refusal(message, self.tracer)


class _InDegrees(fx.Proxy):
    """``g.in_degrees()``. DGL's layers refuse a graph with a node without in-edges by
    ``if (g.in_degrees() == 0).any(): raise DGLError(...)``: a branch on the graph's values,
    which tracing cannot take. Here that condition records the same check, made when the
    program runs (:func:`~sarcompile.frontends.dgl.layers.check_in_edges`, raising where DGL raises),
    and is False while tracing: past the check, it is false."""

    def __init__(self, node: fx.Node, tracer: fx.Tracer, graph: GraphProxy, stage: str = "degrees"):
        super().__init__(node, tracer)
        self.graph, self.stage = graph, stage

    def __eq__(self, other):
        out = super().__eq__(other)
        if self.stage == "degrees" and isinstance(other, int) and other == 0:
            return _InDegrees(out.node, self.tracer, self.graph, "zero")
        return out

    def any(self, *args, **kwargs):
        out = self.tracer.create_proxy("call_method", "any", (self, *args), kwargs)
        if self.stage == "zero" and not args and not kwargs:
            return _InDegrees(out.node, self.tracer, self.graph, "any zero")
        return out

    def __bool__(self):
        if self.stage != "any zero":
            return super().__bool__()
        node = self.node
        while node.op != "placeholder" and not node.users:  # any <- eq <- in_degrees: only the check stays
            parent = node.args[0]
            self.tracer.graph.erase_node(node)
            node = parent
        self.tracer.create_proxy("call_function", check_in_edges, (self.graph,), {})
        return False

    __hash__ = fx.Proxy.__hash__


# -- DGL's graph functions called on the traced graph -----------------------------------------
_READOUT = ("combines the rows of every node or edge (a graph readout), and each worker holds only its own: "
            "not supported; leave it out of a node-level model, or sum each worker's rows and add them with "
            "sc.global_sum")
_TRANSFORM = ("builds another graph while the model runs, which a partitioned graph cannot be: transform the "
              "graph once, before Graph.from_dgl and sc.partition")


def _refused_on_the_traced_graph(original: Callable, why: str) -> Callable:
    """``original``, refused with ``why`` where it is given the traced graph (inside forward)."""

    def call(*args, **kwargs):
        if any(isinstance(a, GraphProxy) for a in (*args, *kwargs.values())):
            raise refusal(f"dgl.{original.__name__}(g) in forward {why}")
        return original(*args, **kwargs)

    return call


for _name, _why in [*((n, _READOUT) for n in ("readout_nodes", "readout_edges", "sum_nodes", "sum_edges",
                                               "mean_nodes", "mean_edges", "max_nodes", "max_edges",
                                               "softmax_nodes", "softmax_edges", "topk_nodes", "topk_edges")),
                    *((n, _TRANSFORM) for n in ("reverse", "add_reverse_edges", "to_bidirected", "remove_self_loop",
                                                "to_simple", "add_edges", "remove_edges", "add_nodes", "remove_nodes",
                                                "node_subgraph", "edge_subgraph", "khop_graph", "line_graph"))]:
    if hasattr(dgl, _name):  # (every one in DGL 2.x)
        _original = getattr(dgl, _name)
        register_function_lowering(_original, _refused_on_the_traced_graph(_original, _why), homes=("dgl",))
