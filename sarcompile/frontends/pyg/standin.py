"""What every PyG lowering rule shares: the stand-in base class, the checks that refuse
what no rule covers (subclasses that change the computation, hooks, lazy parameters,
other flows and aggregations), and the run-time checks of call arguments.

Optional arguments (``edge_weight``, ``size``, ...) are runtime values to the traced
stand-in, so the few checks that depend on them (:func:`_plain_call`) run in the compiled
program (at the first call, which is also when the model compiles). A module calling it
wraps the name it imports too (``torch.fx.wrap("_plain_call")``): fx makes a wrapped
function one node only where the module calling it binds it so.
"""

from __future__ import annotations

import torch
import torch.fx
from torch import nn
from torch_geometric import nn as gnn
from torch_geometric.nn.conv import MessagePassing

from sarcompile.errors import CompileError
from sarcompile.ir.lowering import declare

# The methods that define what a MessagePassing layer computes: a subclass overriding one
# of them computes something else than the rule of its base class. (PyG generates
# `propagate` and `edge_updater` for every subclass, so those do not tell.)
_DEFINING = ("forward", "message", "aggregate", "update", "message_and_aggregate", "edge_update")


def _name(m: nn.Module) -> str:
    return _name_of(type(m))


def _name_of(t: type) -> str:
    return f"torch_geometric.nn.{t.__name__}" if getattr(gnn, t.__name__, None) is t else f"{t.__module__}.{t.__qualname__}"


def _refuse(m: nn.Module, option: str, value, what_to_do: str) -> CompileError:
    return CompileError(f"{_name(m)} with {option}={value!r} is not supported yet; {what_to_do}")


def _check_common(m: nn.Module, base: type, aggrs: tuple[str, ...] | None = None) -> None:
    """Refuse what no rule covers: subclasses that change the computation (only non-
    MessagePassing ones reach here, see :func:`_unless_overridden`), hooks that would not
    run, lazily initialised parameters, other flows and aggregations."""
    if type(m) is not base:
        changed = [k for k in _DEFINING if getattr(type(m), k, None) is not getattr(base, k, None)]
        if changed:
            raise CompileError(
                f"{_name(m)} subclasses torch_geometric.nn.{base.__name__} but overrides {', '.join(changed)}, "
                "so the rule for the base class does not apply (MessagePassing subclasses get the general "
                "lowering; this one is not a MessagePassing layer): use the base class, or write the layer with "
                "sarcompile's ops (e.g. sc.nn.BatchNorm)"
            )
    hooks = [k for k, v in vars(m).items() if k.endswith("hooks") and ("forward" in k or "backward" in k) and v]
    if hooks:
        raise CompileError(
            f"{_name(m)} has hooks registered ({', '.join(sorted(hooks))}); the compiled program does not run "
            "them: remove them before sc.distribute"
        )
    for p in m.parameters():
        if isinstance(p, nn.parameter.UninitializedParameter):
            raise CompileError(
                f"{_name(m)} has lazily initialised parameters (in_channels=-1); run the eager model once on "
                "example inputs (or give in_channels) before compiling it"
            )
    if isinstance(m, MessagePassing):
        if m.flow != "source_to_target":
            raise _refuse(m, "flow", m.flow, "reverse the graph instead (sc.Graph.from_edges(dst, src, n))")
        if aggrs is not None and (not isinstance(m.aggr, str) or m.aggr not in aggrs):
            raise _refuse(m, "aggr", m.aggr, f"use one of {', '.join(map(repr, aggrs))}")


def _reduce(aggr: str) -> str:
    return {"add": "sum"}.get(aggr, aggr)


@torch.fx.wrap
def _plain_call(x, layer: str, **unsupported):
    """``x``, after checking at run time the call arguments no rule covers (their values
    are not known when the stand-in is traced)."""
    if not isinstance(x, torch.Tensor):
        raise CompileError(
            f"{layer} got node features of type {type(x).__name__}; sarcompile supports one feature tensor "
            "(bipartite (x_src, x_dst) inputs are not supported yet)"
        )
    given = [k for k, v in unsupported.items() if v is not None]
    if given:
        raise CompileError(f"{layer} was called with {', '.join(given)}, which is not supported yet; leave it out")
    return x


def _ends(x, layer: str) -> tuple:
    """``(x_src, x_dst)``: a bipartite layer's two inputs (a relation between two node
    types, as ``HeteroConv`` and ``to_hetero`` call it), or one tensor for both ends."""
    if not isinstance(x, tuple):
        return x, x
    if len(x) != 2 or x[1] is None:
        raise CompileError(
            f"{layer} got {'(x_src, None)' if len(x) == 2 else f'a tuple of {len(x)}'} as node features; sarcompile "
            "takes one tensor, or (x_src, x_dst) with the destination type's rows too (every destination row is "
            "computed on its own worker, from its own features)"
        )
    return x


class _StandIn(nn.Module):
    """A PyG layer written with IR ops. ``self.layer`` is the PyG layer itself: every
    parameter is read from it, never copied."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def extra_repr(self) -> str:
        return f"lowered {_name(self.layer)}"


# The run-time check above is row-local (the residency pass cannot look inside it).
declare(_plain_call, "x")
