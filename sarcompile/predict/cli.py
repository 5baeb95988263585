"""``python -m sarcompile.predict``: :func:`main` runs the command line, agrees a failure with
the other workers and exits with a one-line message, as ``python -m sarcompile.train`` does."""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist

from ..runtime import failure
from ..runtime.comm import shutdown
from ..train.checkpoints import _distributed
from .run import parse_args, predict


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (1 with a one-line message on a known
    error; the other workers' codes as :func:`sarcompile.train.main` documents)."""
    cfg = parse_args(argv)
    ok = False
    try:
        predict(cfg)
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
