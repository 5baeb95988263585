"""Message passing in plain torch (sarcompile/frontends/plain.py) in a program that imports
no GNN library: compiled on one machine and on 3 gloo workers (one without nodes), against eager torch on
the real ``edge_index``, in a fresh interpreter where ``torch_geometric`` is never imported
(PyG's own tests, and the worker pool they share, import it). The reductions' property tests
over random graphs are test_pyg_plain.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_plain_torch_compiles_exactly_without_a_gnn_library():
    code = "import plain_models; plain_models.check_without_gnn_library()"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), str(HERE.parent.parent)])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_plain_front_end_is_loaded_for_every_compile():
    """load_available always loads it (torch is its library); importing sarcompile loads no front-end."""
    code = ("import sys, sarcompile; assert not [m for m in sys.modules if m.startswith('sarcompile.frontends.')]; "
            "from sarcompile.compile.libraries import load_available; load_available(); "
            "assert 'sarcompile.frontends.plain' in sys.modules and 'torch_geometric' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
