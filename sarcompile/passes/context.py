"""What every pass may read: the user's compile options."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

from ..errors import CompileError

__all__ = ["MODES", "CompileOptions"]

MODES = ("sar", "stash", "oneshot")
EXECUTORS = ("auto", "torch", "triton")
COMPRESS = ("1bit", "2bit", "int4", "int8")


@dataclass(frozen=True)
class CompileOptions:
    """Options of :func:`sarcompile.distribute`, validated on construction.

    ``strategies`` overrides the strategy pass per op: keys are a layer path (e.g.
    ``"conv2"``, every op of that layer) or an fx node name; values are strategies.
    ``staleness``, ``bounded_staleness``, ``compress`` and ``error_feedback`` choose an
    opt-in communication reduction (see :mod:`sarcompile.runtime.link`) for the layers in
    ``compress_layers`` (None: all).
    """

    mode: str = "sar"
    executor: str = "auto"
    staleness: int = 1
    compress: str | None = None
    strategies: dict[str, str] = field(default_factory=dict)
    bounded_staleness: int | None = None
    error_feedback: bool = True
    compress_layers: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        from ..runtime.ops import STRATEGIES

        if self.mode not in MODES:
            raise CompileError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.executor not in EXECUTORS:
            raise CompileError(f"executor must be one of {EXECUTORS}, got {self.executor!r}")
        if self.executor == "triton" and importlib.util.find_spec("triton") is None:
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
        if self.compress is not None and self.compress not in COMPRESS:
            raise CompileError(f"compress must be None or one of {COMPRESS}, got {self.compress!r}")
        if self.compress_layers is not None and (
            isinstance(self.compress_layers, str) or not all(isinstance(c, str) for c in self.compress_layers)
        ):
            raise CompileError(
                f"compress_layers must be a list of layer paths (e.g. ['conv1']), got {self.compress_layers!r}"
            )
        for key, strategy in self.strategies.items():
            if strategy not in STRATEGIES:
                raise CompileError(f"strategies[{key!r}] must be one of {STRATEGIES}, got {strategy!r}")
