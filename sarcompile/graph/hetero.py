"""Heterogeneous graphs: several node types, and relations ``(src_type, name, dst_type)``.

A :class:`HeteroGraph` is a set of node types, each with its own number of nodes
(numbered ``0..n_t-1`` within the type), and relations, each a :class:`~sarcompile.graph.graph.Graph`
from its source type's nodes to its destination type's nodes: bipartite when the two
types differ, an ordinary graph when they are the same (``paper cites paper``). So every
IR op works on a relation as it does on a one-type graph; nothing else needs a second
code path::

    >>> g = HeteroGraph.from_edges(
    ...     {("author", "writes", "paper"): (torch.tensor([0, 1, 1]), torch.tensor([0, 0, 2])),
    ...      ("paper", "cites", "paper"): (torch.tensor([1, 2]), torch.tensor([0, 0]))},
    ...     num_nodes={"author": 2, "paper": 3})
    >>> g.node_types, g.num_nodes("paper"), g.num_edges()
    (('author', 'paper'), 3, 5)
    >>> g["writes"]
    Graph(num_src_nodes=2, num_nodes=3, num_edges=3)
    >>> g["paper", "cites", "paper"].in_degrees().tolist()
    [2, 0, 0]

Inside a worker, :class:`HeteroShard` is the same surface over the worker's own rows of
every type (``part.graph`` of a typed partition): each relation is a
:class:`~sarcompile.graph.shard.ShardGraph` whose sources are the source type's rows.

The *homogeneous view* (:meth:`HeteroGraph.to_homogeneous`) numbers all nodes in one
range, types one after another in :attr:`node_types` order, and concatenates the
relations' edges in :attr:`edge_types` order: what METIS partitions, once for all types.
"""

from __future__ import annotations

import sys
from typing import Any, Generic, Iterable, TypeVar

import torch

from sarcompile.errors import CompileError, GraphError
from sarcompile.graph.frames import TypedFramesMixin, copy_dgl_frames
from sarcompile.graph.graph import Graph

__all__ = ["Relation", "HeteroGraph", "HeteroShard", "TracedHetero", "relation_key", "parse_relation_key"]

Relation = tuple[str, str, str]
G = TypeVar("G")


def relation_key(rel: Relation) -> str:
    """A relation as one string (file and manifest keys): ``author__writes__paper``, as PyG
    names a relation's submodules."""
    return "__".join(rel)


def parse_relation_key(key: str) -> Relation:
    parts = key.split("__")
    if len(parts) != 3:
        raise GraphError(f"{key!r} is not a relation key of the form src__name__dst")
    return parts[0], parts[1], parts[2]


class _Typed(Generic[G]):
    """What a typed graph and a typed shard share: node types, relations and the lookup
    of a relation by its triple, by its name alone or by ``(src, dst)`` where unique."""

    node_types: tuple[str, ...]
    edge_types: tuple[Relation, ...]
    relations: dict[Relation, G]

    def relation(self, key: Any) -> Relation:
        """The relation triple ``key`` names (a triple, a unique name, a unique pair)."""
        if isinstance(key, str):
            found = [r for r in self.edge_types if r[1] == key]
        elif isinstance(key, tuple) and len(key) == 3:
            found = [r for r in self.edge_types if r == key]
        elif isinstance(key, tuple) and len(key) == 2:
            found = [r for r in self.edge_types if (r[0], r[2]) == key]
        else:
            raise GraphError(f"a relation is named by (src_type, name, dst_type), a name or (src, dst); got {key!r}")
        if len(found) != 1:
            what = "no relation" if not found else f"{len(found)} relations ({found})"
            raise GraphError(f"{what} matches {key!r}; the graph has {list(self.edge_types)}")
        return found[0]

    def __getitem__(self, key: Any) -> G:
        return self.relations[self.relation(key)]

    def __contains__(self, key: Any) -> bool:
        try:
            self.relation(key)
            return True
        except GraphError:
            return False

    def items(self) -> Iterable[tuple[Relation, G]]:
        return self.relations.items()

    # A typed graph also serves as PyG's ``edge_index_dict``: a dict keyed by relation.
    def keys(self) -> Iterable[Relation]:
        return self.relations.keys()

    def values(self) -> Iterable[G]:
        return self.relations.values()

    def get(self, key: Any, default: Any = None) -> G | Any:
        return self[key] if key in self else default

    def __iter__(self):
        return iter(self.relations)

    def __len__(self) -> int:
        return len(self.relations)

    def metadata(self) -> tuple[list[str], list[Relation]]:
        """``(node_types, edge_types)`` as PyG's ``HeteroData.metadata()`` gives them (what
        ``to_hetero`` takes)."""
        return list(self.node_types), list(self.edge_types)


class HeteroGraph(TypedFramesMixin, _Typed[Graph]):
    """A graph with node types and relations on one machine (see the module docstring).

    Build it with :meth:`from_edges`, :meth:`from_pyg` or :meth:`from_dgl`. Node types
    keep the order they are given in; a type with no edges is allowed, as are isolated
    nodes, multi-edges and self-loops.

    Example:

    >>> hg = sc.HeteroGraph.from_edges(
    ...     {("author", "writes", "paper"): (torch.tensor([0, 1]), torch.tensor([0, 0]))}, {"author": 2, "paper": 1})
    >>> hg.num_nodes("paper"), hg.num_edges(("author", "writes", "paper"))
    (1, 2)
    """

    def __init__(self, relations: dict[Relation, Graph], num_nodes: dict[str, int]):
        self._num_nodes = {str(t): int(n) for t, n in num_nodes.items()}
        if any(n < 0 for n in self._num_nodes.values()):
            raise GraphError(f"node counts must be >= 0, got {self._num_nodes}")
        self.node_types = tuple(self._num_nodes)
        self.relations = dict(relations)
        self.edge_types = tuple(self.relations)

    @classmethod
    def from_edges(cls, edges: dict[Relation, tuple[Any, Any]], num_nodes: dict[str, int]) -> "HeteroGraph":
        """``edges[(src_type, name, dst_type)] = (src, dst)``: ids within each type.
        ``num_nodes`` gives every node type's count (types with no edges too)."""
        if not isinstance(num_nodes, dict):
            raise GraphError(f"num_nodes must be a dict of node type -> count, got {type(num_nodes).__name__}")
        relations: dict[Relation, Graph] = {}
        for rel, pair in edges.items():
            if not (isinstance(rel, tuple) and len(rel) == 3 and all(isinstance(p, str) for p in rel)):
                raise GraphError(f"a relation is a (src_type, name, dst_type) tuple of strings, got {rel!r}")
            if any("__" in p for p in rel):
                raise GraphError(f"relation {rel}: type and relation names may not contain '__' (it joins them)")
            s, _, d = rel
            for t in (s, d):
                if t not in num_nodes:
                    raise GraphError(f"relation {rel} uses node type {t!r}, which num_nodes does not give a count")
            if len(pair) != 2:
                raise GraphError(f"edges[{rel}] must be a (src, dst) pair of id tensors")
            try:
                # A relation within one type is an ordinary graph (self-loops mean something there).
                relations[rel] = Graph(pair[0], pair[1], num_nodes[d], None if s == d else num_nodes[s])
            except GraphError as e:
                raise GraphError(f"relation {rel}: {e}") from None
        return cls(relations, num_nodes)

    @classmethod
    def from_pyg(cls, data: Any) -> "HeteroGraph":
        """From a ``torch_geometric.data.HeteroData``: every node type (with its
        ``num_nodes``) and every edge type's ``edge_index``, in the data's order."""
        if not hasattr(data, "edge_index_dict") or not hasattr(data, "node_types"):
            raise GraphError(f"HeteroGraph.from_pyg takes a torch_geometric HeteroData, got {type(data).__name__}")
        num_nodes = {t: int(data[t].num_nodes or 0) for t in data.node_types}
        edges = {tuple(rel): (ei[0], ei[1]) for rel, ei in data.edge_index_dict.items()}
        return cls.from_edges(edges, num_nodes)

    @classmethod
    def from_dgl(cls, g: Any) -> "HeteroGraph":
        """From a DGL heterograph (``dgl.heterograph``): its node types, canonical edge
        types and each relation's edges in edge-id order, and its frames (``G.nodes[t].data``,
        ``G.edges[rel].data``, see :mod:`sarcompile.graph.frames`)."""
        dgl = sys.modules.get("dgl")
        if dgl is None or not isinstance(g, dgl.DGLGraph):
            raise GraphError(f"HeteroGraph.from_dgl takes a dgl.DGLGraph, got {type(g).__name__}")
        if g.is_block:
            raise GraphError("HeteroGraph.from_dgl got a DGLBlock (a sampled block); pass the whole heterograph")
        edges = {}
        for rel in g.canonical_etypes:
            src, dst = g.edges(order="eid", etype=rel)
            edges[tuple(rel)] = (src.long().cpu(), dst.long().cpu())
        return copy_dgl_frames(g, cls.from_edges(edges, {t: g.num_nodes(t) for t in g.ntypes}))

    def num_nodes(self, ntype: str | None = None) -> int:
        """Nodes of ``ntype``, or of all types."""
        if ntype is None:
            return sum(self._num_nodes.values())
        if ntype not in self._num_nodes:
            raise GraphError(f"no node type {ntype!r}; the graph has {list(self.node_types)}")
        return self._num_nodes[ntype]

    def num_edges(self, etype: Any = None) -> int:
        """Edges of one relation, or of all."""
        if etype is None:
            return sum(g.num_edges for g in self.relations.values())
        return self[etype].num_edges

    @property
    def global_ids(self) -> dict[str, torch.Tensor]:
        """Each type's node ids (``0..n_t-1``): on one machine every row is its own id, as
        :attr:`HeteroShard.global_ids` names a worker's rows."""
        return {t: torch.arange(n) for t, n in self._num_nodes.items()}

    def offsets(self) -> dict[str, int]:
        """Where each type's nodes start in the homogeneous view."""
        out, acc = {}, 0
        for t in self.node_types:
            out[t] = acc
            acc += self._num_nodes[t]
        return out

    def node_type_ids(self) -> torch.Tensor:
        """The type (its index in :attr:`node_types`) of every node of the homogeneous view."""
        counts = torch.tensor([self._num_nodes[t] for t in self.node_types], dtype=torch.long)
        return torch.repeat_interleave(torch.arange(len(self.node_types)), counts)

    def to_homogeneous(self) -> Graph:
        """Every node in one range (types in order), every relation's edges after the
        previous relation's: the graph a partitioner sees."""
        off = self.offsets()
        src = [g.src + off[s] for (s, _, _), g in self.relations.items()]
        dst = [g.dst + off[d] for (_, _, d), g in self.relations.items()]
        cat = lambda ts: torch.cat(ts) if ts else torch.empty(0, dtype=torch.long)  # noqa: E731
        return Graph(cat(src), cat(dst), self.num_nodes())

    def __repr__(self) -> str:
        nodes = ", ".join(f"{t}={n}" for t, n in self._num_nodes.items())
        rels = ", ".join(f"{relation_key(r)}={g.num_edges}" for r, g in self.relations.items())
        return f"HeteroGraph(nodes: {nodes}; edges: {rels})"


class HeteroShard(TypedFramesMixin, _Typed[Any]):
    """A worker's share of a :class:`HeteroGraph` (``part.graph`` of a typed partition):
    per type its own rows, per relation a :class:`~sarcompile.graph.shard.ShardGraph` with the
    in-edges of its destination rows. ``global_ids[t]`` names each local row of type ``t``
    (its id within the type).

    Example:

    >>> import tempfile
    >>> hg = sc.HeteroGraph.from_edges(
    ...     {("author", "writes", "paper"): (torch.tensor([0, 1]), torch.tensor([0, 0]))}, {"author": 2, "paper": 1})
    >>> d = tempfile.mkdtemp()
    >>> _ = sc.partition(hg, 2, d)
    >>> shard = sc.load_partition(d, rank=0, world_size=2).graph
    >>> type(shard).__name__
    'HeteroShard'
    """

    def __init__(self, rank: int, world_size: int, global_ids: dict[str, torch.Tensor], relations: dict[Relation, Any],
                 num_global_nodes: dict[str, int]):
        self.rank, self.world_size = rank, world_size
        self.global_ids = global_ids
        self.node_types = tuple(global_ids)
        self.relations = relations
        self.edge_types = tuple(relations)
        self.num_global_nodes = num_global_nodes

    def num_nodes(self, ntype: str | None = None) -> int:
        """Local rows of ``ntype`` (of all types when None)."""
        if ntype is None:
            return sum(ids.numel() for ids in self.global_ids.values())
        if ntype not in self.global_ids:
            raise GraphError(f"no node type {ntype!r}; the graph has {list(self.node_types)}")
        return self.global_ids[ntype].numel()

    def num_edges(self, etype: Any = None) -> int:
        if etype is None:
            return sum(g.num_edges for g in self.relations.values())
        return self[etype].num_edges

    def __repr__(self) -> str:
        nodes = ", ".join(f"{t}={ids.numel()}" for t, ids in self.global_ids.items())
        return f"HeteroShard(rank={self.rank}/{self.world_size}, nodes: {nodes}, edges={self.num_edges()})"


class TracedHetero(_Typed[Any]):
    """A typed graph while a model is traced (see :mod:`sarcompile.compile.leaves`): each relation
    is one of the program's graph inputs. A type's row count and global ids are read off
    a relation that has the type at one end, as a worker has them."""

    def __init__(self, node_types: tuple[str, ...], relations: dict[Relation, Any]):
        self.node_types = tuple(node_types)
        self.relations = relations
        self.edge_types = tuple(relations)

    def _end(self, ntype: str) -> tuple[Any, bool]:
        """A relation with ``ntype`` at its destination (True) or else its source (False)."""
        for (s, _, d), g in self.relations.items():
            if d == ntype:
                return g, True
        for (s, _, d), g in self.relations.items():
            if s == ntype:
                return g, False
        raise GraphError(
            f"node type {ntype!r} is in no relation, so a compiled model cannot read its row count or ids off the "
            f"graph; the relations are {list(self.edge_types)}. Take the count from the type's features (x.size(0))"
        )

    def num_nodes(self, ntype: str | None = None) -> Any:
        if ntype is None:
            raise GraphError("a compiled model reads the row count of one node type at a time: g.num_nodes('paper')")
        g, dst = self._end(ntype)
        return g.num_nodes if dst else g.num_src_nodes

    def num_edges(self, etype: Any = None) -> Any:
        if etype is None:
            raise GraphError("a compiled model reads the edge count of one relation at a time: g.num_edges('writes')")
        return self[etype].num_edges

    @property
    def global_ids(self) -> dict[str, Any]:
        return _TracedIds(self)


class _TracedIds(dict):
    """``g.global_ids`` while tracing: each type's ids read off a relation at one of its
    ends. A type in no relation has none on the graph: asking for them names the fix."""

    def __init__(self, graph: TracedHetero):
        super().__init__()
        self.graph = graph
        for t in graph.node_types:
            try:
                g, dst = graph._end(t)
            except GraphError:
                continue
            self[t] = g.global_ids if dst else g.src_global_ids

    def __missing__(self, ntype: str) -> Any:
        if ntype not in self.graph.node_types:
            raise GraphError(f"no node type {ntype!r}; the graph has {list(self.graph.node_types)}")
        raise CompileError(
            f"node type {ntype!r} is in no relation, so a compiled model cannot read its ids off the graph; "
            f"use its rows in order instead (a node table's `.weight` rather than a lookup by g.global_ids)"
        )
