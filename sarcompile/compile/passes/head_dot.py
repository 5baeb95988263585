"""Pass ``head_dot``: an attention layer's per-head scores without ``[n, H, C]`` products.

Contract. Expects the GraphModule after ``accumulate``. Rewrites

    (h * att).sum(-1)        (att a parameter; torch.sum, .sum, dim=-1 alike)

whose product nothing else reads, as ``head_dot(h, att)``: the same values (each row's
sum over channels, as before) and gradients (``d_att`` summed over rows in blocks, so it
rounds differently). GAT's ``a_src``/``a_dst`` in forward, and above all in backward,
made a product as large as ``h`` each: autograd's ``mul`` backward makes ``d * h`` before
summing it to ``att``'s shape, next to the ``[n, H, C]`` gradient of ``h``. Here forward and
the parameter's gradient work a bounded block of rows at a time; only ``h``'s gradient is
whole. Inputs of other shapes (``att`` not ``[1, H, C]`` or ``[H, C]`` against ``h [n, H,
C]``) run the plain ops, as before the pass.
"""

from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx
from torch.autograd.function import once_differentiable

from sarcompile.codegen.torch_kernels import row_blocks
from sarcompile.compile.passes.context import CompileOptions

__all__ = ["head_dot"]


class _HeadDot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, att):
        ctx.save_for_backward(h if ctx.needs_input_grad[1] else None, att)
        out = h.new_empty(h.shape[:2])
        for r in row_blocks(h):
            out[r] = (h[r] * att).sum(-1)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d):
        h, att = ctx.saved_tensors
        d_h = d.unsqueeze(-1) * att if ctx.needs_input_grad[0] else None
        d_att = None
        if ctx.needs_input_grad[1]:
            d_att = torch.zeros_like(att, dtype=torch.promote_types(d.dtype, h.dtype))
            for r in row_blocks(h):
                d_att += (d[r].unsqueeze(-1) * h[r]).sum(0).reshape(att.shape)
            d_att = d_att.to(att.dtype)
        return d_h, d_att


def head_dot_op(h: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    """``(h * att).sum(-1)`` for ``h [n, H, C]`` and ``att [1, H, C]`` or ``[H, C]``."""
    fits = (
        isinstance(h, torch.Tensor) and isinstance(att, torch.Tensor) and h.dim() == 3
        and tuple(att.shape[-2:]) == tuple(h.shape[1:]) and att.dim() in (2, 3) and att.numel() == math.prod(h.shape[1:])
        and h.dtype == att.dtype and h.layout is torch.strided and att.layout is torch.strided
    )
    return _HeadDot.apply(h, att) if fits else (h * att).sum(-1)


def _sum_last(node: fx.Node) -> fx.Node | None:
    """The summed value of ``x.sum(-1)`` / ``torch.sum(x, -1)`` / ``dim=-1``, else None."""
    if node.op == "call_method" and node.target == "sum" or node.op == "call_function" and node.target is torch.sum:
        args, kwargs = node.args, dict(node.kwargs)
        dim = args[1] if len(args) > 1 else kwargs.pop("dim", None)
        if len(args) <= 2 and not kwargs and dim in (-1, (-1,), [-1]):
            return args[0] if isinstance(args[0], fx.Node) else None
    return None


def head_dot(gm: fx.GraphModule, ctx: CompileOptions | None = None) -> fx.GraphModule:
    graph = gm.graph
    for node in list(graph.nodes):
        prod = _sum_last(node)
        if prod is None or len(prod.users) != 1 or prod.op != "call_function" or prod.target not in (
            operator.mul, torch.mul
        ) or len(prod.args) != 2 or prod.kwargs:
            continue
        h, att = prod.args
        if isinstance(h, fx.Node) and h.op == "get_attr":
            h, att = att, h
        if not (isinstance(h, fx.Node) and isinstance(att, fx.Node) and att.op == "get_attr"):
            continue
        with graph.inserting_before(node):
            new = graph.call_function(head_dot_op, (h, att))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        graph.erase_node(prod)
    graph.lint()
    gm.recompile()
    return gm
