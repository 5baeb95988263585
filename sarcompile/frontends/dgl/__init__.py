"""DGL's front-end: lowering rules for ``dgl.nn`` layers, and a graph as DGL code reads it
while a model is traced (see :mod:`sarcompile.frontends`)."""
