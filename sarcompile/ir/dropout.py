"""The IR's dropout ops: masks keyed by global edge or node id (:mod:`sarcompile.ir.rng`),
so N workers drop exactly what one machine drops. See :mod:`sarcompile.ir.ops`.
"""

from __future__ import annotations

import torch

from sarcompile.errors import GraphError
from sarcompile.ir.op_common import EDGE, NODE, _check_rows, _graph_kind
from sarcompile.ir.opdef import ir_op
from sarcompile.ir.rng import edge_keep, node_keep


def _check_edge_dropout(g, e, p, salt) -> None:
    _graph_kind(g)
    if not 0.0 <= p < 1.0:
        raise GraphError(f"edge dropout probability must be in [0, 1), got {p}")


@ir_op(check=_check_edge_dropout, output=EDGE, inputs={"e": EDGE})
def edge_dropout(g, e: torch.Tensor, p: float, salt: torch.Tensor) -> torch.Tensor:
    """Zero each edge value with probability ``p`` (scaling the rest by ``1/(1-p)``), with a
    mask keyed by global edge id, head and ``salt``: the same on any number of workers."""
    _check_rows(g, e, "e", g.num_edges)
    if p == 0.0:
        return e
    heads = e[0].numel() if e.shape[0] else 1
    keep = edge_keep(g.edge_ids, heads, p, salt.to(e.device), e.dtype)  # (a model's salt lives where it does)
    return e * keep.reshape(e.shape)


def _check_node_dropout(g, x, p, salt, source=False) -> None:
    _check_edge_dropout(g, x, p, salt)


@ir_op(check=_check_node_dropout, output=NODE, inputs={"x": NODE})
def node_dropout(g, x: torch.Tensor, p: float, salt: torch.Tensor, source: bool = False) -> torch.Tensor:
    """Zero each entry of the node rows ``x`` with probability ``p`` (scaling the rest by
    ``1/(1-p)``), with a mask keyed by global node id, position in the row and ``salt``:
    every worker draws the same mask for a node, so N workers drop what one machine drops.
    ``x`` holds a row per destination node of ``g`` (per source node with ``source``)."""
    ids = g.src_global_ids if source else g.global_ids
    _check_rows(g, x, "x", ids.numel())
    if p == 0.0:
        return x
    # A product with the bool mask keeps the mask (not a float copy) for backward, and is
    # several times faster than masked_fill on the CPU.
    return x * node_keep(ids, x, p, salt.to(x.device)) / (1.0 - p)
