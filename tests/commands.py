"""Running the project's commands (examples, CLI) as a user would, for end-to-end tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str], timeout: float = 240, **env: str) -> str:
    """Run ``args`` from the repository root with one thread per process and bounded
    waits; return stdout, or fail the test with everything the command printed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SARCOMPILE_TIMEOUT": "60", **env}
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout
