"""Running the project's commands (examples, CLI) as a user would, for end-to-end tests, and
importing its scripts (benchmarks) as modules."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str], timeout: float = 240, **env: str) -> str:
    """Run ``args`` from the repository root with one thread per process and bounded
    waits; return stdout, or fail the test with everything the command printed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SARCOMPILE_TIMEOUT": "60", **env}
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def import_script(path: Path) -> ModuleType:
    """The script at ``path`` imported as the module of its file name (once), its folder on
    ``sys.path``: the gloo workers it spawns import it, and its sibling modules, by name."""
    name = path.stem
    if name not in sys.modules:
        sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
