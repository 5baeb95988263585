#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite; then, with no arguments, the DGL
# front-end and the core tests under torch 2.2 in the DGL environment (scripts/dgl_env.sh).
# SARCOMPILE_SKIP_DGL=1 leaves the DGL part out (saying so).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Everything the run writes to the temporary directory goes to a folder of its own, removed
# when the run passes and named when it fails: a run left about 900 files in /tmp (PyG's
# generated modules, one per layer class in every process; torchrun's log folders; the
# throwaway kernel cache), the child processes' too, since they inherit TMPDIR.
run_tmp=$(mktemp -d "${TMPDIR:-/tmp}/sarcompile-tests-XXXXXX")
export TMPDIR=$run_tmp
trap 'rc=$?; if [ $rc -eq 0 ]; then rm -rf "$run_tmp"; else echo "temporary files of this test run kept in $run_tmp" >&2; fi' EXIT
. .venv/bin/activate
# Two test files at a time (pytest-xdist), each whole on one process so its module's
# worker groups and compiled fixtures are shared: much of the suite waits (on timeouts,
# killed ranks, torchrun's start), and the other file computes meanwhile. No more than
# two: a file's distributed tests already start up to four gloo workers, and the fault
# tests bound how long a job takes to exit.
parallel=()
if [ "$(python -c 'import os; print(len(os.sched_getaffinity(0)))')" -ge 2 ]; then
    parallel=(-n 2 --dist loadfile)
fi
python -m pytest -q "${parallel[@]}" "$@"
deactivate

# DGL's wheels need torch 2.2, so its tests run in a second environment kept outside the
# clone (created once per machine). Failing to create it is reported loudly, not fatal:
# the main suite above is the gate; the DGL part only runs when that environment exists.
DGL_TESTS=(tests/frontends/test_dgl.py tests/frontends/test_dgl_update_all.py tests/frontends/test_dgl_partition.py tests/frontends/test_dgl_example.py tests/frontends/test_dgl_zoo.py tests/frontends/test_dgl_hetero.py tests/frontends/test_dgl_hetero_zoo.py tests/frontends/test_dgl_models_sweep.py tests/frontends/test_dgl_frames.py tests/frontends/test_dgl_param_loops.py tests/frontends/test_dgl_kept_graphs.py tests/frontends/test_dgl_own_model.py tests/compile/test_source_lines.py tests/train/test_rgcn_vs_dgl.py tests/test_nn.py tests/ir/test_ops.py tests/codegen/test_torch_tiles.py tests/codegen/test_cpu_spmm.py tests/dist/test_cpu_cache.py tests/runtime/test_reuse_on_workers.py tests/runtime/test_distributed.py tests/runtime/test_link.py tests/dist/test_failures.py tests/graph/test_hetero.py tests/compile/passes)
skip() { echo; echo "!!!!!!!! DGL tests SKIPPED: $1 !!!!!!!!"; }
if [ $# -gt 0 ]; then
    skip "arguments were given; run them with: \"\$(bash scripts/dgl_env.sh)/bin/python\" -m pytest ${DGL_TESTS[*]}"
elif [ "${SARCOMPILE_SKIP_DGL:-0}" = 1 ]; then
    skip "SARCOMPILE_SKIP_DGL=1"
else
    err=$(mktemp)
    echo; echo "DGL tests: preparing their torch 2.2 environment (scripts/dgl_env.sh; the first time takes minutes)"
    if env=$(bash scripts/dgl_env.sh 2>"$err"); then
        cat "$err" >&2
        echo "DGL tests: torch 2.2 environment $env"
        # This clone's code first on the path: the shared env's editable install points at
        # whichever clone ran scripts/dgl_env.sh last (another checkout, a CI run beside it).
        DGLBACKEND=pytorch PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
            "$env/bin/python" -m pytest -q -p no:cacheprovider "${parallel[@]}" "${DGL_TESTS[@]}"
    else
        cat "$err" >&2
        skip "$(grep -m1 'FAILED' "$err" | sed 's/^scripts\/dgl_env.sh: FAILED: //' || echo 'scripts/dgl_env.sh failed')"
    fi
    rm -f "$err"
fi
