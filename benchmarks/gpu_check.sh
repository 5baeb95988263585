#!/usr/bin/env bash
# The GPU check: run it on a machine with a CUDA GPU, a CUDA build of torch and triton.
#   1. the generated-kernel tests on CUDA tensors (the same tests CI runs in the interpreter)
#   2. benchmarks/kernels.py: SAGE and GAT layers on a 2M-edge graph, Triton vs the torch
#      executor vs PyG, time and peak memory (JSON, PNG and a markdown table for the README)
# Usage: bash benchmarks/gpu_check.sh [extra arguments for benchmarks/kernels.py]
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to torch ($python); nothing to do" >&2
    exit 1
fi
# Whatever torch is installed stays (a CPU pin would replace the CUDA build).
"$python" -m pip install -q -e ".[test]" || exit 1
unset TRITON_INTERPRET  # the kernels run compiled, on CUDA tensors
"$python" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
status=0
"$python" -m pytest -q -m interpreter tests/codegen || status=1
"$python" benchmarks/kernels.py "$@" || status=1
exit $status
