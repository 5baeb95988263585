"""Results of an aggregation of a constant input, kept across calls.

A model's first layer often aggregates the graph's input features as they are (SAGE and
GraphConv with a widening first layer, GIN): ``spmm(g, x, "mean")`` with ``x`` the input
of the call and nothing that requires its gradient. The graph and ``x`` do not change
between training steps, so neither does the result: the pass :mod:`~sarcompile.compile.passes.reuse`
marks such an aggregation, and :func:`reused` computes it once and hands out the kept
result while its inputs are unchanged -- on N workers without the exchange, every worker
skipping it together.

"Unchanged" is what autograd itself relies on for saved tensors: the same tensor object
at the same version counter (which every in-place write bumps, through any view or
``detach()``), with no grad asked for. A new tensor, an in-place change, or the result
itself written in place by someone downstream, and the result is computed again. Writes
that bypass the version counter (``x.data[...] = ...``, a shared numpy array) bypass
autograd's checks too, and this one: replace the tensor instead.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, Hashable

import torch

from sarcompile.graph.shard import ShardGraph
from sarcompile.dist.collectives import global_max

__all__ = ["reused", "KEPT"]

KEPT = 4  # results a shard keeps at most (oldest dropped first): eval on other features must not pile them up


@dataclass
class _Entry:
    inputs: tuple[weakref.ref, ...]
    versions: tuple[int, ...]
    out: torch.Tensor
    out_version: int

    def holds(self, inputs: tuple[torch.Tensor, ...]) -> bool:
        """Whether this result is still that of ``inputs``: the same tensors at the same
        versions, and the result itself not written since."""
        return (
            len(inputs) == len(self.inputs)
            and all(ref() is t for ref, t in zip(self.inputs, inputs))
            and tuple(t._version for t in inputs) == self.versions
            and self.out._version == self.out_version
        )


def reused(shard: ShardGraph, key: Hashable, inputs: tuple[torch.Tensor, ...],
           compute: Callable[[bool], torch.Tensor]) -> torch.Tensor:
    """The result ``compute(kept)`` gave for the same ``inputs`` on this shard under
    ``key`` (the op and its constant arguments), or a new one. ``kept``: whether it will
    be kept -- no input requires grad, on any worker -- so that ``compute`` can make it
    exactly (a kept result is read for good: an opt-in compressed or stale exchange would
    freeze its error in). On N workers the workers agree first (one all-reduce of two
    flags): one worker's changed input makes all of them compute again, since each one's
    result reads its peers' rows, and all of them exchange alike. ``inputs``: one tensor
    at least."""
    cache: dict = shard.__dict__.setdefault("_reused", {})
    key = (key, *(id(t) for t in inputs))
    entry = cache.get(key)
    graded = any(t.requires_grad for t in inputs)
    hit = not graded and entry is not None and entry.holds(inputs)
    if shard.world_size > 1:
        # on the inputs' device: nccl reduces only device tensors
        miss, graded = (bool(f) for f in global_max(torch.tensor([int(not hit), int(graded)], device=inputs[0].device)))
        hit = not miss
    if hit:
        return entry.out
    cache.pop(key, None)
    out = compute(not graded)
    if not graded and not out.requires_grad:
        while len(cache) >= KEPT:
            cache.pop(next(iter(cache)))
        # A dead input drops its entry (its id may come back with another tensor).
        forget = lambda _ref, key=key: cache.pop(key, None)  # noqa: E731
        cache[key] = _Entry(tuple(weakref.ref(t, forget) for t in inputs), tuple(t._version for t in inputs),
                            out, out._version)
    return out
