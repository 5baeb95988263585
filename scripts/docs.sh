#!/usr/bin/env bash
# Build the documentation site, docs/ -> docs/_build/html, with every warning an error: a
# docstring Sphinx cannot read, a public name without its page, or a link between pages or to
# the repository's files that leads nowhere fails the build. Then Sphinx's linkcheck; links out
# of the repository are skipped (CI has no network).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# one doctree folder for both: the link check reads what the html build parsed
python -m sphinx -b html -W --keep-going -q -d docs/_build/doctrees docs docs/_build/html
python -m sphinx -b linkcheck -W --keep-going -q -d docs/_build/doctrees docs docs/_build/linkcheck
echo "docs: docs/_build/html/index.html"
