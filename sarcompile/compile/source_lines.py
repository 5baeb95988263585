"""Where traced code comes from: the line of the user's code a node was traced from, or
that is calling into torch now, for the messages of a refusal.

The user's code is any file outside the libraries a model is built on -- torch, PyG (and
its companions torch_sparse, torch_scatter, ...), DGL, the standard library -- and outside
sarcompile. A model that is a package of its own, installed in site-packages, is the
user's code too: only the libraries named here are not. So a refusal of code inside a
PyG layer or a DGL function names the line of the user's forward that called it."""

from __future__ import annotations

import functools
import linecache
import os
import re
import sys
import sysconfig
from pathlib import Path
from typing import Any

import torch.fx as fx

from sarcompile.ir.node_info import info

__all__ = ["called_by_sarcompile", "calling_line", "source_line", "user_file", "user_frame", "where_line"]

# Packages a model is built on, whose lines a refusal does not name (as their top-level
# import names; each is looked up once imported).
LIBRARIES = ("torch", "functorch", "torch_geometric", "torch_sparse", "torch_scatter", "torch_cluster",
             "torch_spline_conv", "pyg_lib", "dgl")
# As the interpreter spells code files (the paths modules were imported from), with the
# separator: torch_geometric's files are not torch's.
_OURS = os.path.dirname(os.path.dirname(__file__)) + os.sep  # the package root: every module of sarcompile
_TRACER = os.path.join(os.path.dirname(__file__), "trace.py")  # the tracer's own frames name no line of code
_STDLIB = tuple({sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib")})
_INSTALLED = re.compile(r"[\\/](site|dist)-packages[\\/]")  # inside the standard library's folder, not of it


@functools.lru_cache(maxsize=None)
def _library_dirs(imported: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(os.path.join(d, "") for name in imported for d in getattr(sys.modules[name], "__path__", ()))


_known: tuple[int, tuple[str, ...]] = (-1, ())  # (how many modules were imported, their folders) when last looked


def _libraries() -> tuple[str, ...]:
    """The folders of the :data:`LIBRARIES` imported now (looked up again only where a
    module was imported since: it is asked for every traced node)."""
    global _known
    if _known[0] != len(sys.modules):
        _known = (len(sys.modules), _library_dirs(tuple(name for name in LIBRARIES if name in sys.modules)))
    return _known[1]


def _standard(file: str) -> bool:
    """Whether ``file`` is the standard library's."""
    return file.startswith("<frozen ") or file.startswith(_STDLIB) and not _INSTALLED.search(file)


def user_file(file: str) -> bool:
    """Whether the code file ``file`` is the user's (see the module docstring)."""
    return not (file.startswith(_OURS) or file.startswith(_libraries()) or _standard(file))


def user_frame(frame: Any) -> tuple[str, int] | None:
    """``(file, line)`` of the innermost frame from ``frame`` outward that is the user's
    code (see the module docstring) and, while tracing, inside the traced code (the frames
    outside the tracer's ``trace`` -- sarcompile's compiler, the caller of the model --
    trace nothing); else of the innermost in the libraries other than torch (a PyG layer's
    code, traced on its own) or in sarcompile outside the tracer (a model of sarcompile's
    own, such as the trainer's); or None."""
    libraries, torch_dirs = _libraries(), _library_dirs(("torch",))
    ours = library = None
    while frame is not None:
        file = frame.f_code.co_filename
        if file == _TRACER:
            if frame.f_code.co_name == "trace":  # where the traced code begins
                break
        elif file.startswith(_OURS):
            ours = ours or (file, frame.f_lineno)
        elif file.startswith(libraries):
            if not file.startswith(torch_dirs):
                library = library or (file, frame.f_lineno)
        elif not _standard(file):
            return file, frame.f_lineno
        frame = frame.f_back
    return library or ours


def _line(where: tuple[str, int] | None) -> str:
    if where is None:
        return ""
    file, line = where
    return f"{Path(file).name}:{line}: `{linecache.getline(file, line).strip()}`"


def source_line(node: fx.Node) -> str:
    """``file.py:12: `code``` of the user's line the node was traced from (its
    ``info(node).user_frame``, see :func:`user_frame`), or ''."""
    return _line(info(node).user_frame)


def calling_line() -> str:
    """``file.py:12: `code``` of the user's line calling into sarcompile or torch now, or ''."""
    return _line(user_frame(sys._getframe(1)))


def called_by_sarcompile() -> bool:
    """Whether the function calling the caller is sarcompile's own code."""
    return sys._getframe(2).f_code.co_filename.startswith(_OURS)


def where_line() -> str:
    """`` (at file.py:12: `code`)`` of the user's line running now, or ''."""
    line = calling_line()
    return f" (at {line})" if line else ""
