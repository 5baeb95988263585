"""``python -m sarcompile.predict``: :func:`main` runs the command line, agrees a failure with
the other workers and exits with a one-line message, as ``python -m sarcompile.train`` does."""

from __future__ import annotations

from collections.abc import Sequence

from sarcompile.train.cli import run_agreed
from sarcompile.predict.run import parse_args, predict


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (1 with a one-line message on a known
    error; the other workers' codes as :func:`sarcompile.train.main` documents)."""
    cfg = parse_args(argv)
    return run_agreed(lambda: predict(cfg))
