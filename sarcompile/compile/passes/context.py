"""What every pass may read: the user's compile options, and where the program runs."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Callable

from torch import nn

from sarcompile.errors import CompileError
from sarcompile.ir.vocab import Compression, Executor, Mode, Strategy

__all__ = ["CompileOptions", "PassContext"]


@dataclass(frozen=True)
class CompileOptions:
    """Options of :func:`sarcompile.distribute`, validated on construction; strings are
    read into the vocabulary's enums (:mod:`sarcompile.ir.vocab`).

    ``strategies`` overrides the strategy pass per op: keys are a layer path (e.g.
    ``"conv2"``, every op of that layer) or an fx node name; values are strategies.
    ``staleness``, ``bounded_staleness``, ``compress`` and ``error_feedback`` choose an
    opt-in communication reduction (see :mod:`sarcompile.runtime.link`) for the layers in
    ``compress_layers`` (None: all).

    ``blocks_in_flight``: how many remote blocks each exchange posts ahead of the one it
    computes on, and how many rounds' gradient pushes stay in flight while it computes the
    next (1: the transfer of one block overlaps the compute of another; 0: none, the least
    memory; more: more overlap, one block buffer more each). ``oneshot`` posts every block at once.
    """

    mode: Mode = Mode.SAR
    executor: Executor = Executor.AUTO
    staleness: int = 1
    compress: Compression | None = None
    strategies: dict[str, Strategy] = field(default_factory=dict)
    bounded_staleness: int | None = None
    error_feedback: bool = True
    compress_layers: tuple[str, ...] | None = None
    blocks_in_flight: int = 1
    seed: int | None = None  # of the dropout masks (sarcompile.compile.passes.dropout)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise once, here
        set_(self, "mode", Mode.parse(self.mode, "mode"))
        set_(self, "executor", Executor.parse(self.executor, "executor"))
        if self.executor is Executor.TRITON and importlib.util.find_spec("triton") is None:
            raise CompileError("executor='triton' needs the triton package: pip install 'sarcompile[triton]'")
        if isinstance(self.staleness, bool) or not isinstance(self.staleness, int) or self.staleness < 1:
            raise CompileError(f"staleness must be an integer >= 1 (1 = exact), got {self.staleness!r}")
        if self.bounded_staleness is not None and (
            isinstance(self.bounded_staleness, bool) or not isinstance(self.bounded_staleness, int) or self.bounded_staleness < 1
        ):
            raise CompileError(f"bounded_staleness must be None or an integer >= 1, got {self.bounded_staleness!r}")
        if self.bounded_staleness is not None and self.staleness != 1:
            raise CompileError(
                "staleness=K (refresh every K iterations) and bounded_staleness=S (pipelined) are two ways to "
                "use stale halos; pick one"
            )
        if self.compress is not None:
            if self.compress not in Compression.values():
                raise CompileError(f"compress must be None or one of {Compression.values()}, got {self.compress!r}")
            set_(self, "compress", Compression(self.compress))
        if self.compress_layers is not None and (
            isinstance(self.compress_layers, str) or not all(isinstance(c, str) for c in self.compress_layers)
        ):
            raise CompileError(
                f"compress_layers must be a list of layer paths (e.g. ['conv1']), got {self.compress_layers!r}"
            )
        if isinstance(self.blocks_in_flight, bool) or not isinstance(self.blocks_in_flight, int) or self.blocks_in_flight < 0:
            raise CompileError(
                f"blocks_in_flight must be an integer >= 0 (0: no overlap, 1: the default), got {self.blocks_in_flight!r}"
            )
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise CompileError(f"seed must be None or an integer, got {self.seed!r}")
        halo = Strategy.halo()
        for key, strategy in self.strategies.items():
            if strategy not in halo:
                raise CompileError(f"strategies[{key!r}] must be one of {tuple(map(str, halo))}, got {strategy!r}")
        set_(self, "strategies", {key: Strategy(s) for key, s in self.strategies.items()})

    @property
    def exact(self) -> bool:
        """No opt-in approximation: every exchange is exact and synchronous."""
        return self.staleness == 1 and self.bounded_staleness is None and self.compress is None


@dataclass(frozen=True)
class PassContext(CompileOptions):
    """What the pipeline gives every pass: the user's options, and where the program runs.
    A pass called with bare :class:`CompileOptions` (as tests do) compiles for one machine
    with a fresh random stream."""

    distributed: bool = False  # the program is for N workers (sar, strategy, communication run)
    stream: Callable[[], nn.Module] | None = None  # makes the dropout masks' RandomStream (passes/dropout.py)
