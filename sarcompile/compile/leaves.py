"""A call's dicts and typed graphs as flat *leaves*: how one compiler serves typed graphs.

A model over a heterogeneous graph is called with dicts (``x_dict["paper"]``, a weight per
relation) and a typed graph (:class:`~sarcompile.graph.hetero.HeteroGraph` on one machine,
:class:`~sarcompile.graph.hetero.HeteroShard` in a worker). The compiled program takes instead
one input per *leaf*: a tensor per dict key, a graph per relation. To every pass a
relation is then an ordinary (bipartite) graph input and a type's features an ordinary
per-node input, whose :attr:`~sarcompile.ir.probe.Input.of` names its type or relation; the
tracer rebuilds the dicts and the typed graph from the leaves before calling ``forward``,
so the model's Python (``g[rel]``, ``for rel in g.edge_types``, ``x[src]``) runs unchanged.

A graph's frames (:mod:`sarcompile.graph.frames`: ``g.ndata["feat"]``, ``G.nodes[t].data["inp"]``,
``g.edata[dgl.ETYPE]``) are leaves too, where DGL code reads them (DGL is imported): one
per-node or per-edge input per field (:attr:`ArgLayout.frames`), after the graph's own
leaves, which the tracer puts back into the traced graph's frames.

A model whose ``forward`` takes ``*args`` or ``**kwargs`` (PyG's ``HeteroConv.forward(self,
*args_dict, **kwargs_dict)``) is traced the same way: each value such a parameter collects
is an argument of its own, named ``args_dict_0``, ``args_dict_1``, ... or by its keyword.

A plain Python argument (:func:`is_plain`: a bool, int, float, str or None, or a tuple of
them) is no input of the program: forward is traced with its value (``if training:``,
``self.lins[target]``), and the compiler keeps a program per value (:class:`Constant`).

>>> ArgLayout("x", "dict", ("paper", "author")).leaf_names()
['x__paper', 'x__author']
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable

from sarcompile.errors import CompileError
from sarcompile.graph.frames import FramesMixin, TypedFramesMixin, frame_keys, frame_of
from sarcompile.graph.hetero import HeteroGraph, HeteroShard, TracedHetero, relation_key
from sarcompile.compile.data_argument import data_keys, is_data, rebuilt_data

__all__ = ["ArgLayout", "Constant", "call_arguments", "argument_name", "frame_inputs", "frames_read", "has_frames", "is_plain",
           "layout_of", "needs_leaves", "takes_varargs", "with_frames"]

TYPED_GRAPHS = (HeteroGraph, HeteroShard)
ATTRIBUTE = "self."  # how a layout names a graph the model keeps (self.g), see ArgLayout
_PLAIN = (bool, int, float, str, type(None))
_FRAMED = (FramesMixin, TypedFramesMixin)
_FRAME_INPUTS = "_sc_frame_inputs"  # a rebuilt graph's frame fields while tracing, see ArgLayout.rebuild


def is_plain(value: Any) -> bool:
    """Whether ``value`` is a plain Python value, traced as a constant: a bool, int, float,
    str or None, or a tuple of them."""
    if isinstance(value, tuple):
        return all(is_plain(v) for v in value)
    return isinstance(value, _PLAIN)


def _typed(value: Any) -> Any:
    return tuple(_typed(v) for v in value) if isinstance(value, tuple) else (type(value), value)


class Constant:
    """A plain Python argument's value, as a program is keyed by it: equal values of one
    type are one program, ``True`` and ``1`` (or ``1`` and ``1.0``) two, as the traced
    code may tell them apart (``x * 1`` keeps an integer tensor's dtype, ``x * 1.0`` not).

    >>> Constant(True) == Constant(1), Constant((2, "a")) == Constant((2, "a"))
    (False, True)
    """

    __slots__ = ("value", "_key")

    def __init__(self, value: Any):
        self.value = value
        self._key = _typed(value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Constant) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"Constant({self.value!r})"


def _leaf_name(arg: str, key: Any) -> str:
    text = relation_key(key) if isinstance(key, tuple) else str(key)
    return re.sub(r"\W", "_", f"{arg}__{text}")


@dataclass(frozen=True)
class ArgLayout:
    """How one argument of ``forward`` reaches the program: as it is (``plain``), one leaf
    per key (``dict``) or item (``tuple``: a bipartite layer's ``(x_src, x_dst)``; ``list``:
    a list of tensors or graphs), one graph leaf per relation (``typed``, a typed graph whose
    node types are ``node_types``, with ``node_counts`` nodes each in the whole graph, and
    relations ``keys``), a PyG ``Data`` (``data``: a leaf per tensor and one for its graph,
    by attribute name in ``keys``, see :mod:`sarcompile.compile.data_argument`), or none (``none``: a None that ``*args`` collected, which keeps
    its position; ``constant``: a plain Python value, the :class:`Constant` in ``keys``,
    which forward is traced with). ``passed`` says how ``forward`` receives it: as the named parameter
    ``name`` (``named``), as one of the values its ``*args`` collects (``varargs``, in
    order), by keyword into its ``**kwargs`` (``varkw``), or not at all (``attr``: a graph
    the model keeps, named ``self.<path>``, which the tracer sets on the module). ``frames``:
    the fields on the frames of the graphs it holds, each ``(item, end, of, field)`` -- the
    list position of its graph (None for a graph as it is), ``ndata`` or ``edata``, the node
    type or relation of a typed graph (else None) and the field's name: a leaf each, after
    the others (see :func:`with_frames`)."""

    name: str
    kind: str = "plain"
    keys: tuple = ()
    node_types: tuple[str, ...] = ()
    node_counts: tuple[int, ...] = ()
    passed: str = "named"
    frames: tuple[tuple[Any, str, Any, str], ...] = ()

    @property
    def attribute(self) -> str | None:
        """The path of the module attribute this layout stands for (``passed == "attr"``)."""
        return self.name[len(ATTRIBUTE):] if self.passed == "attr" else None

    def leaf_names(self) -> list[str]:
        return self._own_names() + [_frame_leaf_name(self.name, *key) for key in self.frames]

    def _own_names(self) -> list[str]:
        if self.kind == "plain":
            return [re.sub(r"\W", "_", self.name)]  # (self.g: self_g)
        if self.kind == "constant":
            return []
        return [_leaf_name(self.name, k) for k in self.keys]

    def leaves(self, value: Any) -> list[Any]:
        """``value``'s leaves, in :meth:`leaf_names` order."""
        fields = [frame_of(value if item is None else value[item], end, of)[field]
                  for item, end, of, field in self.frames]
        return self._own_leaves(value) + fields

    def _own_leaves(self, value: Any) -> list[Any]:
        if self.kind == "plain":
            return [value]
        if self.kind in ("none", "constant"):
            return []
        if self.kind == "typed":
            return [value.relations[k] for k in self.keys]
        return [value[k] for k in self.keys]  # a dict's keys, a tuple's positions

    def rebuild(self, leaves: list[Any]) -> Any:
        """The argument ``forward`` sees, from its leaves (proxies while tracing); each graph
        in it holds its frame fields' leaves, for :func:`frame_inputs`."""
        own = len(leaves) - len(self.frames)
        value = self._rebuild(leaves[:own])
        for (item, end, of, field), leaf in zip(self.frames, leaves[own:]):
            graph = value if item is None else value[item]
            vars(graph).setdefault(_FRAME_INPUTS, {})[(end, of, field)] = leaf
        return value

    def _rebuild(self, leaves: list[Any]) -> Any:
        if self.kind == "plain":
            return leaves[0]
        if self.kind == "none":
            return None
        if self.kind == "constant":
            return self.keys[0].value
        if self.kind == "typed":
            return TracedHetero(self.node_types, dict(zip(self.keys, leaves)))
        if self.kind == "tuple":
            return tuple(leaves)
        if self.kind == "list":
            return list(leaves)
        if self.kind == "data":
            return rebuilt_data(self.keys, leaves)
        return dict(zip(self.keys, leaves))


def _frame_leaf_name(arg: str, item: Any, end: str, of: Any, field: str) -> str:
    parts = [arg, *([] if item is None else [str(item)]), end]
    parts += [] if of is None else [relation_key(of) if isinstance(of, tuple) else str(of)]
    return re.sub(r"\W", "_", "__".join([*parts, field]))


def frames_read() -> bool:
    """Whether graphs' frames are inputs of a program: where DGL is imported, whose code
    reads them (a model traced without DGL sees a graph without frames)."""
    return "dgl" in sys.modules


def _graphs_in(value: Any) -> list[tuple[Any, Any]]:
    """The framed graphs ``value`` holds, with their list positions (None: ``value`` itself)."""
    if isinstance(value, _FRAMED):
        return [(None, value)]
    if isinstance(value, (list, tuple)) and any(isinstance(v, _FRAMED) for v in value):
        return [(i, v) for i, v in enumerate(value) if isinstance(v, _FRAMED)]
    return []


def has_frames(value: Any) -> bool:
    """Whether ``value`` (a graph, or a list or tuple of them) has a field on its frames
    that the program reads (see :func:`frames_read`)."""
    return frames_read() and any(frame_keys(g) for _, g in _graphs_in(value))


def with_frames(layout: ArgLayout, value: Any) -> ArgLayout:
    """``layout`` of ``value`` with the fields on the frames of the graphs it holds (see
    :attr:`ArgLayout.frames`), where the program reads them (:func:`frames_read`)."""
    if not frames_read() or layout.kind not in ("plain", "typed", "list", "tuple"):
        return layout
    frames = tuple((item, *key) for item, graph in _graphs_in(value) for key in frame_keys(graph))
    return dataclasses.replace(layout, frames=frames) if frames else layout


def frame_inputs(graph: Any) -> dict[tuple[str, Any, str], Any]:
    """The frame fields of ``graph`` rebuilt while tracing (:meth:`ArgLayout.rebuild`), by
    ``(end, of, field)``; empty for any other value."""
    return getattr(graph, "__dict__", {}).get(_FRAME_INPUTS, {})


def layout_of(name: str, value: Any, passed: str = "named") -> ArgLayout:
    """The layout of argument ``name`` given ``value`` (``passed`` as :class:`ArgLayout` says)."""
    if value is None:
        return ArgLayout(name, "none", passed=passed)
    if is_plain(value):
        return ArgLayout(name, "constant", (Constant(value),), passed=passed)
    if isinstance(value, TYPED_GRAPHS):
        counts = value.num_global_nodes if isinstance(value, HeteroShard) else {t: value.num_nodes(t)
                                                                               for t in value.node_types}
        return ArgLayout(name, "typed", tuple(value.edge_types), tuple(value.node_types),
                         tuple(counts[t] for t in value.node_types), passed)
    if is_data(value):
        return ArgLayout(name, "data", data_keys(value), passed=passed)
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, (dict, list, tuple)):
                raise CompileError(
                    f"argument {name!r}[{k!r}] is a {type(v).__name__}: a model takes dicts of tensors (one per node "
                    "type or relation), not nested containers; flatten it into one dict"
                )
        return ArgLayout(name, "dict", tuple(value), passed=passed)
    if isinstance(value, (tuple, list)):
        return ArgLayout(name, "list" if isinstance(value, list) else "tuple", tuple(range(len(value))), passed=passed)
    return ArgLayout(name, passed=passed)


def call_arguments(forward: Any, args: tuple, kwargs: dict) -> dict[str, tuple[Any, str]]:
    """A call's arguments as ``forward`` binds them, by name, in its order, each with how it
    is passed (see :class:`ArgLayout`): the named parameters given, then each value
    ``*name`` collects as ``name_0``, ``name_1``, ..., and each keyword ``**kwargs`` collects."""
    signature = inspect.signature(forward)
    try:
        bound = signature.bind_partial(*args, **kwargs)
    except TypeError as e:
        raise CompileError(f"the model was called with arguments its forward{signature} does not take: {e}") from None
    out: dict[str, tuple[Any, str]] = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            out.update({f"{name}_{i}": (v, "varargs") for i, v in enumerate(value)})
        elif kind is inspect.Parameter.VAR_KEYWORD:
            out.update({k: (v, "varkw") for k, v in value.items()})
        else:
            out[name] = (value, "named")
    return out


def argument_name(forward: Any, where: int | str) -> str:
    """The name :func:`call_arguments` gives the argument at position ``where`` (or keyword)."""
    if isinstance(where, str):
        return where
    params = list(inspect.signature(forward).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if where < len(positional):
        return positional[where].name
    var = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    if var is None:
        raise CompileError(f"forward{inspect.signature(forward)} takes no argument at position {where}")
    return f"{var}_{where - len(positional)}"


def takes_varargs(given: dict[str, tuple[Any, str]]) -> bool:
    """Whether ``given`` (:func:`call_arguments`) fills a ``*args`` or ``**kwargs``."""
    return any(passed != "named" for _, passed in given.values())


def needs_leaves(values: dict[str, Any]) -> bool:
    """Whether a call with these arguments is traced leaf by leaf (it has a dict, a typed
    graph, or a list or tuple that is not plain, such as a list of tensors, whose length
    forward may ask); a call with none of them is traced as it always was."""
    return any(isinstance(v, TYPED_GRAPHS + (dict,)) or (isinstance(v, (list, tuple)) and not is_plain(v))
               or is_data(v) for v in values.values())


def leaves_of_call(layouts: tuple[ArgLayout, ...], given: dict[str, Any]) -> list[Any]:
    """The program's inputs for a call (its arguments by name; a constant's may be left out)."""
    return [leaf for layout in layouts for leaf in layout.leaves(given.get(layout.name))]


def rebuilt_arguments(forward_params: list[Any], layouts: tuple[ArgLayout, ...], placeholder: Callable[[str], Any]
                      ) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    """``forward``'s arguments while tracing, positional and by keyword: each argument of
    the call rebuilt from placeholders (``placeholder(leaf_name)``, in the order of
    ``layouts``), the others at their defaults (an optional argument given None is None);
    and the graphs the model keeps (``attr`` layouts), rebuilt alike, by attribute path."""
    rebuilt = {layout.name: layout.rebuild([placeholder(n) for n in layout.leaf_names()]) for layout in layouts}
    attributes = {x.attribute: rebuilt[x.name] for x in layouts if x.attribute is not None}
    by_name = {layout.name: layout for layout in layouts}
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for p in forward_params:
        if p.kind is p.VAR_POSITIONAL:
            args += [rebuilt[x.name] for x in layouts if x.passed == "varargs"]
        elif p.kind is p.VAR_KEYWORD:
            kwargs.update({x.name: rebuilt[x.name] for x in layouts if x.passed == "varkw"})
        elif p.kind is p.KEYWORD_ONLY:
            if p.name in by_name:
                kwargs[p.name] = rebuilt[p.name]
        elif p.name in by_name:
            args.append(rebuilt[p.name])
        else:
            args.append(None if p.default is p.empty else p.default)
    return args, kwargs, attributes
