"""The IR: the few sparse primitives all message passing is written with.

=====================================  =========================================================
``spmm(g, x, reduce, edge_weight)``      ``out[v] = reduce over u->v of w_uv * x[u]``; reduce
                                         in sum, mean, max (empty neighbourhood gives 0)
``sddmm(g, a, b, op)``                   per edge u->v: ``a[u] op b[v]``; op in add, sub, mul,
                                         dot (dot sums the last dim)
``edge_softmax(g, e)``                   softmax of per-edge scores over the in-edges of each v
``edge_dropout(g, e, p, salt)``          dropout of edge values with a mask keyed by edge id
``attention(g, h, a_src, a_dst, ...)``   the fused chain sddmm(add) -> leaky_relu ->
                                         edge_softmax -> [edge_dropout] -> weighted spmm;
                                         the fuse pass produces it
``batch_norm(x, weight, bias, ...)``     batch norm over all nodes, on every worker
``message_passing(g, fn, x, e, reduce)`` ``out[v] = reduce over u->v of fn(x[u], x[v], e_uv)``
                                         for any message function ``fn`` (a module)
=====================================  =========================================================

Each op is registered once with :func:`ir_op`: that makes it a single node when traced
with ``torch.fx`` (with any tracer, wherever the op was imported from, since the op
itself notices proxy arguments) and records how it is partitioned and what its backward
reads, which is all the passes need to know about it.

Edge tensors are in the graph's edge order: the order edges were given for a
:class:`~sarcompile.graph.Graph`, shard order for a worker's ``part.graph``.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx

from .errors import GraphError
from .vocab import Residency
from .graph import Graph
from .runtime import ops as runtime_ops
from .runtime.link import LinkPolicy
from .runtime.shard import ShardGraph

__all__ = [
    "OpDef",
    "ir_op",
    "registry",
    "spmm",
    "sddmm",
    "edge_softmax",
    "edge_dropout",
    "attention",
    "batch_norm",
    "message_passing",
    "REDUCES",
    "SDDMM_OPS",
]

REDUCES = ("sum", "mean", "max")
SDDMM_OPS = ("add", "sub", "mul", "dot")


@dataclass(frozen=True)
class OpDef:
    """What the compiler knows about one IR op."""

    name: str
    fn: Callable  # the public op: the target of its fx node
    communicates: bool  # reads other workers' rows: the partition pass gives it a strategy
    collective: bool  # reduces over every worker's nodes (strategy "allreduce"), no halo
    reads_remote_in_backward: Callable[[dict[str, Any]], bool]  # from the op's bound arguments
    signature: inspect.Signature
    output: Residency  # residency of the result
    inputs: dict[str, Residency]  # residency each row-carrying argument must have

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The op's arguments by name, defaults filled in."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)


_REGISTRY: dict[Callable, OpDef] = {}


def registry() -> dict[Callable, OpDef]:
    """Every IR op, keyed by the function an fx node calls."""
    return dict(_REGISTRY)


def _has_proxy(values) -> torch.fx.Proxy | None:
    for v in values:
        if isinstance(v, torch.fx.Proxy):
            return v
    return None


def ir_op(
    *,
    communicates: bool,
    reads_remote_in_backward: Callable[[dict[str, Any]], bool],
    check: Callable,
    output: Residency,
    inputs: dict[str, Residency],
    collective: bool = False,
):
    """Register an IR op. ``check(**arguments)`` validates the constant arguments at trace
    time, so a wrong ``reduce`` fails where the model is written, not on a worker.

    An op that ``communicates`` takes a keyword ``strategy`` (see
    :mod:`sarcompile.runtime.ops`), which the partition and strategy passes set; it only
    matters on a worker's shard, as does ``comm`` (stale or compressed exchange, see
    :mod:`sarcompile.runtime.link`), which the communication pass sets. An op that runs
    generated kernels takes a keyword ``executor``, which the kernels pass sets. A ``collective`` op communicates by all-reduce rather
    than by halo exchange; its strategy is always ``"allreduce"``."""

    def register(fn: Callable) -> Callable:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def op(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            check(**{k: v for k, v in bound.arguments.items() if k not in ("strategy", "executor", "comm")})
            proxy = _has_proxy(list(args) + list(kwargs.values()))
            if proxy is not None:
                return proxy.tracer.create_proxy("call_function", op, args, kwargs)
            return fn(*args, **kwargs)

        _REGISTRY[op] = OpDef(fn.__name__, op, communicates, collective, reads_remote_in_backward, sig, output, inputs)
        return op

    return register


def _graph_kind(g: Any) -> None:
    if not isinstance(g, (Graph, ShardGraph, torch.fx.Proxy)):
        raise GraphError(
            f"the first argument of an IR op must be a sarcompile Graph or a worker's part.graph, "
            f"got {type(g).__name__}; build one with sc.Graph.from_edges / from_pyg / from_networkx"
        )


def _check_spmm(g, x, reduce, edge_weight) -> None:
    _graph_kind(g)
    if reduce not in REDUCES:
        raise GraphError(f"spmm reduce must be one of {REDUCES}, got {reduce!r}")
    if reduce == "max" and edge_weight is not None:
        raise GraphError("spmm(reduce='max') takes no edge_weight; scale the features before the max instead")


def _check_sddmm(g, a, b, op) -> None:
    _graph_kind(g)
    if op not in SDDMM_OPS:
        raise GraphError(f"sddmm op must be one of {SDDMM_OPS}, got {op!r}")


def _check_softmax(g, e) -> None:
    _graph_kind(g)


def _check_rows(g, t: torch.Tensor, what: str, rows: int) -> None:
    if t.shape[0] != rows:
        raise GraphError(f"{what} has {t.shape[0]} rows but the graph needs {rows}")


def _to_csr_order(g: Graph, t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t[g.csr_perm]


def _from_csr_order(g: Graph, t: torch.Tensor) -> torch.Tensor:
    return t[g.csr_inverse_perm]


@ir_op(communicates=True, reads_remote_in_backward=lambda a: a["edge_weight"] is not None, check=_check_spmm,
       output=Residency.NODE, inputs={"x": Residency.NODE, "edge_weight": Residency.EDGE})
def spmm(
    g,
    x: torch.Tensor,
    reduce: str = "sum",
    edge_weight: torch.Tensor | None = None,
    *,
    strategy: str = "direct",
    executor: str = "auto",
    comm: str = "",
) -> torch.Tensor:
    """Aggregate ``x`` over in-edges: ``out[v] = reduce_{u->v} w_uv * x[u]``."""
    _check_rows(g, x, "x", g.num_nodes)
    if edge_weight is not None:
        _check_rows(g, edge_weight, "edge_weight", g.num_edges)
    if isinstance(g, Graph):
        return runtime_ops.sar_spmm(g.shard(), x, reduce, _to_csr_order(g, edge_weight), executor=executor)
    return runtime_ops.sar_spmm(g, x, reduce, edge_weight, strategy=strategy, executor=executor, comm=comm)


@ir_op(communicates=True, reads_remote_in_backward=lambda a: a["op"] in ("mul", "dot"), check=_check_sddmm,
       output=Residency.EDGE, inputs={"a": Residency.NODE, "b": Residency.NODE})
def sddmm(
    g, a: torch.Tensor, b: torch.Tensor, op: str = "add", *, strategy: str = "direct", comm: str = ""
) -> torch.Tensor:
    """One value per edge u->v from ``a[u]`` and ``b[v]``."""
    _check_rows(g, a, "a", g.num_nodes)
    _check_rows(g, b, "b", g.num_nodes)
    if isinstance(g, Graph):
        return _from_csr_order(g, runtime_ops.sar_sddmm(g.shard(), a, b, op))
    return runtime_ops.sar_sddmm(g, a, b, op, strategy=strategy, comm=comm)


@ir_op(communicates=False, reads_remote_in_backward=lambda a: False, check=_check_softmax,
       output=Residency.EDGE, inputs={"e": Residency.EDGE})
def edge_softmax(g, e: torch.Tensor) -> torch.Tensor:
    """Softmax of edge scores over the in-edges of each node. All in-edges of a node live
    on its worker, so this never communicates."""
    _check_rows(g, e, "e", g.num_edges)
    dst = g.dst_index.to(e.device)
    idx = dst.reshape(-1, *([1] * (e.dim() - 1))).expand_as(e)
    peak = torch.full((g.num_dst, *e.shape[1:]), float("-inf"), dtype=e.dtype, device=e.device)
    peak = peak.scatter_reduce(0, idx, e.detach(), "amax")
    z = torch.exp(e - peak[dst])
    total = torch.zeros_like(peak).index_add_(0, dst, z)
    return z / total[dst]


def _check_edge_dropout(g, e, p, salt) -> None:
    _graph_kind(g)
    if not 0.0 <= p < 1.0:
        raise GraphError(f"edge dropout probability must be in [0, 1), got {p}")


@ir_op(communicates=False, reads_remote_in_backward=lambda a: False, check=_check_edge_dropout,
       output=Residency.EDGE, inputs={"e": Residency.EDGE})
def edge_dropout(g, e: torch.Tensor, p: float, salt: torch.Tensor) -> torch.Tensor:
    """Zero each edge value with probability ``p`` (scaling the rest by ``1/(1-p)``), with a
    mask keyed by global edge id, head and ``salt``: the same on any number of workers."""
    _check_rows(g, e, "e", g.num_edges)
    if p == 0.0:
        return e
    heads = e[0].numel() if e.shape[0] else 1
    keep = runtime_ops.edge_keep(g.edge_ids, heads, p, salt, e.dtype)
    return e * keep.reshape(e.shape)


def _check_attention(g, h, a_src, a_dst, negative_slope, dropout, salt) -> None:
    _graph_kind(g)
    if not 0.0 <= dropout < 1.0:
        raise GraphError(f"attention dropout must be in [0, 1), got {dropout}")


def _fusable_shapes(h: torch.Tensor, a_src: torch.Tensor, a_dst: torch.Tensor) -> bool:
    """One score per edge and head: ``a [n]`` with ``h [n, C]``, or ``a [n, H]`` with ``h [n, H, C]``."""
    if a_src.shape != a_dst.shape or h.dim() != a_src.dim() + 1:
        return False
    return a_src.dim() == 1 or (a_src.dim() == 2 and a_src.shape[1] == h.shape[1])


@ir_op(communicates=True, reads_remote_in_backward=lambda a: True, check=_check_attention,
       output=Residency.NODE, inputs={"h": Residency.NODE, "a_src": Residency.NODE, "a_dst": Residency.NODE})
def attention(
    g,
    h: torch.Tensor,
    a_src: torch.Tensor,
    a_dst: torch.Tensor,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    salt: torch.Tensor | None = None,
    *,
    strategy: str = "remat",
    executor: str = "auto",
    comm: str = "",
) -> torch.Tensor:
    """``spmm(g, h, "sum", edge_dropout(edge_softmax(leaky_relu(sddmm(g, a_src, a_dst, "add")))))``
    in one op that never keeps a per-edge tensor (see :mod:`sarcompile.runtime.ops`)."""
    for name, t in (("h", h), ("a_src", a_src), ("a_dst", a_dst)):
        _check_rows(g, t, name, g.num_nodes)
    salt = torch.zeros((), dtype=torch.long) if salt is None else salt
    if not _fusable_shapes(h, a_src, a_dst):  # e.g. one score per edge shared by all heads
        score = torch.nn.functional.leaky_relu(sddmm(g, a_src, a_dst, "add", comm=comm), negative_slope)
        weight = edge_softmax(g, score)
        if dropout:
            weight = edge_dropout(g, weight, dropout, salt)
        return spmm(g, h, "sum", edge_weight=weight, strategy=strategy, executor=executor, comm=LinkPolicy.second(comm))
    single = a_src.dim() == 1
    if single:
        h, a_src, a_dst = h.unsqueeze(1), a_src.unsqueeze(1), a_dst.unsqueeze(1)
    shard = g.shard() if isinstance(g, Graph) else g
    out = runtime_ops.sar_attention(
        shard, h, a_src, a_dst, negative_slope, dropout, salt, strategy=strategy, executor=executor, comm=comm
    )
    return out.squeeze(1) if single else out


def _check_batch_norm(x, weight, bias, running_mean, running_var, num_batches_tracked, training, momentum, eps) -> None:
    if momentum is not None and not 0.0 <= momentum <= 1.0:
        raise GraphError(f"batch_norm momentum must be in [0, 1] or None, got {momentum}")


@ir_op(communicates=True, collective=True, reads_remote_in_backward=lambda a: False, check=_check_batch_norm,
       output=Residency.NODE, inputs={"x": Residency.NODE})
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
    strategy: str = "local",
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
    if strategy == "local":
        return torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias, True, factor or 0.0, eps)
    return runtime_ops.global_batch_norm(x, weight, bias, running_mean, running_var, factor or 0.0, eps)


def _check_message_passing(g, fn, x, edge_attr, reduce) -> None:
    _graph_kind(g)
    if reduce not in REDUCES:
        raise GraphError(f"message_passing reduce must be one of {REDUCES}, got {reduce!r}")
    if not isinstance(fn, torch.nn.Module):
        raise GraphError(
            f"message_passing needs the message function as a torch.nn.Module (a submodule of the model), "
            f"got {type(fn).__name__}; wrap it in a module whose forward(x_j, x_i, edge_attr) returns the messages"
        )
    for m in fn.modules():  # backward recomputes the messages: they must come out the same
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            raise GraphError(
                f"the message function {type(fn).__name__} contains {type(m).__name__}, which would draw a "
                "different mask when backward recomputes the messages; apply dropout outside it"
            )


@ir_op(communicates=True, reads_remote_in_backward=lambda a: True, check=_check_message_passing,
       output=Residency.NODE, inputs={"x": Residency.NODE, "edge_attr": Residency.EDGE})
def message_passing(
    g,
    fn: torch.nn.Module,
    x: torch.Tensor,
    edge_attr: torch.Tensor | None = None,
    reduce: str = "sum",
    *,
    strategy: str = "remat",
    comm: str = "",
) -> torch.Tensor:
    """General message passing: ``out[v] = reduce_{u->v} fn(x[u], x[v], edge_attr[e])``.

    ``fn(x_j, x_i, edge_attr)`` maps per-edge rows (source, destination, edge features or
    None) to per-edge messages ``[E, ...]`` -- any torch code, parameters included. It runs
    block by block and no message is kept: backward re-fetches each block and recomputes
    its messages (SAR's rematerialization), so ``fn`` must be deterministic. An empty
    neighbourhood gives 0; max picks, among equal messages, the edge with the smallest id.
    """
    _check_rows(g, x, "x", g.num_nodes)
    if edge_attr is not None:
        _check_rows(g, edge_attr, "edge_attr", g.num_edges)
    if isinstance(g, Graph):
        return runtime_ops.sar_message(g.shard(), fn, x, _to_csr_order(g, edge_attr), reduce)
    return runtime_ops.sar_message(g, fn, x, edge_attr, reduce, strategy=strategy, comm=comm)
