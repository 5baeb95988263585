"""benchmarks/harness.py: results written whole and with their provenance, torchrun launched
with a bounded wait and errors that name the command, and the shared graphs and figures."""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from commands import ROOT, import_script

harness = import_script(ROOT / "benchmarks" / "harness.py")


def _cpuinfo() -> tuple[str | None, set[str]]:
    """The CPU's model name and flags as the kernel lists them (what lscpu reads on x86)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return fields.get("model name"), set(fields.get("flags", "").split())


def test_write_result_adds_provenance(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "some_bench.py"), "--nodes", "10", "--name", "a b"])
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    path = harness.write_result("bench", {"rows": [1, 2], "config": {"nodes": 10}}, tmp_path)
    after = datetime.datetime.now(datetime.timezone.utc)
    assert path == tmp_path / "bench.json"
    data = json.loads(path.read_text())
    assert data["rows"] == [1, 2] and data["config"] == {"nodes": 10}  # the payload as given
    assert data["command"] == "python benchmarks/some_bench.py --nodes 10 --name 'a b'"
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert data["commit"] == head.stdout.strip()
    assert before <= datetime.datetime.fromisoformat(data["date"]) <= after
    model, flags = _cpuinfo()
    assert data["machine"]["cores"] == os.cpu_count()
    if model is not None:  # (x86 Linux: lscpu's Model name is /proc/cpuinfo's model name)
        assert data["machine"]["cpu"] == model
        assert data["machine"]["flags"] == [f for f in ("avx512f", "avx2", "fma") if f in flags]
    assert os.listdir(tmp_path) == ["bench.json"]  # no temporary file left


def test_write_result_replaces_whole_or_not_at_all(tmp_path, monkeypatch):
    path = harness.write_result("bench", {"rows": ["old"]}, tmp_path)
    seen = []
    real_replace = os.replace

    def replace(src, dst):  # at the swap: the old file still whole, the new one complete beside it
        seen.append((json.loads(Path(dst).read_text())["rows"], json.loads(Path(src).read_text())["rows"]))
        real_replace(src, dst)

    monkeypatch.setattr(harness.os, "replace", replace)
    harness.write_result("bench", {"rows": ["new"]}, tmp_path)
    assert seen == [(["old"], ["new"])]
    assert json.loads(path.read_text())["rows"] == ["new"]
    with pytest.raises(TypeError):  # not JSON: the write fails before the swap
        harness.write_result("bench", {"rows": [object()]}, tmp_path)
    assert json.loads(path.read_text())["rows"] == ["new"]
    assert os.listdir(tmp_path) == ["bench.json"]


def test_results_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(harness.RESULTS_ENV, str(tmp_path / "smoke"))
    assert harness.write_result("x", {}) == tmp_path / "smoke" / "x.json"
    monkeypatch.delenv(harness.RESULTS_ENV)
    assert harness.results_dir() == ROOT / "benchmarks" / "results"


GLOO = """
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print(f"rank {rank} of {dist.get_world_size()}: sum {t.item():g}", flush=True)
mode = sys.argv[1]
if mode == "fail" and rank == 1:
    print("rank 1 gives up", file=sys.stderr, flush=True)
    sys.exit(3)
if mode == "hang":
    open(os.path.join(sys.argv[2], f"pid{rank}"), "w").write(str(os.getpid()))
    time.sleep(600)
dist.destroy_process_group()
"""


@pytest.fixture
def gloo_script(tmp_path) -> Path:
    path = tmp_path / "gloo_job.py"
    path.write_text(textwrap.dedent(GLOO))
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")  # a zombie (exited, not yet reaped) counts as gone
    return status.exists() and "\nState:\tZ" not in status.read_text()


def test_launch_runs_torchrun_workers(gloo_script):
    lines = []
    done = harness.launch([str(gloo_script), "ok"], 2, {"OMP_NUM_THREADS": "1"}, timeout=120, on_line=lines.append)
    assert done.cmd[1:7] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(gloo_script)]
    assert done.returncode == 0
    # (the two workers share torchrun's stdout: their lines may interleave, so found anywhere)
    assert sorted(re.findall(r"rank \d of 2: sum 3", done.stdout)) == ["rank 0 of 2: sum 3", "rank 1 of 2: sum 3"]
    assert "".join(lines) == done.stdout  # every stdout line went to on_line too


def test_launch_failure_names_command_and_exit_code(gloo_script):
    with pytest.raises(harness.LaunchError) as failed:
        harness.launch([str(gloo_script), "fail"], 2, {"OMP_NUM_THREADS": "1"}, timeout=120)
    e = failed.value
    assert e.returncode not in (0, None)
    message = str(e)
    assert message.startswith(shlex.join(e.cmd) + f" exited {e.returncode};")
    assert "torch.distributed.run --standalone --nproc-per-node 2" in message
    assert "rank 1 gives up" in message  # the worker's own words, from the end of the output
    done = harness.launch([str(gloo_script), "fail"], 2, {"OMP_NUM_THREADS": "1"}, timeout=120, check=False)
    assert done.returncode == e.returncode


def test_launch_timeout_kills_the_workers(gloo_script, tmp_path):
    start = time.monotonic()
    with pytest.raises(harness.LaunchError) as failed:
        harness.launch([str(gloo_script), "hang", str(tmp_path)], 2, {"OMP_NUM_THREADS": "1"}, timeout=20)
    assert time.monotonic() - start < 60
    assert failed.value.returncode is None
    assert "did not finish in 20 s and was killed" in str(failed.value)
    assert shlex.join(failed.value.cmd) in str(failed.value)
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]  # both workers had started
    deadline = time.monotonic() + 10
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, pids)), "the workers outlived torchrun"


def test_sbm_file(tmp_path):
    harness.sbm_file(tmp_path / "g.pt", 500, 3.0, classes=4, features=8, self_loops=True, noise=5.0)
    g = torch.load(tmp_path / "g.pt")
    src, dst = g["src"], g["dst"]
    assert src.numel() == 2 * 1500 + 500  # both directions of 1500 pairs, then 500 self-loops
    loops = torch.arange(500)
    assert torch.equal(src[-500:], loops) and torch.equal(dst[-500:], loops)
    pairs = set(zip(src[:-500].tolist(), dst[:-500].tolist()))
    assert all((d, s) in pairs for s, d in pairs)  # symmetric
    assert g["x"].shape == (500, 8)
    assert torch.allclose(g["x"].mean(0), torch.zeros(8), atol=1e-5)  # standardised after the noise
    assert torch.allclose(g["x"].std(0), torch.ones(8), atol=1e-5)
    harness.sbm_file(tmp_path / "again.pt", 500, 3.0, classes=4, features=8, self_loops=True, noise=5.0)
    assert torch.equal(torch.load(tmp_path / "again.pt")["src"], src)  # seeded: the same graph every run


def test_random_graph():
    src, dst = harness.random_graph(100, 7)
    assert torch.equal(torch.bincount(dst, minlength=100), torch.full((100,), 7))
    assert 0 <= int(src.min()) and int(src.max()) < 100
    assert torch.equal(harness.random_graph(100, 7)[0], src)


def test_figure_saves_and_closes(tmp_path):
    import matplotlib.pyplot as plt

    with harness.figure(tmp_path / "f.png", 3, rows=2, title="t") as axes:
        assert len(axes) == 6
        axes[4].plot([1, 2], [3, 4])
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plt.get_fignums() == []
