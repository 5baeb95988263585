#!/usr/bin/env bash
# Set up (with the benchmark extras) and run the benchmarks; results land in benchmarks/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pip install -q -e ".[bench]" >.venv/bench-setup.log 2>&1 || { cat .venv/bench-setup.log; exit 1; }
python benchmarks/gat_single.py "$@"
