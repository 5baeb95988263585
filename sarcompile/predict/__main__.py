"""``python -m sarcompile.predict``: see :mod:`sarcompile.predict`."""

from .cli import main

raise SystemExit(main())
