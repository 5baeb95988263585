#!/usr/bin/env bash
# Create (once) and reuse the DGL test environment, then print its path.
#
# DGL's wheels only run on an old torch, so its front-end is tested in a second virtual
# environment kept OUTSIDE the clone: it is several GB (PyPI's torch 2.2.1 is a CUDA build)
# and takes minutes to create, so one copy per machine is shared by every clone and CI run.
# Its folder name carries a hash of the requirements: changing them makes a new env.
# sarcompile itself is (re)installed editable from this clone on every call, which is cheap;
# the env then imports the last clone that called this, so scripts/test.sh also puts its own
# clone first on PYTHONPATH for the DGL tests.
#
#   env=$(bash scripts/dgl_env.sh) && "$env/bin/python" -m pytest tests/frontends/test_dgl.py
#
# Environment: SARCOMPILE_DGL_ENV overrides the env's path; PYTHON the interpreter that
# creates it (default python3). Exit status is non-zero, with the reason on stderr and the
# pip log's tail, when the env cannot be created; stdout then stays empty.
set -euo pipefail
cd "$(dirname "$0")/.."

REQUIREMENTS=(
    "torch==2.2.1"
    "dgl==2.1.0"
    "numpy<2"
    "torchdata==0.7.1"
    "pyyaml"
    "pydantic"
    "pandas<3"
)
PYTHON=${PYTHON:-python3}
hash=$(printf '%s\n' "${REQUIREMENTS[@]}" "$("$PYTHON" -c 'import sys; print(sys.version_info[:2])')" \
    | sha256sum | cut -c1-12)
ENV=${SARCOMPILE_DGL_ENV:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/sarcompile/dgl-env-$hash}

fail() {
    echo "scripts/dgl_env.sh: FAILED: $1" >&2
    if [ -n "${2:-}" ] && [ -f "$2" ]; then
        echo "--- last lines of $2 ---" >&2
        tail -n 25 "$2" >&2
    fi
    exit 1
}

# The env is complete only once the marker is written: a half-built one (killed run, full
# disk) is removed and rebuilt rather than reused.
marker="$ENV/.sarcompile-dgl-env-complete"
mkdir -p "$(dirname "$ENV")" || fail "cannot create $(dirname "$ENV")"
# One creator at a time: a second clone (or CI run) on this machine waits, then reuses it.
exec 9>"$ENV.lock"
flock 9 || fail "cannot lock $ENV.lock"
if [ ! -f "$marker" ]; then
    rm -rf "$ENV"
    echo "scripts/dgl_env.sh: creating the DGL env in $ENV (once per machine; several GB, a few minutes)" >&2
    log="$(dirname "$ENV")/dgl-env-$hash.create.log"
    {
        "$PYTHON" -m venv "$ENV" &&
        "$ENV/bin/python" -m pip install --upgrade pip &&
        "$ENV/bin/python" -m pip install "${REQUIREMENTS[@]}" &&
        "$ENV/bin/python" -c "import dgl, torch; print('dgl', dgl.__version__, 'torch', torch.__version__)"
    } >"$log" 2>&1 || fail "creating the DGL env in $ENV failed (full log: $log)" "$log"
    touch "$marker"
fi

log="$ENV/sarcompile-install.log"
# --no-deps, then the test dependencies with the pins repeated, so that pip never replaces
# the pinned torch. torch-geometric: tests/test_nn.py compares against PyG's layers.
"$ENV/bin/python" -m pip install --no-deps -e . >"$log" 2>&1 &&
"$ENV/bin/python" -m pip install "${REQUIREMENTS[@]}" \
    pytest pytest-xdist hypothesis networkx pymetis rich tqdm torch-geometric >>"$log" 2>&1 \
    || fail "installing sarcompile and the test dependencies into $ENV failed (log: $log)" "$log"
echo "$ENV"
