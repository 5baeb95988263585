"""Pass ``inplace``: write sums and activations into a temporary nobody keeps.

Contract. Expects a lowered, fused GraphModule. A value is *free* when it is a fresh
tensor (not a view, not an input or parameter), its producer's backward does not read it
(a linear layer, an unweighted sum or mean aggregation, an addition) and the one node
that reads it is the rewritten one. Then

    a + b           -> add_into(a, b)      (a.add_(b) where the result has a's shape and dtype)
    relu(a)         -> relu_into(a)        (torch.relu_; from torch.relu, F.relu, nn.ReLU)
    elu(a, alpha)   -> elu_into(a, alpha)  (F.elu(inplace=True); alpha > 0: backward reads the result)

computes the same values and gradients, without a new ``[n, F]`` buffer per operation:
a GNN layer's ``lin_l(agg) + lin_r(x)``, its bias and its activation all land in the
aggregation's output. Whether ``a`` has the result's shape, and whether a kernel
returned it as a view (autograd forbids writing into a custom Function's view), is only
known when the program runs, so the helpers check then and fall back to out of place.
Autograd's version counters check every rewrite at run time: a value wrongly thought
free makes backward raise, it cannot give a wrong gradient.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from sarcompile.ir import ops
from sarcompile.compile.passes.context import CompileOptions

__all__ = ["activation", "add_into", "elu_into", "inplace", "relu_into"]

_ADD = (operator.add, torch.add)


def _writable(a) -> bool:
    # A custom autograd Function's output that is a view must not be modified in place
    # (autograd refuses: it would bypass the Function's backward); kernels may return one.
    return isinstance(a, torch.Tensor) and a._base is None


def add_into(a: torch.Tensor, b) -> torch.Tensor:
    """``a + b``, written into ``a`` when the result has ``a``'s shape and dtype."""
    if isinstance(b, torch.Tensor):
        fits = torch.broadcast_shapes(a.shape, b.shape) == a.shape and torch.result_type(a, b) == a.dtype
    else:
        fits = isinstance(b, (int, float)) and torch.result_type(a, b) == a.dtype
    return a.add_(b) if fits and _writable(a) else a + b


def relu_into(a: torch.Tensor) -> torch.Tensor:
    return torch.relu_(a) if _writable(a) else torch.relu(a)


def elu_into(a: torch.Tensor, alpha: float) -> torch.Tensor:
    return F.elu(a, alpha, inplace=_writable(a))


def _fresh(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether ``node`` makes a new tensor that its own backward does not read."""
    if node.op == "call_module":
        return type(gm.get_submodule(node.target)) is nn.Linear
    if node.op != "call_function":
        return False
    if node.target is ops.spmm:
        a = ops.registry()[ops.spmm].bind(node.args, node.kwargs)
        return a["reduce"] in ("sum", "mean") and not a["reuse"]  # (a kept result is not this call's own)
    # add_into returns its first argument, which was free when the pass chose it
    return node.target in (*_ADD, add_into, F.linear)


def _free(gm: fx.GraphModule, node, user: fx.Node) -> bool:
    return isinstance(node, fx.Node) and list(node.users) == [user] and _fresh(gm, node)


def activation(gm: fx.GraphModule, node: fx.Node) -> tuple[str, fx.Node, float, bool] | None:
    """(kind, input, alpha, in place) for relu and elu: applied out of place, or written
    into their input by this pass's helpers."""
    if node.op == "call_function" and node.target is relu_into:
        return "relu", node.args[0], 0.0, True
    if node.op == "call_function" and node.target is elu_into:
        return "elu", node.args[0], float(node.args[1]), True
    if node.op == "call_module" and type(gm.get_submodule(node.target)) is nn.ReLU:
        return ("relu", node.args[0], 0.0, False) if not gm.get_submodule(node.target).inplace else None
    if node.op != "call_function" or not node.args:
        return None
    if node.target in (torch.relu, F.relu) and len(node.args) == 1 and not node.kwargs.get("inplace"):
        return "relu", node.args[0], 0.0, False
    if node.target is F.elu and len(node.args) == 1 and not node.kwargs.get("inplace"):
        alpha = node.kwargs.get("alpha", 1.0)
        return ("elu", node.args[0], float(alpha), False) if isinstance(alpha, (int, float)) and alpha > 0 else None
    return None


def inplace(gm: fx.GraphModule, ctx: CompileOptions | None = None) -> fx.GraphModule:
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in _ADD and len(node.args) == 2 and not node.kwargs:
            a, b = node.args
            if not _free(gm, a, node):
                a, b = b, a  # addition commutes (exactly, in floating point too): write into whichever is free
            if a is not b and _free(gm, a, node):
                node.target, node.args = add_into, (a, b)
            continue
        act = activation(gm, node)
        if act is None or act[3] or not _free(gm, act[1], node):
            continue
        kind, x, alpha, _ = act
        with graph.inserting_before(node):
            new = graph.call_function(relu_into, (x,)) if kind == "relu" else graph.call_function(elu_into, (x, alpha))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return gm
