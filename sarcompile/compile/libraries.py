"""The front-end of each GNN library the program has imported, loaded by name before every
compile (:mod:`sarcompile.frontends` lists them). Front-ends sit above the compiler: they
register their lowering rules and graph views with :mod:`sarcompile.ir.lowering`, and the
compiler reaches them only through that registry and the module names below, so it imports
none of them and a program that imports no GNN library loads only the plain-torch one."""

from __future__ import annotations

import importlib
import sys

__all__ = ["load_available"]

# library module name -> the front-end modules that register its rules (torch: always imported)
_FRONTENDS = {
    "torch": ("sarcompile.frontends.plain",),
    "torch_geometric": ("sarcompile.frontends.pyg.convs", "sarcompile.frontends.pyg.attention",
                        "sarcompile.frontends.pyg.message_passing", "sarcompile.frontends.pyg.edge_types",
                        "sarcompile.frontends.pyg.hetero", "sarcompile.frontends.pyg.hetero_convs",
                        "sarcompile.frontends.pyg.typed_rows", "sarcompile.frontends.pyg.reversible"),
    "dgl": ("sarcompile.frontends.dgl.layers", "sarcompile.frontends.dgl.hetero"),
}


def load_available() -> None:
    """Import the front-end of every supported library the program has imported."""
    for library, frontends in _FRONTENDS.items():
        for frontend in frontends:
            if library in sys.modules and frontend not in sys.modules:
                importlib.import_module(frontend)
