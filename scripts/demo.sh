#!/usr/bin/env bash
# Set up, then: generate a learnable 20k-node graph, METIS-partition it for 2 workers and
# for 1, train 2-layer GraphSAGE with `python -m sarcompile.train` on 2 torchrun workers
# and in one plain process, and print both runs' curves and final accuracies side by side
# (they agree to float rounding: N workers train exactly what one machine trains).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
WORKERS=${WORKERS:-2}
EPOCHS=${EPOCHS:-10}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # torchrun's default, set here so it does not warn
OUT=${OUT:-demo_out}
mkdir -p "$OUT"
python examples/make_graph.py --out "$OUT/graph.pt" --nodes 20000
sarcompile partition --edges "$OUT/graph.pt" --parts "$WORKERS" --out "$OUT/parts$WORKERS"
sarcompile partition --edges "$OUT/graph.pt" --parts 1 --out "$OUT/parts1" >/dev/null
# Fresh runs: the trainer refuses to start over a run directory that holds a checkpoint.
rm -rf "$OUT/run$WORKERS" "$OUT/run1"
TRAIN=(--model sage --layers 2 --hidden 128 --epochs "$EPOCHS" --seed 0 --no-progress)
echo "== $WORKERS workers (torchrun)"
torchrun --standalone --nproc-per-node "$WORKERS" -m sarcompile.train --parts "$OUT/parts$WORKERS" \
    --out "$OUT/run$WORKERS" "${TRAIN[@]}"
echo "== 1 process"
python -m sarcompile.train --parts "$OUT/parts1" --out "$OUT/run1" "${TRAIN[@]}"
echo "== side by side"
python - "$WORKERS" "$OUT/run$WORKERS/log.jsonl" "$OUT/run1/log.jsonl" <<'EOF'
import json, sys

n = sys.argv[1]
runs = [[json.loads(line) for line in open(path)] for path in sys.argv[2:]]
print(f"{'epoch':>5} {f'loss ({n} workers)':>18} {'loss (1 process)':>18} {'|diff|':>8}")
for a, b in zip(*runs):
    print(f"{a['epoch']:>5} {a['loss']:>18.6f} {b['loss']:>18.6f} {abs(a['loss'] - b['loss']):>8.1e}")
print(f"{'final':>9} {f'{n} workers':>10} {'1 process':>10}")
for key in ("train_acc", "val_acc", "test_acc"):
    print(f"{key:>9} {runs[0][-1][key]:>10.4f} {runs[1][-1][key]:>10.4f}")
EOF
