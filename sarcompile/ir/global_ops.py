"""The IR ops over the rows of all workers, whose few numbers are all-reduced: ``edge_max``
(the largest per-edge value), ``node_mean`` (the mean row) and ``batch_norm`` (statistics
over every node). Each is a value one machine computes the same. See
:mod:`sarcompile.ir.ops`.
"""

from __future__ import annotations

import math

import torch

from sarcompile.errors import GraphError
from sarcompile.graph.graph import Graph
from sarcompile.ir.op_common import CONST, EDGE, NODE, _check_graph, _check_rows
from sarcompile.ir.opdef import AllReduce, Args, ir_op
from sarcompile.ir.vocab import Strategy


# ------------------------------------------------------------------------ edge_max, node_mean
@ir_op(
    check=_check_graph,
    output=CONST,
    inputs={"e": EDGE},
    # the maximum, then the number of edges that reach it (gradients are split among them);
    # in backward the gradient arriving at the maximum, summed over the workers
    exchange=AllReduce(lambda a: (a["e"].element_size() + 8, 8 if a["e"].requires_grad else 0)),
    saved=lambda a: "where the maximum is [E] bool",
)
def edge_max(g, e: torch.Tensor, *, strategy: Strategy = Strategy.LOCAL) -> torch.Tensor:
    """The largest element of the per-edge tensor ``e`` over the edges of all workers, as
    ``e.max()`` on one machine: a 0-dim tensor, the same on every worker. Its gradient is
    split evenly among the elements equal to it, wherever they live, as torch splits it."""
    _check_rows(g, e, "e", g.num_edges)
    if isinstance(g, Graph):
        return e.max()
    return edge_max.definition.run(e)


def _check_node_mean(x) -> None:
    """No constant arguments to check (that ``x`` is per-node rows, the residency pass checks)."""


@ir_op(
    check=_check_node_mean,
    output=CONST,
    inputs={"x": NODE},
    # the sums of a row and the row count, in float64; in backward the gradient's sum
    exchange=AllReduce(lambda a: ((math.prod(a["x"].shape[1:]) + 1) * 8,
                                  math.prod(a["x"].shape[1:]) * 8 if a["x"].requires_grad else 0)),
    saved=lambda a: "row count",
)
def node_mean(x: torch.Tensor, *, strategy: Strategy = Strategy.LOCAL) -> torch.Tensor:
    """The mean of ``x`` over its rows -- every node of its type, on all workers -- as
    ``x.mean(0)`` on one machine (0 where there are no rows at all): a value without rows,
    the same on every worker (PyG's HANConv averages its semantic attention scores so).

    Summed in float64 (on N workers all-reduced with the row count), so the result hardly
    depends on how the nodes are split; on N workers backward all-reduces the gradient
    arriving (each worker's loss reaches the mean from its own rows only), then gives
    every row its share."""
    if strategy == Strategy.LOCAL:
        return (x.double().sum(0) / max(x.shape[0], 1)).to(x.dtype)
    return node_mean.definition.run(x)


# ---------------------------------------------------------------------------- batch_norm
def _check_batch_norm(x, weight, bias, running_mean, running_var, num_batches_tracked, training, momentum, eps) -> None:
    if momentum is not None and not 0.0 <= momentum <= 1.0:
        raise GraphError(f"batch_norm momentum must be in [0, 1] or None, got {momentum}")


def _batch_norm_bytes(a: Args) -> tuple[int, int]:
    """float64 sums: the mean and count, then the variance; in backward two per channel."""
    c = a["x"].shape[1]
    return (c + 1 + c) * 8, (2 * c * 8 if a["x"].requires_grad else 0)


@ir_op(
    check=_check_batch_norm,
    output=NODE,
    inputs={"x": NODE},
    exchange=AllReduce(_batch_norm_bytes),
    saved=lambda a: "input (reference)",
)
def batch_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    num_batches_tracked: torch.Tensor | None,
    training: bool,
    momentum: float | None,
    eps: float,
    *,
    strategy: Strategy = Strategy.LOCAL,
) -> torch.Tensor:
    """Batch norm of node features over the nodes of the whole graph, as
    ``torch.nn.BatchNorm1d`` computes it on one machine (running statistics included).

    On a worker's shard (``strategy="allreduce"``, set by the partition pass) the batch
    statistics and, in backward, the sums the input gradient needs are all-reduced, so N
    workers normalise exactly as one machine does. In eval mode the running statistics
    are used and nothing is communicated.
    """
    if x.dim() != 2:
        raise GraphError(f"batch_norm takes node features [num_nodes, channels], got shape {tuple(x.shape)}")
    if not training and running_mean is not None:
        return torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias, False, 0.0, eps)
    factor = 0.0 if momentum is not None else None
    if running_mean is not None and num_batches_tracked is not None:
        with torch.no_grad():
            num_batches_tracked.add_(1)
        factor = momentum if momentum is not None else 1.0 / float(num_batches_tracked)
    if strategy == Strategy.LOCAL:
        return torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias, True, factor or 0.0, eps)
    return batch_norm.definition.run(x, weight, bias, running_mean, running_var, factor or 0.0, eps)
