"""``python -m sarcompile.predict``: see :mod:`sarcompile.predict`."""

from sarcompile.predict.cli import main

raise SystemExit(main())
