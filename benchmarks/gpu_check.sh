#!/usr/bin/env bash
# The GPU check: run it on a machine with a CUDA GPU, a CUDA build of torch and triton.
#   1. the generated-kernel tests on CUDA tensors (the same tests CI runs in the interpreter)
#   2. benchmarks/kernels.py: SAGE and GAT layers on a 2M-edge graph, Triton vs the torch
#      executor vs PyG, time and peak memory (JSON, PNG and a markdown table for the README)
# Usage: bash benchmarks/gpu_check.sh [extra arguments for benchmarks/kernels.py]
# GPU_CHECK_STEP_TIMEOUT=S bounds each step to S seconds (default: unbounded).
#
# The package runs from this checkout (PYTHONPATH), not from a pip install: GPU machines are
# often offline, and whatever torch/triton build is installed there must stay (a CPU pin
# from pyproject would replace the CUDA build). These two steps need torch, triton, pytest,
# hypothesis, torch-geometric and matplotlib only.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
step_timeout=${GPU_CHECK_STEP_TIMEOUT:-0}
if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to torch ($python); nothing to do" >&2
    exit 1
fi
missing=$("$python" -c "
import importlib.util
need = ['triton', 'pytest', 'hypothesis', 'torch_geometric', 'matplotlib']
print(' '.join(m for m in need if importlib.util.find_spec(m) is None))")
if [ -n "$missing" ]; then
    echo "gpu_check: missing Python packages: $missing (pip install them next to the CUDA torch)" >&2
    exit 1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET  # the kernels run compiled, on CUDA tensors
"$python" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
status=0
timeout "$step_timeout" "$python" -m pytest -q -p no:cacheprovider -m interpreter tests/codegen || status=1
timeout "$step_timeout" "$python" benchmarks/kernels.py "$@" || status=1
exit $status
