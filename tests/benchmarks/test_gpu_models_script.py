"""benchmarks/gpu_models.py, the GPU check's whole-model step, run on a CPU so that it cannot
rot while no GPU is lent: compiled SAGE and the PyG SAGE -> BatchNorm -> GAT model against
eager PyG, every gradient compared, timings and peaks written; and gpu_check.sh's time budget
and exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from commands import ROOT, import_script, run

gpu_models = import_script(ROOT / "benchmarks" / "gpu_models.py")


def test_small_run_on_cpu_is_exact_and_writes_every_number(tmp_path):
    out = tmp_path / "gpu_models.json"
    run([sys.executable, "benchmarks/gpu_models.py", "--device", "cpu", "--small", "--out", str(out)], timeout=60)
    summary = json.loads(out.read_text())
    assert summary["device"] == "cpu" and summary["executor"] == "torch" and summary["tolerance"] == 1e-4
    assert [r["model"] for r in summary["rows"]] == ["sage", "pyg"]
    params = {
        "sage": {f"conv{i}.{w}" for i in (1, 2) for w in ("lin_l.weight", "lin_l.bias", "lin_r.weight")},
        "pyg": {"conv1.lin_l.weight", "conv1.lin_l.bias", "conv1.lin_r.weight", "norm1.module.weight",
                "norm1.module.bias", "conv2.att_src", "conv2.att_dst", "conv2.bias", "conv2.lin.weight"},
    }
    for row in summary["rows"]:
        errs = row["exact"]["errors"]
        assert set(errs) == {"out", "loss"} | {f"grad {p}" for p in params[row["model"]]}, row
        assert row["exact"]["passed"] and max(errs.values()) <= 1e-4, row
        for engine in ("sarcompile", "pyg"):
            assert row[engine]["step_s"] > 0 and row[engine]["first_step_s"] > 0 and row[engine]["peak_bytes"] >= 0
        assert row["step_ratio"] == row["sarcompile"]["step_s"] / row["pyg"]["step_s"]


def test_errors_catch_a_wrong_gradient_and_a_missing_one():
    """The check can fail: a gradient off by 1e-3 of the gradients' scale, or one absent."""
    ref = {"out": torch.ones(4, 2), "grad a": torch.tensor([2.0, -1.0]), "grad b": torch.tensor([1e-8, 0.0])}
    assert max(gpu_models.errors(dict(ref), ref).values()) == 0
    # b is zero in exact arithmetic: its rounding noise is judged on the gradients' scale, 2
    noisy = {**ref, "grad b": torch.tensor([3e-8, 1e-8])}
    assert gpu_models.errors(noisy, ref)["grad b"] == pytest.approx(2e-8 / 2, rel=1e-3)
    wrong = {**ref, "grad a": torch.tensor([2.0, -1.0 + 2e-3])}
    assert gpu_models.errors(wrong, ref)["grad a"] > 1e-4
    missing = {k: v for k, v in ref.items() if k != "grad b"}
    assert gpu_models.errors(missing, ref)["grad b"] == float("inf")


def test_gpu_check_steps_fit_8_minutes_by_their_timeouts():
    """Each step of benchmarks/gpu_check.sh has its own default timeout; together they leave
    half a minute of the 8 for the setup's import checks."""
    script = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    budgets = [int(s) for s in re.findall(r"\$\{GPU_CHECK_\w+_S:-(\d+)\}", script)]
    steps = re.findall(r'^step "[^"]+" "\$(\w+)"', script, re.MULTILINE)
    assert len(steps) == len(budgets) == 3 and len(set(steps)) == 3, (steps, budgets)
    assert sum(budgets) <= 450, budgets


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where no GPU is visible")
def test_gpu_check_says_what_is_missing_by_its_exit_code():
    check = ["bash", "benchmarks/gpu_check.sh"]
    done = subprocess.run(check, cwd=ROOT, env={**os.environ, "PYTHON": "false"}, capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 2 and "cannot import torch" in done.stderr, done.stderr
    done = subprocess.run(check, cwd=ROOT, env={**os.environ, "PYTHON": sys.executable}, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 3 and "no CUDA device visible to torch" in done.stderr, done.stderr
