"""``python -m sarcompile.train``: :func:`main` runs the command line, agrees a failure with the
other workers and exits with a one-line message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as dist

from sarcompile.dist import failure
from sarcompile.dist.process_group import shutdown
from sarcompile.train.checkpoints import _distributed
from sarcompile.train.config import parse_args
from sarcompile.train.loop import train


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (1 with a one-line message on a known error).

    On several workers a failure is agreed (see :mod:`sarcompile.dist.failure`): the
    failing worker prints its error and exits 1 first; every other one prints
    ``rank R failed: ...`` and exits 3 right after it; a worker that finds a peer gone or
    silent names it and exits 4; Ctrl-C exits 130. None waits for the timeout.
    """
    cfg = parse_args(argv)

    def run() -> None:
        cfg.validate()
        train(cfg)

    return run_agreed(run)


def run_agreed(body: Callable[[], Any]) -> int:
    """Run a worker's command ``body``, returning its exit status as :func:`main` documents
    it: a failure is agreed with the other workers and ends this one with a one-line
    message; the process group is torn down either way."""
    ok = False
    try:
        body()
        ok = True
    except BaseException as e:  # noqa: BLE001 - every way out is agreed with the other workers
        if isinstance(e, SystemExit):
            raise
        rank = dist.get_rank() if dist.is_initialized() else 0
        return failure.report(e, rank=rank, distributed=_distributed())
    finally:
        if ok or failure.active() is None:  # (after a failure with a watchdog, report exited)
            shutdown()
    return 0
