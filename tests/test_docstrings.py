"""Every public name has a docstring with an example, and every example runs as printed.

The examples run in a fresh process (``sc.init()`` starts a one-worker process group there),
with ``sc`` and ``torch`` imported, as a user would type them."""

from __future__ import annotations

import doctest
import inspect
import subprocess
import sys

import torch

import sarcompile as sc


def _objects():
    for name in sc.__all__:
        obj = getattr(sc, name)
        if not inspect.ismodule(obj):  # (sc.nn and sc.ops: their members are documented one by one)
            yield name, obj


def test_every_public_function_and_class_has_an_example():
    missing = [name for name, obj in _objects() if ">>>" not in (inspect.getdoc(obj) or "")]
    assert not missing, f"public names whose docstring has no example: {missing}"


def test_every_example_runs_as_printed():
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(list(_objects()))} docstrings" in done.stdout


def _run_examples() -> int:
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    finder = doctest.DocTestFinder(recurse=False)
    count = 0
    for name, obj in _objects():
        globs = {**vars(inspect.getmodule(inspect.unwrap(obj))), "sc": sc, "torch": torch}  # as doctest gives a module's
        for test in finder.find(obj, f"sarcompile.{name}", globs=globs):
            runner.run(test)
        count += 1
    result = runner.summarize(verbose=False)
    print(f"{count} docstrings, {result.attempted} examples, {result.failed} failed")
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(_run_examples())
