"""The compiler's vocabulary: every name a user, a pass, the plan and the runtime share.

Modes, strategies, executors, compressions and residencies are string enums: a member
equals its value (``Mode.SAR == "sar"``) and prints as it (``str(Strategy.REMAT) ==
"remat"``), so options given as plain strings keep working, while the program's code,
the plan and the runtime all read the same member. :meth:`Vocab.parse` turns a user's
string into a member, or a :class:`~sarcompile.errors.CompileError` listing the valid
values.

:class:`LinkPolicy` is the typed value the communication pass writes into an exchanging
op (``comm=LinkPolicy(...)`` in the program's code) and the runtime reads as it is.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from sarcompile.errors import CompileError

__all__ = ["Vocab", "Mode", "Strategy", "Executor", "Compression", "Residency", "Exchange", "LinkPolicy"]


class Vocab(str, enum.Enum):
    """A string enum that prints as its value."""

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)

    @classmethod
    def parse(cls, value: object, what: str) -> "Vocab":
        """``value`` as a member of this enum; ``what`` names the option in the error."""
        try:
            return cls(value)
        except ValueError:
            raise CompileError(f"{what} must be one of {cls.values()}, got {value!r}") from None


class Mode(Vocab):
    """How every exchanging op treats remote blocks (``sc.distribute(model, mode=...)``)."""

    SAR = "sar"  # sequential aggregation; backward re-fetches only what it reads
    STASH = "stash"  # sequential aggregation; remote blocks kept for backward
    ONESHOT = "oneshot"  # all halos fetched at once and kept (domain parallel)


class Strategy(Vocab):
    """What one op does with remote rows; the strategy pass picks it, the plan prints it
    and the runtime does exactly that."""

    DIRECT = "direct"  # backward sends gradients to the owners; nothing fetched again
    REMAT = "remat"  # backward fetches the remote inputs it reads again, block by block
    STASH = "stash"  # remote blocks kept from forward for backward
    ONESHOT = "oneshot"  # all halos fetched at once, kept for backward
    LOCAL = "local"  # no exchange (one machine, or an op that reads local rows only)
    ALLREDUCE = "allreduce"  # a collective: sums over every worker's rows
    PUSH = "push"  # partial results for other workers' rows sent to their owners

    @property
    def keeps_blocks(self) -> bool:
        return self in (Strategy.STASH, Strategy.ONESHOT)

    @property
    def refetches(self) -> bool:
        """Backward fetches remote inputs again (when it reads any)."""
        return self is Strategy.REMAT

    @classmethod
    def halo(cls) -> tuple["Strategy", ...]:
        """The strategies an exchanging op may be given (by the pass or the user)."""
        return (cls.DIRECT, cls.REMAT, cls.STASH, cls.ONESHOT)


class Executor(Vocab):
    """Which kernels run an op with generated kernels."""

    AUTO = "auto"  # Triton on CUDA tensors, torch on CPU tensors
    TORCH = "torch"
    TRITON = "triton"


class Compression(Vocab):
    """Per-row quantization of what crosses workers (Sylvie)."""

    BIT1 = "1bit"
    BIT2 = "2bit"
    INT4 = "int4"
    INT8 = "int8"

    @property
    def bits(self) -> int:
        return {"1bit": 1, "2bit": 2, "int4": 4, "int8": 8}[self.value]

    @classmethod
    def of_bits(cls, bits: int) -> "Compression":
        return next(c for c in cls if c.bits == bits)


class Residency(Vocab):
    """Where the rows of a value live (see :mod:`sarcompile.compile.passes.residency`).

    On N workers a ``NODE`` value holds the rows of the worker's own nodes (the
    destination rows of its aggregations; the same rows are the source rows its peers
    fetch), an ``EDGE`` value the rows of the in-edges of those nodes. Everything else is
    the same on every worker.
    """

    NODE = "node"  # one row per node
    EDGE = "edge"  # one row per edge
    GRAPH = "graph"  # the graph handle, or a graph derived from it
    PARAM = "param"  # a parameter or buffer of the model
    CONST = "const"  # a scalar, shape or other constant: the same on every worker
    ROWS = "rows"  # the number of rows of a NODE/EDGE value: differs between workers

    @property
    def per_row(self) -> bool:
        return self in (Residency.NODE, Residency.EDGE)


class Exchange(Vocab):
    """How an IR op communicates on N workers."""

    NONE = "none"  # reads its worker's rows only
    HALO = "halo"  # reads other workers' rows, block by block (sequential aggregation)
    ALLREDUCE = "allreduce"  # sums over every worker's rows (a collective)
    PUSH = "push"  # reduces onto other workers' rows: sends them its partial results


class LinkPolicy(NamedTuple):
    """How one exchanging op (a *site*) communicates: opt-in staleness and compression
    (see :mod:`sarcompile.runtime.link`). The communication pass writes it into the
    program as a typed value; the runtime reads it as it is."""

    site: int
    name: str
    staleness: int = 1
    bounded: int = 0  # bounded_staleness S; 0 = not pipelined
    bits: int = 0  # 0 = uncompressed
    error_feedback: bool = True

    # Site numbers of an op's second exchange start here (see :meth:`second`).
    SECOND_SITE = 100_000

    @property
    def exact(self) -> bool:
        return self.staleness == 1 and not self.bounded and not self.bits

    def second(self) -> "LinkPolicy":
        """The link of an op's second exchange (an unfused attention's spmm after its
        sddmm): a site of its own, so that the two keep separate caches and residuals."""
        return self._replace(site=self.site + LinkPolicy.SECOND_SITE, name=self.name + ".spmm")

    def kind(self, iteration: int) -> str:
        """``sync`` (exchange now), ``stale`` (cached blocks, no exchange) or ``pipelined``
        (last iteration's exchange) for a training iteration."""
        if self.bounded:
            return "sync" if iteration % self.bounded == 0 else "pipelined"
        if self.staleness > 1:
            return "sync" if iteration % self.staleness == 0 else "stale"
        return "sync"

    def describe(self) -> str:
        """e.g. ``1bit+ef``, ``stale K=5``, ``pipelined S=2, int8+ef``."""
        parts = []
        if self.staleness > 1:
            parts.append(f"stale K={self.staleness}")
        if self.bounded:
            parts.append(f"pipelined S={self.bounded}")
        if self.bits:
            parts.append(str(Compression.of_bits(self.bits)) + ("+ef" if self.error_feedback else " stochastic"))
        return ", ".join(parts)
