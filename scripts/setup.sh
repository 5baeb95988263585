#!/usr/bin/env bash
# Create .venv (once) and install sarcompile with its test dependencies into it.
# torch is pinned to the CPU build first: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
# pip's and setuptools' chatter goes to a log, shown only when something fails.
log=.venv/setup.log
{
    if ! python -c "import torch" 2>/dev/null; then
        python -m pip install --upgrade pip
        python -m pip install "torch==2.13.0"
    fi
    python -m pip install -e ".[test]"
} >"$log" 2>&1 || { cat "$log"; echo "setup failed (log above, also in $log)" >&2; exit 1; }
