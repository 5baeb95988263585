"""A call's dicts and typed graphs as flat *leaves*: how one compiler serves typed graphs.

A model over a heterogeneous graph is called with dicts (``x_dict["paper"]``, a weight per
relation) and a typed graph (:class:`~sarcompile.hetero.HeteroGraph` on one machine,
:class:`~sarcompile.hetero.HeteroShard` in a worker). The compiled program takes instead
one input per *leaf*: a tensor per dict key, a graph per relation. To every pass a
relation is then an ordinary (bipartite) graph input and a type's features an ordinary
per-node input, whose :attr:`~sarcompile.probe.Input.of` names its type or relation; the
tracer rebuilds the dicts and the typed graph from the leaves before calling ``forward``,
so the model's Python (``g[rel]``, ``for rel in g.edge_types``, ``x[src]``) runs unchanged.

>>> ArgLayout("x", "dict", ("paper", "author")).leaf_names()
['x__paper', 'x__author']
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from .errors import CompileError
from .hetero import HeteroGraph, HeteroShard, TracedHetero, relation_key

__all__ = ["ArgLayout", "layout_of", "needs_leaves"]

TYPED_GRAPHS = (HeteroGraph, HeteroShard)


def _leaf_name(arg: str, key: Any) -> str:
    text = relation_key(key) if isinstance(key, tuple) else str(key)
    return re.sub(r"\W", "_", f"{arg}__{text}")


@dataclass(frozen=True)
class ArgLayout:
    """How one argument of ``forward`` reaches the program: as it is (``plain``), one leaf
    per key (``dict``) or item (``tuple``: a bipartite layer's ``(x_src, x_dst)``), or one
    graph leaf per relation (``typed``, a typed graph whose
    node types are ``node_types``, with ``node_counts`` nodes each in the whole graph, and
    relations ``keys``)."""

    name: str
    kind: str = "plain"
    keys: tuple = ()
    node_types: tuple[str, ...] = ()
    node_counts: tuple[int, ...] = ()

    def leaf_names(self) -> list[str]:
        if self.kind == "plain":
            return [self.name]
        return [_leaf_name(self.name, k) for k in self.keys]

    def leaves(self, value: Any) -> list[Any]:
        """``value``'s leaves, in :meth:`leaf_names` order."""
        if self.kind == "plain":
            return [value]
        if self.kind == "typed":
            return [value.relations[k] for k in self.keys]
        return [value[k] for k in self.keys]  # a dict's keys, a tuple's positions

    def rebuild(self, leaves: list[Any]) -> Any:
        """The argument ``forward`` sees, from its leaves (proxies while tracing)."""
        if self.kind == "plain":
            return leaves[0]
        if self.kind == "typed":
            return TracedHetero(self.node_types, dict(zip(self.keys, leaves)))
        if self.kind == "tuple":
            return tuple(leaves)
        return dict(zip(self.keys, leaves))


def layout_of(name: str, value: Any) -> ArgLayout:
    """The layout of argument ``name`` given ``value``."""
    if isinstance(value, TYPED_GRAPHS):
        counts = value.num_global_nodes if isinstance(value, HeteroShard) else {t: value.num_nodes(t)
                                                                               for t in value.node_types}
        return ArgLayout(name, "typed", tuple(value.edge_types), tuple(value.node_types),
                         tuple(counts[t] for t in value.node_types))
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, (dict, list, tuple)):
                raise CompileError(
                    f"argument {name!r}[{k!r}] is a {type(v).__name__}: a model takes dicts of tensors (one per node "
                    "type or relation), not nested containers; flatten it into one dict"
                )
        return ArgLayout(name, "dict", tuple(value))
    if isinstance(value, tuple):
        return ArgLayout(name, "tuple", tuple(range(len(value))))
    return ArgLayout(name)


def needs_leaves(values: dict[str, Any]) -> bool:
    """Whether a call with these arguments is traced leaf by leaf (it has a dict or a
    typed graph); a call with neither is traced as it always was."""
    return any(isinstance(v, TYPED_GRAPHS + (dict,)) for v in values.values())


def leaves_of_call(layouts: tuple[ArgLayout, ...], given: dict[str, Any]) -> list[Any]:
    """The program's inputs for a call (its arguments by name)."""
    return [leaf for layout in layouts for leaf in layout.leaves(given[layout.name])]


def rebuilt_arguments(forward_params: list[Any], layouts: tuple[ArgLayout, ...],
                      placeholder: Callable[[str], Any]) -> list[Any]:
    """``forward``'s positional arguments while tracing: each argument of the call rebuilt
    from placeholders (``placeholder(leaf_name)``), the others at their defaults (an
    optional argument given None is None)."""
    by_name = {layout.name: layout for layout in layouts}
    args = []
    for p in forward_params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY):
            break
        layout = by_name.get(p.name)
        if layout is None:
            args.append(None if p.default is p.empty else p.default)
        else:
            args.append(layout.rebuild([placeholder(n) for n in layout.leaf_names()]))
    return args
