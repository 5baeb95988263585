#!/usr/bin/env bash
# Set up, then: generate a learnable graph, partition it with METIS, train 2-layer
# GraphSAGE on 2 torchrun workers, and print each epoch's loss next to the loss of the
# same model trained on one machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
WORKERS=${WORKERS:-2}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # torchrun's default, set here so it does not warn
OUT=${OUT:-demo_out}
mkdir -p "$OUT"
python examples/make_graph.py --out "$OUT/graph.pt" --nodes 20000
sarcompile partition --edges "$OUT/graph.pt" --parts "$WORKERS" --out "$OUT/parts"
torchrun --standalone --nproc-per-node "$WORKERS" examples/train_sage.py --parts "$OUT/parts" --epochs 10 --reference
