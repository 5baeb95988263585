"""``python -m sarcompile.train``: see :mod:`sarcompile.train`."""

from .cli import main

raise SystemExit(main())
