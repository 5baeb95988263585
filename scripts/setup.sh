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
if ! python -c "import torch" 2>/dev/null; then
    python -m pip install -q --upgrade pip
    python -m pip install -q "torch==2.13.0"
fi
python -m pip install -q -e ".[test]"
