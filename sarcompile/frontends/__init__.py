"""Front-ends: lowering rules for other libraries' graph layers, so models written with
them compile unchanged.

Each front-end is a module that registers rules with
:func:`sarcompile.ir.lowering.register_lowering` when imported. None of the GNN libraries
is a dependency of sarcompile: the compiler imports a front-end (by name,
:func:`sarcompile.compile.libraries.load_available`) only when its
library is already imported by the user's program (it must be, for a model built with
it to exist), and the compiler calls it before every compile. The plain-torch front-end's
library is torch itself, so it is loaded for every compile, in a program that imports no
GNN library too (it imports none; the markers and rules it shares with the PyG
front-end live in ``frontends.edge_index``). Importing sarcompile loads no front-end.

=================================  ===================  ========================================
front-end                          library              layers
=================================  ===================  ========================================
``frontends.plain``                ``torch``            message passing in plain torch over
                                                        ``edge_index`` (``x[src]``, ``index_add_``,
                                                        ``scatter_reduce``), in layers and models
``frontends.pyg.convs``            ``torch_geometric``  SAGEConv, GCNConv, GINConv, GraphConv,
                                                        BatchNorm
``frontends.pyg.attention``        ``torch_geometric``  GATConv, GATv2Conv
``frontends.pyg.message_passing``  ``torch_geometric``  any other MessagePassing layer it can
                                                        trace
``frontends.pyg.edge_types``       ``torch_geometric``  RGCNConv, FastRGCNConv, RGATConv
``frontends.pyg.hetero``           ``torch_geometric``  HeteroConv, to_hetero models
``frontends.pyg.hetero_convs``     ``torch_geometric``  HGTConv, HANConv, HeteroDictLinear
``frontends.pyg.typed_rows``       ``torch_geometric``  HeteroLinear (and HEATConv through it)
``frontends.pyg.reversible``       ``torch_geometric``  GroupAddRev
``frontends.dgl.layers``           ``dgl``              SAGEConv, GraphConv, GATConv, HGTConv,
                                                        EdgeWeightNorm, TypedLinear, and layers
                                                        written with update_all / apply_edges
``frontends.dgl.hetero``           ``dgl``              heterographs (multi_update_all,
                                                        edge_softmax), HeteroGraphConv
=================================  ===================  ========================================
"""
