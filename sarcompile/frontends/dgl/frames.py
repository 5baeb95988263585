"""The fields DGL code stores on a traced graph (``g.ndata``, ``g.edata``,
``G.nodes[t].data``, ...) with DGL's scopes (:class:`Frames`), and :func:`refusal`, the
:class:`~sarcompile.CompileError` that names the layer and the user's line, which the whole
DGL front-end raises.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from pathlib import Path
from typing import Any, Iterable

import dgl
import torch
import torch.fx as fx

from sarcompile.errors import CompileError

__all__ = ["Frames", "refusal"]

# Where the user's line is not: sarcompile, torch, DGL and Python's own modules.
_NOT_USER = tuple(str(Path(m.__file__).resolve().parent) + os.sep for m in (torch, dgl, os))
_OURS = str(Path(__file__).resolve().parents[2]) + os.sep


def refusal(message: str, tracer: fx.Tracer | None = None) -> CompileError:
    """A :class:`~sarcompile.CompileError` saying ``message``, and where: the layer ``tracer``
    is tracing, and the user's line (the innermost frame outside sarcompile, torch, DGL and
    Python's library)."""
    where = []
    stack = list(getattr(tracer, "module_stack", {}).values())  # (path, type) per module entered
    if stack and stack[-1][0]:
        path, kind = stack[-1]
        where.append(f"in layer {path!r} ({getattr(kind, '__name__', str(kind).rsplit('.', 1)[-1])})")
    for frame in reversed(traceback.extract_stack()[:-1]):
        path = str(Path(frame.filename).resolve())
        if not path.startswith(_NOT_USER) and not path.startswith(_OURS) and not frame.filename.startswith("<"):
            where.append(f"at {Path(frame.filename).name}:{frame.lineno}: `{(frame.line or '').strip()}`")
            break
    return CompileError(f"{message} ({', '.join(where)})" if where else message)


class _Fields(dict):
    """One frame of a traced graph: a field it lacks is refused, naming the fields it has."""

    def __init__(self, values: dict, what: str):
        super().__init__(values)
        self.what = what

    def copy(self) -> "_Fields":
        return _Fields(self, self.what)

    def __missing__(self, key: Any):
        raise refusal(
            f"{self.what}[{key!r}]: the graph has no such field (its fields: {sorted(map(str, self))}). Set it "
            f"before calling the model, as on a DGL graph: {self.what}[{key!r}] = tensor on the graph the model is "
            "called with (on a worker on part.graph, whose ndata sc.partition(..., node_data=...) fills), or store "
            "it in forward before reading it"
        )


def _what(end: str, of: Any) -> str:
    """How DGL code names a frame: ``g.ndata``, ``G.nodes['paper'].data``, ``G.edges[rel].data``."""
    if of is None:
        return f"g.{end}"
    return f"G.{'nodes' if end == 'ndata' else 'edges'}[{of!r}].data"


class Frames:
    """The fields DGL code stores on a traced graph: a dict per node type and per relation
    (DGL's frames), with DGL's scopes. ``initial``: the fields the graph has when the model
    is called (its frames' inputs of the program, by ``(end, type or relation, field)``,
    see :func:`~sarcompile.compile.leaves.frame_inputs`).

    A heterograph and its relations share one ``Frames``, as a DGL relation graph shares
    the heterograph's storage: what ``g["writes"].srcdata`` gets, ``g.nodes["author"].data``
    shows. A one-type graph has one node type and one relation, both ``None``."""

    def __init__(self, node_types: Iterable[Any] = (None,), relations: Iterable[Any] = (None,),
                 initial: dict[tuple[str, Any, str], Any] | None = None):
        nodes = {t: _Fields({}, _what("ndata", t)) for t in node_types}
        edges = {r: _Fields({}, _what("edata", r)) for r in relations}
        for (end, of, field), value in (initial or {}).items():
            (nodes if end == "ndata" else edges)[of][field] = value
        self._stack: list[tuple[dict, dict]] = [(nodes, edges)]

    def nodes(self, ntype: Any) -> dict:
        return self._stack[-1][0][ntype]

    def edges(self, rel: Any) -> dict:
        return self._stack[-1][1][rel]

    def _current(self) -> tuple[dict, dict]:
        nodes, edges = self._stack[-1]
        return {t: f.copy() for t, f in nodes.items()}, {r: f.copy() for r, f in edges.items()}

    @contextlib.contextmanager
    def scope(self):
        """Writes inside the block are dropped at its end (DGL's ``local_scope``)."""
        self._stack.append(self._current())
        try:
            yield
        finally:
            self._stack.pop()

    def copy(self) -> "Frames":
        """Frames of their own holding the fields set now (DGL's ``local_var``)."""
        out = Frames((), ())
        out._stack = [self._current()]
        return out
