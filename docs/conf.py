"""Sphinx configuration: the pages are Markdown (MyST), the API reference is generated from
``sarcompile.__all__`` into ``api.rst`` at every build, so that a new public name is
documented (or the build fails on its docstring) without anyone editing a list."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import sarcompile  # noqa: E402

project = "sarcompile"
author = "the sarcompile developers"
extensions = ["sphinx.ext.autodoc", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
autodoc_typehints = "description"
autodoc_member_order = "bysource"
html_theme = "alabaster"
myst_heading_anchors = 3


def write_api_reference() -> None:
    """``api.rst``: every name of ``sarcompile.__all__``, in its order; modules last."""
    lines = ["API reference", "=============", "",
             "Every public name of ``sarcompile`` (``sarcompile.__all__``), from its docstring.", ""]
    modules = []
    for name in sarcompile.__all__:
        obj = getattr(sarcompile, name)
        if inspect.ismodule(obj):
            modules.append(name)
            continue
        directive = "autoclass" if inspect.isclass(obj) else "autofunction"
        lines += [".. currentmodule:: sarcompile", "", f".. {directive}:: {name}"]
        lines += ["   :members:", ""] if inspect.isclass(obj) else [""]
    for name in modules:
        # a module's functions that are re-exported above (sc.spmm is sarcompile.ops.spmm) are listed there only
        again = sorted(n for n in sarcompile.__all__ if getattr(getattr(sarcompile, name), n, None) is getattr(sarcompile, n))
        lines += [f".. automodule:: sarcompile.{name}", "   :members:"]
        lines += [f"   :exclude-members: {', '.join(again)}", ""] if again else [""]
    text = "\n".join(lines)
    path = HERE / "api.rst"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


write_api_reference()

# `scripts/docs.sh` runs linkcheck for the links between pages and to the repository's files;
# links out of the repository need a network, which CI does not have.
linkcheck_ignore = [r"https?://"]
