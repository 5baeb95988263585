"""What the tracer and the passes record on an fx node for later passes, the plan and the
runtime: one typed record, :class:`NodeInfo`, in place of loose string keys of ``node.meta``.

Read it with :func:`info` and write it with :func:`set_info`; :func:`inherit` copies some of
one node's fields onto another (a rewrite's new nodes keep the layer they came from).

The record is frozen, and a write stores a new one. fx copies ``node.meta`` shallowly
(``Graph.node_copy``, and the passes' ``new.meta.update(node.meta)``), so a copied node
shares its original's record; as it cannot change in place, a pass writing one node's
field leaves the other's as it was, as with the plain dict keys before. fx's own keys
(``nn_module_stack``, ``stack_trace``) stay in ``node.meta`` as fx sets them.

A field at its default means the same as the key's absence did; the one value that could be
both a recorded value and "none recorded" (a plain argument traced with ``None``) is kept
apart by wrapping it, see :attr:`NodeInfo.constant`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from sarcompile.ir.opdef import OpDef
from sarcompile.ir.probe import Input
from sarcompile.ir.vocab import LinkPolicy, Residency

__all__ = ["NodeInfo", "info", "set_info", "inherit", "FIELDS", "KEY"]

KEY = "sarcompile"  # the one key of node.meta the record is kept under


@dataclass(frozen=True)
class NodeInfo:
    """One node's record; every field's comment says who sets it and who reads it."""

    # Set by the compiler from the call (compile.pipeline), the tracer for node tables
    # (compile.sar_tracer), the residency passes (one input per placeholder, or a typed
    # graph's) and node_tables (a table's chosen residency). Read by the residency passes,
    # node_tables, compile.tables, the pipeline (a program's table order) and plan.probe.
    input: Input | None = None
    # ``(value,)`` of a plain Python argument the model was traced with (compile.pipeline);
    # a tuple, since None is such a value too. Read by plan.probe to run the placeholder.
    constant: tuple[Any] | None = None
    # A node table's parameter name, on its placeholder (compile.sar_tracer). Read by
    # node_tables, reuse, compile.tables, the pipeline and the plan.
    table: str | None = None
    # The values the trace computed for the node, one per probe (compile.trace). Read by
    # lower to trace a layer's stand-in on them, which then drops them.
    example: list[Any] | tuple[Any, ...] | None = None
    # ``(file, line)`` in the user's code that made the node (compile.sar_tracer; lower
    # gives a layer's inlined body its caller's). Read by compile.source_lines for errors.
    user_frame: tuple[str, int] | None = None
    # Path and class name of the layer a node was inlined from (lower; kept by the passes
    # that rewrite it). Read by communication (compress_layers), strategy (per-layer
    # strategies), the residency errors and the plan's rows.
    layer: str | None = None
    layer_type: str | None = None
    # What the node's value is made of (compile.residency_check, and the passes that add
    # nodes). Read by dropout and residency's printing.
    residency: Residency | None = None
    # The node type or relation a typed graph's rows belong to (compile.residency_check).
    # Read by dropout (which graph a dropout's rows are on) and residency's printing.
    rows_of: Any = None
    # The dim per-node rows are on when not 0, after torch.stack(hs, dim=1)
    # (compile.residency_check). Read by dropout, which moves them to dim 0 and back.
    row_axis: int = 0
    # ``(input, keepdim)`` of a reduction over the rows the residency pass let through
    # (compile.residency_dims). Read by row_reductions, which makes it an all-reduced mean.
    reduces_rows: tuple[fx.Node, bool] | None = None
    # The IR op a node calls and its bound arguments (sar). Read by strategy,
    # communication and the plan (plan.probe, plan.build).
    ir_op: OpDef | None = None
    args: dict[str, Any] | None = None
    # Why the strategy pass chose the node's strategy. Read by the plan's rows.
    strategy_reason: str | None = None
    # The names of the nodes a fused node replaced (fuse). Read by tests and readers of a
    # program's stages.
    fused: list[str] | None = None
    # The link policy of an approximate exchange (communication), and the warning it gave
    # (an op that is not exact under it). Read by plan.traffic and plan.build.
    comm: LinkPolicy | None = None
    comm_warning: str | None = None


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(NodeInfo))
_EMPTY = NodeInfo()


def info(node: fx.Node) -> NodeInfo:
    """``node``'s record; all defaults (nothing recorded) where none was written."""
    return node.meta.get(KEY, _EMPTY)


def set_info(node: fx.Node, **fields: Any) -> None:
    """Record ``fields`` on ``node``, keeping its other fields (an unknown name is a TypeError)."""
    node.meta[KEY] = dataclasses.replace(info(node), **fields)


def inherit(node: fx.Node, source: fx.Node, names: Iterable[str] = FIELDS) -> None:
    """Copy onto ``node`` the fields of ``names`` that ``source`` recorded (not at their
    default), keeping ``node``'s others: ``dict.update`` of the keys ``source`` had."""
    had = info(source)
    changes = {n: getattr(had, n) for n in names if _recorded(getattr(had, n), getattr(_EMPTY, n))}
    if changes:
        set_info(node, **changes)


def _recorded(value: Any, default: Any) -> bool:
    # (``is not`` for the None defaults: a value such as a list of tensors is not compared.)
    return value is not None if default is None else value != default
