"""The exchange every halo op makes: its forward's rounds, what they keep, its backward's.

Strategies (:class:`~sarcompile.ir.vocab.Strategy`, chosen by :mod:`sarcompile.compile.passes.strategy`):

* ``direct``  -- forward frees each remote block after use; backward sends the gradient of
  remote rows straight to their owners without fetching anything (sum/mean, max via the
  saved winner positions, sddmm add/sub). Refused where backward reads remote inputs.
* ``remat``   -- forward frees each remote block; backward fetches the blocks again, one at
  a time, where its gradient formula reads the remote inputs (edge weights, mul/dot).
* ``stash``   -- forward keeps the remote blocks for backward (no re-fetch, more memory).
* ``oneshot`` -- every halo is fetched at once and kept (classic domain parallelism).

Whether backward reads remote inputs is the op definition's rule
(:attr:`~sarcompile.ir.opdef.Halo.reads_remote_in_backward`), the same the plan uses to
count re-fetched bytes: the runtime does what the plan prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from sarcompile.errors import CompileError
from sarcompile.graph.shard import ShardGraph
from sarcompile.ir.vocab import LinkPolicy, Strategy
from sarcompile.runtime.columns import Columns
from sarcompile.runtime.link import LinkState, Wire
from sarcompile.runtime.rounds import Visit, run_rounds

__all__ = ["HaloRounds", "edge_slice", "offsets", "per_row"]


@dataclass(eq=False)
class HaloRounds:
    """One call of a halo op: how it exchanges (``strategy``, ``in_flight`` blocks ahead,
    the ``link`` of training ``iteration``, None and 0 for exact SAR), whether its
    backward fetches the remote inputs again (``refetch``, decided by :meth:`forward`)
    and the remote blocks its forward ``kept`` for backward."""

    shard: ShardGraph
    what: str  # the op as logs and errors name it: "spmm(sum)"; backward's rounds add " backward"
    strategy: Strategy
    in_flight: int
    link: LinkState | None
    iteration: int
    refetch: bool = False
    kept: dict[int, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def open(cls, shard: ShardGraph, what: str, strategy: Strategy | str, in_flight: int,
             comm: LinkPolicy | None) -> HaloRounds:
        """The rounds of one call with link policy ``comm``. Called before the op's
        autograd function runs: whether the call trains is read from autograd's mode,
        which is off inside ``forward``."""
        link, iteration = _link(shard, comm)
        return cls(shard, what, Strategy(strategy), in_flight, link, iteration)

    def forward(self, visit: Visit, fetch: torch.Tensor | Columns | None, *, op, args: dict,
                wants: dict[str, bool]) -> None:
        """Forward's rounds: ``visit(q, block)`` gets each block of ``fetch``'s rows,
        ``in_flight`` posted ahead (``oneshot``: all of them). Decides first whether backward
        re-fetches (``op``'s rule for ``args`` and the inputs whose gradients are
        ``wants``ed), refusing ``direct`` where it would have to; keeps the remote blocks
        for backward where the strategy says so."""
        self.refetch = _refetch(op, self.strategy, args, wants)
        keeps = self.strategy.keeps_blocks

        def keeping(q: int, block: torch.Tensor | None) -> None:
            if keeps and q != self.shard.rank:  # (backward reads its own rows from the op's inputs)
                self.kept[q] = block
            visit(q, block)

        lookahead = max(self.shard.world_size - 1, 1) if self.strategy is Strategy.ONESHOT else self.in_flight
        run_rounds(self.shard, keeping, fetch=fetch, lookahead=lookahead, what=self.what, link=self.link,
                   iteration=self.iteration)

    def backward(self, visit: Visit, fetch: Callable[[], torch.Tensor | Columns | None],
                 push_into: torch.Tensor | Columns | Callable[[], torch.Tensor | Columns] | None,
                 ) -> torch.Tensor | Columns | None:
        """Backward's rounds: ``visit(q, block)`` gets the block fetched again where
        :attr:`refetch` (``fetch()`` made only then), else None (the block is in
        :attr:`kept`, or backward does not read it); what it returns is pushed to ``q``
        and summed into ``push_into`` (see :func:`~sarcompile.runtime.rounds.run_rounds`),
        which is returned. The kept blocks are let go after."""
        out = run_rounds(self.shard, visit, fetch=fetch() if self.refetch else None, push_into=push_into,
                         phase="backward", what=f"{self.what} backward", link=self.link,
                         iteration=self.iteration, lookahead=self.in_flight)
        self.kept = {}
        return out

    def block(self, q: int, local: torch.Tensor | None, fetched: torch.Tensor | None) -> torch.Tensor | None:
        """Block ``q`` as backward reads it: ``local`` for this worker's own, else the one
        forward kept or the one backward ``fetched``."""
        return local if q == self.shard.rank else self.kept.get(q, fetched)


def _refetch(op, strategy: Strategy, args: dict, wants: dict[str, bool]) -> bool:
    """Whether backward fetches the remote inputs again: where the op's definition says
    backward reads them and the strategy did not keep them (``direct`` is refused there)."""
    wanted = frozenset(name for name, want in wants.items() if want)
    reads = op.definition.exchange.reads_remote_in_backward(args, wanted)
    if reads and strategy is Strategy.DIRECT:
        raise CompileError(
            f"{op.definition.describe(args)} with strategy='direct': its backward reads remote inputs, which "
            "'direct' never fetches; use 'remat', 'stash' or 'oneshot'"
        )
    return reads and strategy.refetches


def _link(shard: ShardGraph, policy: LinkPolicy | None) -> tuple[LinkState | None, int]:
    """The site's state and this training iteration's number, or (None, 0) for exact
    SAR: no reduction asked for, one worker, or not training (autograd off)."""
    if policy is None or policy.exact or shard.world_size == 1 or not torch.is_grad_enabled():
        return None, 0
    state = shard.links.get(policy.site)
    if state is None or state.policy != policy:
        state = shard.links[policy.site] = LinkState(policy, Wire(policy, shard.rank))
    state.iteration += 1
    return state, state.iteration


def offsets(shard: ShardGraph) -> list[int]:
    """Start of each block's source rows in the (virtual) concatenation of all halos."""
    out, acc = [], 0
    for b in shard.blocks:
        out.append(acc)
        acc += b.num_src
    return out


def edge_slice(t: torch.Tensor | None, shard: ShardGraph, q: int) -> torch.Tensor | None:
    """Block ``q``'s rows of ``t``, a per-edge tensor in shard order (None stays None)."""
    return None if t is None else t[shard.edge_ptr[q] : shard.edge_ptr[q + 1]]


def per_row(deg: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Degrees (at least 1) shaped to divide ``like``'s rows, in its dtype and on its device."""
    return deg.clamp(min=1).to(like.device, like.dtype).reshape(-1, *([1] * (like.dim() - 1)))
