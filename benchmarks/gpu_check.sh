#!/usr/bin/env bash
# The GPU check, for a short lend of one CUDA GPU (a CUDA build of torch, and triton):
#   1. the generated-kernel tests on CUDA tensors (the same tests CI runs in the interpreter)
#   2. benchmarks/gpu_models.py: whole models on a 200k-node, 4M-edge graph -- the compiled
#      SAGE of examples/train_sage.py and the PyG SAGE -> BatchNorm -> GAT of
#      examples/train_pyg.py, one worker -- against eager PyG on the same GPU: output, loss and
#      every gradient within float32 tolerance, step time and peak memory
#      (benchmarks/results/gpu_models.json and a markdown table for the README)
#   3. benchmarks/kernels.py: SAGE and GAT layers on a 2M-edge graph, Triton vs the torch
#      executor vs PyG, time and peak memory (JSON, PNG and a markdown table for the README)
# Usage: bash benchmarks/gpu_check.sh [extra arguments for benchmarks/kernels.py]
#
# What one GPU cannot check: anything across ranks on GPUs -- NCCL's exchange of rows and
# gradients between workers needs two GPUs (multi-worker runs here stay on gloo, CPU).
#
# Time: at most 8 minutes on one GPU by construction. Each step runs under its own timeout
# (GPU_CHECK_TEST_S, default 180 s; GPU_CHECK_MODELS_S, 150 s; GPU_CHECK_BENCH_S, 120 s), 450 s
# in all, which with the setup's import checks stays under 480 s; a step that runs out is
# reported and counts as failed, and the next one still runs.
#
# Exit codes: 0 every step passed; 1 a step failed or ran out of time; 2 no usable Python or
# torch; 3 no CUDA device visible to torch (or a CPU build of torch); 4 a package is missing.
#
# The package runs from this checkout (PYTHONPATH), not from a pip install: GPU machines are
# often offline, and whatever torch/triton build is installed there must stay (a CPU pin
# from pyproject would replace the CUDA build). These steps need torch, triton, pytest,
# hypothesis, torch-geometric and matplotlib only.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
test_s=${GPU_CHECK_TEST_S:-180}
models_s=${GPU_CHECK_MODELS_S:-150}
bench_s=${GPU_CHECK_BENCH_S:-120}
if ! "$python" -c "import torch" 2>/dev/null; then
    echo "gpu_check: '$python' cannot import torch (set PYTHON to the interpreter with the CUDA build of torch)" >&2
    exit 2
fi
if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to torch ($("$python" -c "import torch; print(torch.__version__, 'CUDA', torch.version.cuda)")); nothing to check" >&2
    exit 3
fi
missing=$("$python" -c "
import importlib.util
need = ['triton', 'pytest', 'hypothesis', 'torch_geometric', 'matplotlib']
print(' '.join(m for m in need if importlib.util.find_spec(m) is None))")
if [ -n "$missing" ]; then
    echo "gpu_check: missing Python packages: $missing (pip install them next to the CUDA torch)" >&2
    exit 4
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET  # the kernels run compiled, on CUDA tensors
"$python" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
status=0

# step NAME SECONDS COMMAND...: runs COMMAND under a timeout, says how it ended
step() {
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$@"
    local rc=$?
    if [ "$rc" -eq 124 ]; then
        echo "gpu_check: $name ran out of its ${limit} s" >&2
    elif [ "$rc" -ne 0 ]; then
        echo "gpu_check: $name failed (exit $rc)" >&2
    fi
    [ "$rc" -eq 0 ] || status=1
}

step "the kernel tests" "$test_s" "$python" -m pytest -q -p no:cacheprovider -m interpreter tests/codegen
step "benchmarks/gpu_models.py" "$models_s" "$python" benchmarks/gpu_models.py
step "benchmarks/kernels.py" "$bench_s" "$python" benchmarks/kernels.py "$@"
exit $status
