"""Front-ends: lowering rules for other libraries' graph layers, so models written with
them compile unchanged.

Each front-end is a module that registers rules with
:func:`sarcompile.ir.lowering.register_lowering` when imported. None of the GNN libraries
is a dependency of sarcompile: :func:`load_available` imports a front-end only when its
library is already imported by the user's program (it must be, for a model built with
it to exist), and the compiler calls it before every compile. The plain-torch front-end's
library is torch itself, so it is loaded for every compile, in a program that imports no
GNN library too (it imports none; the markers and rules it shares with the PyG
front-end live in ``frontends.edge_index``). Importing sarcompile loads no front-end.

==============================  ===================  ========================================
front-end                       library              layers
==============================  ===================  ========================================
``frontends.plain``             ``torch``            message passing in plain torch over
                                                     ``edge_index`` (``x[src]``, ``index_add_``,
                                                     ``scatter_reduce``), in layers and models
``frontends.pyg.convs``         ``torch_geometric``  SAGEConv, GCNConv, GINConv, GATConv,
                                                     GATv2Conv, GraphConv, BatchNorm, and any
                                                     other MessagePassing layer it can trace
``frontends.pyg.edge_types``    ``torch_geometric``  RGCNConv, FastRGCNConv, RGATConv
``frontends.pyg.hetero``        ``torch_geometric``  HeteroConv, to_hetero models
``frontends.pyg.hetero_convs``  ``torch_geometric``  HGTConv, HANConv, HeteroDictLinear
``frontends.pyg.typed_rows``    ``torch_geometric``  HeteroLinear (and HEATConv through it)
``frontends.pyg.reversible``    ``torch_geometric``  GroupAddRev
``frontends.dgl.layers``        ``dgl``              SAGEConv, GraphConv, GATConv, HGTConv,
                                                     EdgeWeightNorm, TypedLinear, and layers
                                                     written with update_all / apply_edges
``frontends.dgl.hetero``        ``dgl``              heterographs (multi_update_all,
                                                     edge_softmax), HeteroGraphConv
==============================  ===================  ========================================
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["load_available"]

# library module name -> the front-end modules that register its rules (torch: always imported)
_FRONTENDS = {
    "torch": ("sarcompile.frontends.plain",),
    "torch_geometric": ("sarcompile.frontends.pyg.convs", "sarcompile.frontends.pyg.edge_types",
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
