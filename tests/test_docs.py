"""The documentation site builds with no warning, and its API reference has every public name."""

from __future__ import annotations

import subprocess
import sys

import pytest
from commands import ROOT

import sarcompile as sc

pytest.importorskip("sphinx", reason="the docs extra (pip install -e '.[docs]')")
pytest.importorskip("myst_parser", reason="the docs extra (pip install -e '.[docs]')")


def test_docs_build_without_warnings_and_document_every_public_name(tmp_path):
    from sphinx.util.inventory import InventoryFile

    out = tmp_path / "html"
    # One doctree folder for both builds: the link check reads the pages the html build parsed
    doctrees = ["-d", str(tmp_path / "doctrees")]
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q", *doctrees, "docs",
                           str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    with open(out / "objects.inv", "rb") as f:
        inventory = InventoryFile.load(f, "", lambda base, uri: uri)
    documented = {name for entries in inventory.values() for name in entries}
    missing = [name for name in sc.__all__ if f"sarcompile.{name}" not in documented]
    assert not missing, f"public names without an entry in the API reference: {missing}"
    for page in ("getting-started", "using", "several-machines", "plans", "troubleshooting", "api"):
        assert (out / f"{page}.html").is_file()
    # scripts/docs.sh's second step: Sphinx's link check (links out of the repository skipped: no network)
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "linkcheck", "-W", "--keep-going", "-q", *doctrees,
                           "docs", str(tmp_path / "linkcheck")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
