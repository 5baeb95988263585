"""``SARCOMPILE_LOGS``: what the compiler and the runtime do, per rank, in the style of
``TORCH_LOGS``.

    SARCOMPILE_LOGS=comm torchrun --nproc-per-node 2 -m sarcompile.train --parts parts
    SARCOMPILE_LOGS=+plan,comm,memory,passes,kernels python train.py

Each name turns on one family of messages, printed to stderr with the worker's rank:

* ``passes``: the program after tracing and after each pass, as Python;
* ``plan``: each plan built, and what compiling cost by stage (``+plan``: the plan whole);
* ``comm``: each exchange round: the rows sent and received, in bytes, and the time waited;
* ``memory``: after each exchanging op, the resident size, the remote blocks alive and
  the CPU caching allocator's idle bytes;
* ``kernels``: the kernels each op got (torch or generated Triton) and why.

A ``+`` before a name prints more (Python's ``logging.DEBUG``). Off by default: every call
site first tests membership of a frozen set, so a run without the variable pays nothing
else. :func:`set_logs` does the same from code.

    >>> set_logs("comm")
    >>> enabled("comm"), enabled("plan")
    (True, False)
    >>> set_logs("")
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["FAMILIES", "enabled", "verbose", "log", "set_logs"]

FAMILIES = {
    "passes": "the program after tracing and after each pass",
    "plan": "each plan built and the compile time by stage (+plan: the plan whole)",
    "comm": "each exchange round: bytes sent and received, time waited",
    "memory": "after each exchanging op: resident size, remote blocks alive, CPU cache",
    "kernels": "the kernels each op got and why",
}
ENV = "SARCOMPILE_LOGS"

ON: frozenset[str] = frozenset()  # families turned on: call sites test `family in logs.ON`
_VERBOSE: frozenset[str] = frozenset()


class _RankPrefix(logging.Formatter):
    """``[rank R] sarcompile.FAMILY: message`` on every line of the message; the rank is
    read when the record is printed (torch.distributed's, else torchrun's RANK, else 0)."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"[rank {_rank()}] {record.name}:"
        first, *rest = record.getMessage().splitlines() or [""]
        # every line of a program listing keeps the prefix, so that ranks' output can be told apart
        return "\n".join([f"{prefix} {first}", *(f"{prefix}   {line}" for line in rest)])


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


def set_logs(spec: str) -> None:
    """Turn on the families named in ``spec`` (comma-separated, ``+name`` for more
    detail), all others off. Raises ValueError for an unknown name."""
    global ON, _VERBOSE
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n.lstrip("+") not in FAMILIES]
    if unknown:
        raise ValueError(
            f"{ENV}: unknown log name(s) {', '.join(unknown)}; valid names: {', '.join(FAMILIES)} "
            f"(a '+' before a name prints more), e.g. {ENV}=comm,+plan"
        )
    ON = frozenset(n.lstrip("+") for n in names)
    _VERBOSE = frozenset(n[1:] for n in names if n.startswith("+"))
    root = logging.getLogger("sarcompile")
    if ON and not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_RankPrefix())
        root.addHandler(handler)
        root.propagate = False  # printed once, whatever the user's own logging set up
    for family in FAMILIES:
        level = logging.DEBUG if family in _VERBOSE else logging.INFO if family in ON else logging.WARNING
        logging.getLogger(f"sarcompile.{family}").setLevel(level)


def enabled(family: str) -> bool:
    return family in ON


def verbose(family: str) -> bool:
    """``+family`` was asked for."""
    return family in _VERBOSE


def log(family: str, message: str) -> None:
    """Print ``message`` for ``family`` if it is on (test :data:`ON` first where building
    the message costs anything)."""
    if family in ON:
        logging.getLogger(f"sarcompile.{family}").log(
            logging.DEBUG if family in _VERBOSE else logging.INFO, message
        )


set_logs(os.environ.get(ENV, ""))
