import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from commands import run
from workers import WorkerPool

# Under pytest-xdist (scripts/test.sh runs two test files at a time on a 2-core machine)
# each process computes on one thread: two processes of two threads each would spin
# against each other (the DGL environment's part took 3:56 so, 3:11 alone and 2:36 so).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

# Without a GPU the generated Triton kernels run in Triton's interpreter, which triton reads
# when it is imported: set here, before any test module is collected, since modules of other
# folders (tests/benchmarks/, collected before tests/codegen/) import triton too. The torch
# kernels still run everything that does not ask for executor='triton'.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Generated kernels go to a throwaway cache, in this process and in the workers it starts
# (which inherit it), removed when this process exits.
if "SARCOMPILE_KERNEL_CACHE" not in os.environ:
    os.environ["SARCOMPILE_KERNEL_CACHE"] = tempfile.mkdtemp(prefix="sarcompile-kernels-")
    atexit.register(shutil.rmtree, os.environ["SARCOMPILE_KERNEL_CACHE"], ignore_errors=True)


@pytest.fixture(scope="session")
def pool():
    """``pool(n)``: a live group of n gloo workers, started once per session and reused."""
    pools: dict[int, WorkerPool] = {}

    def get(n: int) -> WorkerPool:
        if n not in pools or pools[n].closed:
            pools[n] = WorkerPool(n)
        return pools[n]

    yield get
    for p in pools.values():
        p.close()


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory) -> Path:
    """A small learnable graph written by examples/make_graph.py (1500 nodes, 8 features)."""
    path = tmp_path_factory.mktemp("data") / "graph.pt"
    run([sys.executable, "examples/make_graph.py", "--out", str(path), "--nodes", "1500", "--features", "8"])
    return path
