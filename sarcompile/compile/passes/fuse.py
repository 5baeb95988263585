"""Pass ``fuse``: the attention chain -> one ``attention`` op.

Contract. Expects a lowered GraphModule (IR ops as ``call_function`` nodes). Finds every
chain, on one graph value ``g``,

    sddmm(g, a_src, a_dst, "add") -> [+ a_edge] -> [leaky_relu(., slope)] -> edge_softmax(g, .)
        -> [edge_dropout(g, ., p, salt)] -> spmm(g, h, "sum", edge_weight=.)

whose intermediate per-edge values have no other user, and replaces it by
``attention(g, h, a_src, a_dst, slope, p, salt, a_edge)``. The leaky ReLU may be
``F.leaky_relu``, ``torch.nn.LeakyReLU`` or absent (slope 1: the identity). ``a_edge``
(GATConv's edge-feature scores) is the other operand of a ``+`` (``operator.add`` or
``torch.add``, either order) computed from the program's inputs; one computed from
parameters and constants alone is no per-edge tensor (it broadcasts), and that chain is
left alone. Guarantees the
program computes the same values; the fused op never keeps a per-edge tensor, and on a
shard it reads every remote block once in forward and once in backward. Chains whose
edge values are used elsewhere are left alone (their per-edge tensors are needed anyway).
The fused node records ``info(node).fused`` (the names of the nodes it replaced).
"""

from __future__ import annotations

import inspect
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from sarcompile.ir import ops
from sarcompile.compile.passes.context import CompileOptions
from sarcompile.ir.node_info import set_info

__all__ = ["fuse"]

_LEAKY = inspect.signature(F.leaky_relu)
_ADD = (operator.add, torch.add)


def _bound(node: fx.Node) -> dict:
    return ops.registry()[node.target].bind(node.args, node.kwargs)


def _is(node, op) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target is op


def _only_user(node: fx.Node, user: fx.Node) -> bool:
    return list(node.users) == [user]


def _leaky_slope(gm: fx.GraphModule, node: fx.Node) -> tuple[float, fx.Node] | None:
    """(slope, input) if ``node`` is a leaky ReLU with a constant slope."""
    if node.op == "call_function" and node.target is F.leaky_relu:
        args = _LEAKY.bind(*node.args, **node.kwargs)
        args.apply_defaults()
        slope = args.arguments["negative_slope"]
        return (float(slope), args.arguments["input"]) if isinstance(slope, (int, float)) else None
    if node.op == "call_module" and isinstance(gm.get_submodule(node.target), torch.nn.LeakyReLU):
        return float(gm.get_submodule(node.target).negative_slope), node.args[0]
    return None


def _from_inputs(node: fx.Node) -> bool:
    """Whether ``node``'s value is computed from any input of the program."""
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n.op == "placeholder":
            return True
        if n not in seen:
            seen.add(n)
            todo.extend(n.all_input_nodes)
    return False


def _edge_term(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(the sddmm, the edge term) if ``node`` is ``sddmm(add) + a_edge`` in either order."""
    if node.op != "call_function" or node.target not in _ADD or len(node.args) != 2 or node.kwargs:
        return None
    for score, other in (node.args, node.args[::-1]):
        add = _is(score, ops.sddmm) and _bound(score)["op"] == "add"
        if add and isinstance(other, fx.Node) and _from_inputs(other):
            return score, other
    return None


def _match(gm: fx.GraphModule, agg: fx.Node) -> dict | None:
    """The chain ending in the weighted ``spmm`` node ``agg``, or None."""
    a = _bound(agg)
    g, weight = a["g"], a["edge_weight"]
    if a["reduce"] != "sum" or not isinstance(weight, fx.Node) or not _only_user(weight, agg):
        return None
    chain, dropout, salt = [], 0.0, None
    if _is(weight, ops.edge_dropout):
        d = _bound(weight)
        if d["g"] is not g or not isinstance(d["p"], (int, float)):
            return None
        chain.append(weight)
        dropout, salt, weight = float(d["p"]), d["salt"], d["e"]
        if not _only_user(weight, chain[-1]):
            return None
    if not _is(weight, ops.edge_softmax) or _bound(weight)["g"] is not g:
        return None
    chain.append(weight)
    score = _bound(weight)["e"]
    if not isinstance(score, fx.Node) or not _only_user(score, weight):
        return None
    slope = 1.0  # no activation: leaky_relu with slope 1 is the identity
    leaky = _leaky_slope(gm, score)
    if leaky is not None:
        chain.append(score)
        slope, score = leaky
        if not isinstance(score, fx.Node) or not _only_user(score, chain[-1]):
            return None
    a_edge = None
    term = _edge_term(score)
    if term is not None:
        chain.append(score)
        score, a_edge = term
        if not _only_user(score, chain[-1]):
            return None
    if not _is(score, ops.sddmm):
        return None
    s = _bound(score)
    if s["g"] is not g or s["op"] != "add":
        return None
    chain.append(score)
    return {"g": g, "h": a["x"], "a_src": s["a"], "a_dst": s["b"], "slope": slope, "dropout": dropout,
            "salt": salt, "a_edge": a_edge, "chain": chain}


def fuse(gm: fx.GraphModule, ctx: CompileOptions | None = None) -> fx.GraphModule:
    for agg in [n for n in gm.graph.nodes if _is(n, ops.spmm)]:
        m = _match(gm, agg)
        if m is None:
            continue
        with gm.graph.inserting_before(agg):
            fused = gm.graph.call_function(
                ops.attention,
                (m["g"], m["h"], m["a_src"], m["a_dst"], m["slope"], m["dropout"], m["salt"], m["a_edge"]),
            )
        fused.meta.update(agg.meta)
        set_info(fused, fused=[n.name for n in reversed(m["chain"])] + [agg.name])
        agg.replace_all_uses_with(fused)
        gm.graph.erase_node(agg)
        for node in m["chain"]:  # from the weight back to the scores: each is unused now
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm
