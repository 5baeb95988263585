"""PyG's front-end: lowering rules for ``torch_geometric`` layers, utilities and models
(see :mod:`sarcompile.frontends` for the modules and what each lowers)."""
