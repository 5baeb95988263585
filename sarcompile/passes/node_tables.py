"""Pass ``node_tables``: a node table looked up by its own type's ids is the table itself.

Contract. Expects a traced GraphModule whose node tables are placeholders
(``meta["table"]``, see :mod:`sarcompile.tables`) and whose typed graph inputs name their
relation (``meta["input"].of``). Rewrites ``F.embedding(ids, table)`` where ``ids`` is a
relation's ``global_ids`` (its destination type) or ``src_global_ids`` (its source type)
and the table is that type's, with no ``max_norm``: every node's own row, in row order --
which on a worker holding only its rows of the table is the table, and on one machine
equals the lookup. Any other lookup of a table's rows is left for the ``residency`` pass
to refuse (it reads rows by position). Values are unchanged.
"""

from __future__ import annotations

import torch.fx as fx
import torch.nn.functional as F

from .context import CompileOptions

__all__ = ["node_tables"]


def _own_ids_type(ids: object) -> str | None:
    """The node type whose every node ``ids`` names in row order, if it is a relation's
    ``global_ids`` / ``src_global_ids``."""
    if not (isinstance(ids, fx.Node) and ids.op == "call_function" and ids.target is getattr):
        return None
    graph, attr = ids.args
    spec = graph.meta.get("input") if isinstance(graph, fx.Node) and graph.op == "placeholder" else None
    if spec is None or spec.of is None:
        return None
    return {"global_ids": spec.of[2], "src_global_ids": spec.of[0]}.get(attr)


def node_tables(gm: fx.GraphModule, ctx: CompileOptions | None = None) -> fx.GraphModule:
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not F.embedding:
            continue
        ids = node.args[0] if node.args else node.kwargs.get("input")
        table = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
        if not (isinstance(table, fx.Node) and "table" in table.meta):
            continue
        rest = {**dict(zip(("padding_idx", "max_norm"), node.args[2:4])), **node.kwargs}
        if rest.get("max_norm") is not None:
            continue  # renormalises rows in place: left for the residency pass
        if _own_ids_type(ids) == table.meta["input"].of:
            node.replace_all_uses_with(table)
            gm.graph.erase_node(node)
            if not ids.users:
                gm.graph.erase_node(ids)
    gm.recompile()
    return gm
