"""``python -m sarcompile``: the same command line as the ``sarcompile`` script."""

from sarcompile.cli.main import main

if __name__ == "__main__":  # importing this module (e.g. doctest collection) must not run the CLI
    raise SystemExit(main())
