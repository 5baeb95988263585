"""What every pass may read: the user's compile options."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

from ..errors import CompileError

__all__ = ["CompileOptions", "MODES"]

MODES = ("sar", "stash", "oneshot")
EXECUTORS = ("auto", "torch", "triton")


@dataclass(frozen=True)
class CompileOptions:
    """Options of :func:`sarcompile.distribute`, validated on construction.

    ``strategies`` overrides the strategy pass per op: keys are a layer path (e.g.
    ``"conv2"``, every op of that layer) or an fx node name; values are strategies.
    """

    mode: str = "sar"
    executor: str = "auto"
    staleness: int = 1
    compress: str | None = None
    strategies: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from ..runtime.ops import STRATEGIES

        if self.mode not in MODES:
            raise CompileError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.executor not in EXECUTORS:
            raise CompileError(f"executor must be one of {EXECUTORS}, got {self.executor!r}")
        if self.executor == "triton" and importlib.util.find_spec("triton") is None:
            raise CompileError("executor='triton' needs the triton package: pip install 'sarcompile[triton]'")
        if self.staleness != 1 or self.compress is not None:
            raise CompileError(
                "stale (staleness > 1) and compressed communication are not available yet; "
                "use staleness=1, compress=None (exact SAR)"
            )
        for key, strategy in self.strategies.items():
            if strategy not in STRATEGIES:
                raise CompileError(f"strategies[{key!r}] must be one of {STRATEGIES}, got {strategy!r}")
