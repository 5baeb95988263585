"""The ``sarcompile`` command (also ``python -m sarcompile``): ``partition``, ``plan``,
``explain``, ``estimate`` and ``allocator`` (:mod:`.main` parses; each subcommand runs in a
module of its own)."""
