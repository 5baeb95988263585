"""What an IR op *is*, in one place: :class:`OpDef`.

An op is defined once, with :func:`ir_op`, next to its public function in
:mod:`sarcompile.ir.ops`. Its definition holds everything the compiler knows about it:

* its signature and the checks of its constant arguments (run at trace time);
* its residency rule: what rows its row arguments and its result have
  (:class:`~sarcompile.ir.vocab.Residency`);
* what it exchanges on N workers: nothing, halo rows (:class:`Halo`: which arguments'
  rows travel, whether backward reads remote inputs and pushes gradients) or an
  all-reduce (:class:`AllReduce`, with its bytes);
* what it keeps for backward and its temporaries, in terms of rows, edges and widths;
* its label in the plan, and a warning where approximate communication is risky.

Two things are registered onto a definition from outside, as ``torch.library``
registers kernels onto an op: the runtime its *shard implementation*
(:meth:`OpDef.implement`), codegen the generated kernels it can use
(:meth:`OpDef.register_kernels`). So this module and :mod:`sarcompile.ir.ops` never import
the runtime or codegen, and the passes, the plan and the estimate walk definitions
instead of testing op names.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx

from sarcompile.errors import CompileError
from sarcompile.ir.vocab import Exchange, Residency

__all__ = ["Args", "Halo", "Push", "AllReduce", "Temporaries", "OpDef", "ir_op", "registry", "definition", "row_bytes"]

# An op's arguments by name, defaults filled in (tensors, or fx nodes at compile time).
Args = dict[str, Any]
# The names of the tensor arguments whose gradient is wanted.
Wants = frozenset[str]

# Kernels that build one row per edge (edge-weight gradients) handle at most this many
# elements at once, whatever the graph's size: it bounds their temporaries.
EDGE_CHUNK_ELEMENTS = 1 << 17

# Keywords the passes set on an op; its checks never see them.
PASS_KEYWORDS = ("strategy", "in_flight", "executor", "comm", "reuse")


def row_bytes(t: torch.Tensor) -> int:
    """Bytes of one row of ``t``."""
    return math.prod(t.shape[1:]) * t.element_size()


@dataclass(frozen=True)
class Halo:
    """The op reads other workers' rows: in round k it receives block ``r - k``.

    ``sends`` names the arguments whose rows travel together (one message per round).
    ``reads_remote_in_backward(args, wants)``: backward needs the remote rows again
    (re-fetched under ``remat``, kept under ``stash``/``oneshot``); ``direct`` is only
    valid where it is False. ``pushes_gradients(args, wants)``: backward sends the
    gradients of remote rows to their owners. ``grads_over_block``: a backward that
    fetched a block again writes the gradients it pushes over it (they have its rows and
    width), so a round holds one buffer for both (the memory estimate counts so)."""

    sends: tuple[str, ...]
    reads_remote_in_backward: Callable[[Args, Wants], bool]
    pushes_gradients: Callable[[Args, Wants], bool]
    grads_over_block: bool = False

    def row_bytes(self, args: Args) -> int:
        """Bytes of one node's row that crosses workers (every sent argument's row)."""
        return sum(row_bytes(args[name]) for name in self.sends)


@dataclass(frozen=True)
class Push:
    """The op reduces onto *source* rows, which live on other workers: in round k each
    worker sends its partial result for block ``r - k``'s halo rows to their owner (the
    way a halo op's backward pushes gradients), and the owner adds them up. Backward
    fetches the halo rows of the result's gradient (the way a halo op's forward fetches
    its inputs). ``of`` names the argument whose row width travels."""

    of: str

    def row_bytes(self, args: Args) -> int:
        return row_bytes(args[self.of])


@dataclass(frozen=True)
class AllReduce:
    """The op sums over every worker's rows; ``bytes(args)`` is (forward, backward) bytes
    each worker receives."""

    bytes: Callable[[Args], tuple[int, int]]


@dataclass(frozen=True)
class Temporaries:
    """What an op's kernels hold at their worst moment beyond what is saved for backward:
    ``node_rows`` node-row tensors of the op's row width, ``edge_bytes`` per edge of the
    largest block (kernels run block by block), ``chunk_bytes`` of bounded per-edge chunks."""

    node_rows: int = 0
    edge_bytes: int = 0
    chunk_bytes: int = 0


def _no_temporaries(args: Args, row: int) -> Temporaries:
    return Temporaries()


@dataclass(eq=False)
class OpDef:
    """Everything the compiler knows about one IR op (see the module docstring)."""

    name: str
    fn: Callable  # the public op: the target of its fx node
    signature: inspect.Signature
    output: Residency  # residency of the result
    inputs: dict[str, Residency]  # residency each row-carrying argument must have
    exchange: Halo | Push | AllReduce | None = None
    label: Callable[[Args], str] | None = None  # the plan's name of the op, e.g. "spmm(mean)"
    saved: Callable[[Args], str] = lambda args: ""  # what it keeps for backward, for people
    temporaries: Callable[[Args, int], Temporaries] = _no_temporaries  # (args, row bytes) -> workspace
    approximate_warning: str = ""  # said when stale or compressed communication reaches it
    impl: Callable | None = field(default=None, repr=False)  # the shard implementation (runtime)
    kernels: Callable[[Args], list] = field(default=lambda args: [], repr=False)  # (role, spec) pairs (codegen)

    @property
    def kind(self) -> Exchange:
        if isinstance(self.exchange, Halo):
            return Exchange.HALO
        if isinstance(self.exchange, Push):
            return Exchange.PUSH
        return Exchange.ALLREDUCE if isinstance(self.exchange, AllReduce) else Exchange.NONE

    def bind(self, args: tuple, kwargs: dict) -> Args:
        """The op's arguments by name, defaults filled in."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def describe(self, args: Args) -> str:
        return self.label(args) if self.label else self.name

    # -- registration from the runtime and codegen ------------------------------------------
    def implement(self, impl: Callable) -> Callable:
        """Register the shard implementation (used as a decorator by the runtime)."""
        self.impl = impl
        return impl

    def register_kernels(self, specs: Callable[[Args], list]) -> Callable:
        """Register the generated kernels the op runs for given arguments (codegen)."""
        self.kernels = specs
        return specs

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Call the shard implementation."""
        if self.impl is None:
            raise CompileError(
                f"IR op {self.name} has no shard implementation registered; import sarcompile (the package "
                "imports its runtime, which registers them)"
            )
        return self.impl(*args, **kwargs)


_REGISTRY: dict[Callable, OpDef] = {}


def registry() -> dict[Callable, OpDef]:
    """Every IR op, keyed by the function an fx node calls."""
    return dict(_REGISTRY)


def definition(target: Any) -> OpDef | None:
    """The definition of an op (its function, or an fx node calling it), or None."""
    if isinstance(target, torch.fx.Node):
        if target.op != "call_function":
            return None
        target = target.target
    try:
        return _REGISTRY.get(target)
    except TypeError:  # unhashable targets are no ops
        return None


def _has_proxy(values) -> torch.fx.Proxy | None:
    for v in values:
        if isinstance(v, torch.fx.Proxy):
            return v
    return None


def ir_op(*, check: Callable, output: Residency, inputs: dict[str, Residency], **definition_fields: Any):
    """Define an IR op: the decorated function is its single-machine/shard entry point;
    the keywords are the :class:`OpDef` fields. ``check(**arguments)`` validates the
    constant arguments at trace time, so a wrong ``reduce`` fails where the model is
    written, not on a worker.

    The op is a single fx node when traced with any tracer, wherever it was imported
    from, since the op itself notices proxy arguments. An op that exchanges takes the
    keywords ``strategy`` (set by the partition and strategy passes) and ``comm`` (set by
    the communication pass); one with generated kernels ``executor`` (the kernels pass)."""

    def register(fn: Callable) -> Callable:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def op(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            check(**{k: v for k, v in bound.arguments.items() if k not in PASS_KEYWORDS})
            proxy = _has_proxy(list(args) + list(kwargs.values()))
            if proxy is not None:
                return proxy.tracer.create_proxy("call_function", op, args, kwargs)
            return fn(*args, **kwargs)

        op.definition = _REGISTRY[op] = OpDef(fn.__name__, op, sig, output, inputs, **definition_fields)
        return op

    return register
