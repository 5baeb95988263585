"""Pass ``node_tables``: a node table looked up by its own type's ids is the table itself.

Contract. Expects a traced GraphModule whose node tables are placeholders
(``meta["table"]``, see :mod:`sarcompile.tables`) and whose typed graph inputs name their
relation (``meta["input"].of``). Rewrites ``F.embedding(ids, table)`` where ``ids`` is a
relation's ``global_ids`` (its destination type) or ``src_global_ids`` (its source type), or
``torch.arange`` of its ``num_nodes`` / ``num_src_nodes`` (all ids of the type:
``torch.arange(g.num_nodes(ntype))`` in DGL code), and the table is that type's, with no
``max_norm``: every node's own row, in row order -- which on a worker holding only its rows
of the table is the table, and on one machine equals the lookup. Any other lookup of a
table's rows is left for the ``residency`` pass to refuse (it reads rows by position).
Values are unchanged.
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F

from .context import CompileOptions

__all__ = ["node_tables"]


def _own_ids_type(ids: object) -> str | None:
    """The node type whose every node ``ids`` names in row order, if it is a relation's
    ``global_ids`` / ``src_global_ids``, or ``torch.arange`` of the relation's ``num_nodes`` /
    ``num_src_nodes`` (all ids of the type, as one machine numbers them)."""
    if isinstance(ids, fx.Node) and ids.op == "call_function" and ids.target is torch.arange and len(ids.args) == 1 \
            and not ids.kwargs:
        return _relation_end(ids.args[0], {"num_nodes": 2, "num_src_nodes": 0})
    return _relation_end(ids, {"global_ids": 2, "src_global_ids": 0})


def _relation_end(node: object, attrs: dict[str, int]) -> str | None:
    """The node type at end ``attrs[attr]`` of the relation ``node`` reads ``attr`` of."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is getattr):
        return None
    graph, attr = node.args
    spec = graph.meta.get("input") if isinstance(graph, fx.Node) and graph.op == "placeholder" else None
    if spec is None or spec.of is None or attr not in attrs:
        return None
    return spec.of[attrs[attr]]


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
