"""Partitioned ops over every worker's rows, made of all-reduces: the largest edge value
(:func:`~sarcompile.ir.ops.edge_max`), the mean of node rows (:func:`~sarcompile.ir.ops.node_mean`)
and batch norm's statistics (:func:`~sarcompile.ir.ops.batch_norm`)."""

from __future__ import annotations

import math

import torch

from sarcompile.dist.collectives import global_max, global_sum
from sarcompile.ir import ops as ir

__all__ = ["sar_edge_max", "sar_node_mean", "global_batch_norm"]


class _GlobalMax(torch.autograd.Function):
    """The largest element over every worker's rows; its gradient split evenly among the
    elements equal to it on all workers (torch's rule for ``max()``). Each worker's loss
    reaches the maximum from its own rows: the gradient arriving is all-reduced first."""

    @staticmethod
    def forward(ctx, e):
        local = e.detach().max() if e.numel() else e.new_tensor(float("-inf"))
        top = global_max(local, phase="edge_max")
        ties = e.detach() == top
        ctx.save_for_backward(ties)
        ctx.count = float(global_sum(ties.sum().double(), phase="edge_max"))
        return top

    @staticmethod
    def backward(ctx, g):
        (ties,) = ctx.saved_tensors
        total = global_sum(g.double(), phase="edge_max").to(g.dtype)
        return ties.to(g.dtype) * (total / ctx.count)


@ir.edge_max.definition.implement
def sar_edge_max(e: torch.Tensor) -> torch.Tensor:
    """Partitioned :func:`sarcompile.ir.ops.edge_max`: two scalars all-reduced."""
    return _GlobalMax.apply(e)


class _GlobalMean(torch.autograd.Function):
    """The mean over every worker's rows (float64 sums and the row count all-reduced);
    backward all-reduces the gradient arriving, each worker's loss having reached the mean
    from its own rows only, and gives every row its share."""

    @staticmethod
    def forward(ctx, x):
        width = math.prod(x.shape[1:])
        sums = global_sum(torch.cat([x.detach().double().reshape(x.shape[0], width).sum(0),
                                     torch.tensor([float(x.shape[0])], dtype=torch.float64, device=x.device)]),
                          phase="node_mean")
        ctx.count = max(float(sums[-1]), 1.0)
        ctx.shape = x.shape
        return (sums[:-1] / ctx.count).reshape(x.shape[1:]).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        total = global_sum(g.double(), phase="node_mean") / ctx.count
        return total.to(g.dtype).expand(ctx.shape).contiguous()


@ir.node_mean.definition.implement
def sar_node_mean(x: torch.Tensor) -> torch.Tensor:
    """Partitioned :func:`sarcompile.ir.ops.node_mean`: one row's sums and the count all-reduced."""
    return _GlobalMean.apply(x)


class _GlobalBatchNorm(torch.autograd.Function):
    """Batch norm whose statistics are sums over every worker's rows.

    Sums are taken in float64 and all-reduced, so the result does not depend on how the
    nodes are split (up to the final rounding to the input's dtype). The variance is
    two-pass (sum of squared deviations from the global mean), as stable as one machine's.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum: float, eps: float):
        xd = x.detach().double()
        first = global_sum(torch.cat([xd.sum(0), xd.new_full((1,), x.shape[0])]), phase="batch_norm")
        count = float(first[-1])
        if count <= 1:
            raise ValueError(f"batch norm in training needs more than 1 node in all, got {int(count)}")
        mean = first[:-1] / count
        var = global_sum(((xd - mean) ** 2).sum(0), phase="batch_norm") / count
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():  # torch keeps the unbiased variance in the running statistics
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_((var * count / (count - 1)).to(running_var.dtype), alpha=momentum)
        y = ((xd - mean) * invstd).to(x.dtype)
        if weight is not None:
            y = y * weight
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.count = count
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd = ctx.saved_tensors
        xhat = (x.double() - mean) * invstd
        g = dy.double()
        if weight is not None:
            g = g * weight.double()
        # dx = invstd * (g - mean(g) - xhat * mean(g * xhat)), the means over all workers' rows
        sums = global_sum(torch.cat([g.sum(0), (g * xhat).sum(0)]), phase="batch_norm")
        c = x.shape[1]
        dx = invstd * (g - sums[:c] / ctx.count - xhat * (sums[c:] / ctx.count))
        # Parameter gradients stay local sums: sync_gradients adds the workers' shares.
        dw = (dy.double() * xhat).sum(0).to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        db = dy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx.to(x.dtype), dw, db, None, None, None, None


@ir.batch_norm.definition.implement
def global_batch_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    momentum: float,
    eps: float,
) -> torch.Tensor:
    """Training-mode batch norm of ``x`` (this worker's rows) with statistics over all workers."""
    return _GlobalBatchNorm.apply(x, weight, bias, running_mean, running_var, momentum, eps)
