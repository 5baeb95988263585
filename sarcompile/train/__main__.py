"""``python -m sarcompile.train``: see :mod:`sarcompile.train`."""

from sarcompile.train.cli import main

raise SystemExit(main())
