"""Pass ``lower``: graph-layer modules -> IR ops.

Contract. Expects a GraphModule from :func:`sarcompile.compile.trace.trace`, where every layer
with a lowering rule is a ``call_module`` leaf. Guarantees that afterwards no such leaf
is left: each was replaced, in place, by the IR-op program its rule produces, with the
layer's parameters referenced under their original paths (so gradients land on the
user's parameters). Every inserted node records ``info(node).layer`` (the layer's path) and
``info(node).layer_type``. Each stand-in is traced on the example values the trace computed
for the layer's arguments (``info(node).example``), so its code too may branch on feature
sizes and ``dim()`` (:class:`~sarcompile.compile.trace.ShapeTracer`); a layer's example output
passes to its body's result, for the layers after it; those values are dropped.

The rules live in :mod:`sarcompile.ir.lowering`.
"""

from __future__ import annotations

import inspect

import torch.fx as fx
from torch import nn

from sarcompile.errors import CompileError, SarcompileError
from sarcompile.compile.leaves import ArgLayout, layout_of, leaves_of_call
from sarcompile.ir.lowering import lowering_for
from sarcompile.ir.node_info import info, set_info
from sarcompile.compile.model_state import refuse_state_updates, settled_trace
from sarcompile.compile.trace import UNKNOWN, ShapeTracer
from sarcompile.compile.trace_errors import user_line
from sarcompile.compile.source_lines import source_line, user_file

__all__ = ["lower"]


def _examples(args: list) -> list[list] | None:
    """Per probe, the example value of each argument of a layer's call: what the trace
    computed for it (``info(node).example``, see :class:`~sarcompile.compile.trace.ShapeTracer`), a
    constant as it is; None if the trace computed none."""
    nodes = [n for a in args for n in _nodes_in(a)]
    if not any(info(n).example is not None for n in nodes):
        return None
    count = len(next(info(n).example for n in nodes if info(n).example is not None))

    def value(a, probe: int):
        if any(info(n).example is None for n in _nodes_in(a)):
            return UNKNOWN
        return fx.node.map_arg(a, lambda n: info(n).example[probe])

    return [[value(a, p) for a in args] for p in range(count)]


def _nodes_in(a) -> list[fx.Node]:
    found: list[fx.Node] = []
    fx.node.map_arg(a, found.append)
    return found


def _inline(gm: fx.GraphModule, node: fx.Node, module: nn.Module, lowered: nn.Module) -> None:
    """Replace ``node`` (a call of ``module``) by the traced body of ``lowered``."""
    prefix = node.target
    if lowered is not module:  # a stand-in module: make its own attributes reachable
        prefix = f"{node.target}_lowered"
        gm.add_submodule(prefix, lowered)
    bound = inspect.signature(lowered.forward).bind(*node.args, **node.kwargs)
    bound.apply_defaults()
    # Optional inputs left out are constants, so the layer's `if edge_attr is not None` is decided now.
    constants = {k: None for k, v in bound.arguments.items() if v is None}
    params = list(bound.arguments.values())
    layouts: tuple[ArgLayout, ...] = ()
    if any(isinstance(v, tuple) and _nodes_in(v) for v in params):  # a bipartite layer's (x_src, x_dst)
        layouts = tuple(layout_of(k, v) if isinstance(v, tuple) else ArgLayout(k)
                        for k, v in bound.arguments.items() if v is not None)
        params = leaves_of_call(layouts, bound.arguments)
    what = f"layer {node.target!r} ({type(module).__name__})"
    try:
        body = settled_trace(lowered, what, lambda: ShapeTracer(_examples(params), layouts=layouts),
                             lambda tracer: tracer.trace(lowered, concrete_args=constants or None))
        refuse_state_updates(body, what)
    except SarcompileError as e:
        line = source_line(node)
        if line and e.args and ".py:" not in str(e.args[0]):  # a rule's refusal: the user's line calling the layer
            e.args = (f"{e.args[0]} (at {line})", *e.args[1:])
        raise
    except Exception as e:  # e.g. a TraceError: Python control flow on a row count or a value
        raise CompileError(
            f"its lowering {type(lowered).__name__} cannot be traced ({type(e).__name__}: {e}{user_line(e)}); "
            "Python control flow in it may depend on feature sizes and dim(), not on values or row counts"
        ) from None
    env: dict[fx.Node, object] = {}
    result = None
    placeholder_index = 0
    with gm.graph.inserting_before(node):
        for sub in body.nodes:
            if sub.op == "placeholder":
                env[sub] = params[placeholder_index]
                placeholder_index += 1
                continue
            if sub.op == "output":
                result = fx.map_arg(sub.args[0], lambda n: env[n])
                continue
            # Attributes are addressed from the root now; names say which layer they came from.
            target = f"{prefix}.{sub.target}" if sub.op in ("get_attr", "call_module") else sub.target
            new = gm.graph.create_node(
                sub.op,
                target,
                fx.map_arg(sub.args, lambda n: env[n]),
                fx.map_arg(sub.kwargs, lambda n: env[n]),
                name=f"{node.name}_{sub.name}",
            )
            new.meta.update(sub.meta)
            frame = info(sub).user_frame
            if frame is None or not user_file(frame[0]):  # inside the layer's code: the user's line calling it
                set_info(new, user_frame=info(node).user_frame or frame)
            set_info(new, layer=node.target, layer_type=type(module).__name__)
            env[sub] = new
    _carry_example(node, result)
    node.replace_all_uses_with(result)
    gm.graph.erase_node(node)


def _carry_example(node: fx.Node, result) -> None:
    """The layer's example output (computed in the trace where a later layer takes it) on
    the body's result, which the body's own trace never computed: the later layer's
    stand-in is traced on it."""
    if info(node).example is None:
        return
    values = info(node).example
    if isinstance(result, fx.Node):
        if info(result).example is None:
            set_info(result, example=values)
    elif isinstance(result, (tuple, list)) and all(isinstance(v, (tuple, list)) and len(v) == len(result)
                                                  for v in values):
        for i, r in enumerate(result):
            if isinstance(r, fx.Node) and info(r).example is None:
                set_info(r, example=tuple(v[i] for v in values))


def lower(gm: fx.GraphModule, ctx=None) -> fx.GraphModule:
    """Inline every layer that has a lowering rule (see the module docstring)."""
    changed = True
    while changed:  # a lowered body may itself call layers with rules
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_module":
                continue
            module = gm.get_submodule(node.target)
            lowered = lowering_for(module)
            if lowered is not None:
                try:
                    _inline(gm, node, module, lowered)
                except CompileError as e:  # say which layer of the user's model it was
                    raise CompileError(f"layer {node.target!r}: {e}") from None
                changed = True
    for node in gm.graph.nodes:  # the trace's example values served their purpose; do not keep them alive
        if info(node).example is not None:
            set_info(node, example=None)
    gm.graph.lint()
    gm.recompile()
    return gm
