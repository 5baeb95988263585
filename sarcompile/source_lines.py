"""Where traced code comes from: the line of the user's code a node was traced from, or
that is calling into torch now, for the messages of a refusal."""

from __future__ import annotations

import linecache
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

__all__ = ["called_by_sarcompile", "calling_line", "source_line", "user_frame"]

# As the interpreter spells code files (the paths modules were imported from), with the
# separator: torch_geometric's files are not torch's.
_TORCH = os.path.dirname(torch.__file__) + os.sep
_OURS = os.path.dirname(__file__) + os.sep
_TRACER = os.path.join(os.path.dirname(__file__), "trace.py")  # the tracer's own frames name no line of code


def user_frame(frame: Any) -> tuple[str, int] | None:
    """``(file, line)`` of the innermost frame from ``frame`` outward that is outside torch
    and sarcompile (outside torch and the tracer, if there is none), or None."""
    ours = None
    while frame is not None:
        file = frame.f_code.co_filename
        if not file.startswith(_TORCH) and file != _TRACER:
            if not file.startswith(_OURS):
                return file, frame.f_lineno
            ours = ours or (file, frame.f_lineno)
        frame = frame.f_back
    return ours


def _line(where: tuple[str, int] | None) -> str:
    if where is None:
        return ""
    file, line = where
    return f"{Path(file).name}:{line}: `{linecache.getline(file, line).strip()}`"


def source_line(node: fx.Node) -> str:
    """``file.py:12: `code``` of the user's line the node was traced from (its
    ``meta["user_frame"]``, see :func:`user_frame`), or ''."""
    return _line(node.meta.get("user_frame"))


def calling_line() -> str:
    """``file.py:12: `code``` of the user's line calling into sarcompile or torch now, or ''."""
    return _line(user_frame(sys._getframe(1)))


def called_by_sarcompile() -> bool:
    """Whether the function calling the caller is sarcompile's own code."""
    return sys._getframe(2).f_code.co_filename.startswith(_OURS)
