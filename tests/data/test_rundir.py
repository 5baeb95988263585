"""One writer per directory: the lock on run and partition directories, the clean-up of
temporary files a killed writer left, and file modes that follow the umask."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import sarcompile as sc
from sarcompile.data.checkpoint import load_checkpoint, save_checkpoint
from sarcompile.errors import RunDirError
from sarcompile.data.loading import load_partition
from sarcompile.data.manifest import read_manifest
from sarcompile.data.rundir import LOCK_NAME, lock_dir, lock_file, remove_stale_temps

ROOT = Path(__file__).resolve().parents[2]


def small_graph(n: int = 40) -> tuple[sc.Graph, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(n)
    src, dst = torch.randint(n, (4 * n,), generator=gen), torch.randint(n, (4 * n,), generator=gen)
    data = {"x": torch.randn(n, 3, generator=gen), "y": torch.arange(n) % 3, "train_mask": torch.arange(n) % 2 == 0}
    return sc.Graph.from_edges(src, dst, n), data


def test_a_held_directory_is_refused_naming_the_holder(tmp_path):
    with lock_dir(tmp_path, "training run") as held:
        assert held.held and (tmp_path / LOCK_NAME).is_file()
        with pytest.raises(RunDirError) as info:
            lock_dir(tmp_path, "training run")
        msg = str(info.value)
        assert f"'{tmp_path}' is in use by another training run (pid {os.getpid()} on {socket.gethostname()}" in msg
        assert "choose another directory" in msg
    again = lock_dir(tmp_path, "training run")  # released with the block
    again.release()
    assert not again.held


def test_a_held_file_is_refused_and_its_directory_stays_free(tmp_path):
    log = tmp_path / "logs" / "a.jsonl"
    with lock_file(log, "training run") as held:
        assert held.held and (tmp_path / "logs" / ".a.jsonl.lock").is_file()
        with pytest.raises(RunDirError, match=f"'{log}' is in use by another training run .*choose another file"):
            lock_file(log, "training run")
        lock_file(tmp_path / "logs" / "b.jsonl", "training run").release()  # another file beside it
        lock_dir(tmp_path / "logs", "training run").release()
    lock_file(log, "training run").release()


def test_the_lock_dies_with_its_process(tmp_path):
    """No stale lock after a kill: the lock belongs to the open file, not to the name."""
    code = (
        "import sys, time; from sarcompile.data.rundir import lock_dir\n"
        "lock = lock_dir(sys.argv[1], 'training run'); print('locked', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirError, match=f"pid {proc.pid} on "):
            lock_dir(tmp_path, "training run")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    lock_dir(tmp_path, "training run").release()


def test_a_restarted_torchrun_job_waits_for_its_previous_lock_and_another_job_is_refused(tmp_path, monkeypatch):
    """torchrun's restart of the same job (TORCHELASTIC_RUN_ID) waits for the previous start's
    lock to go; another job, or a writer outside torchrun, is refused at once."""
    code = (
        "import sys, time; from sarcompile.data.rundir import lock_dir\n"
        "lock = lock_dir(sys.argv[1], 'training run'); print('locked', flush=True); time.sleep(float(sys.argv[2]))\n"
    )
    env = {**os.environ, "TORCHELASTIC_RUN_ID": "job-a"}
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), "60"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        for job in ("job-b", None):
            if job is None:
                monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
            else:
                monkeypatch.setenv("TORCHELASTIC_RUN_ID", job)
            start = time.monotonic()
            with pytest.raises(RunDirError, match=f"pid {proc.pid} on "):
                lock_dir(tmp_path, "training run")
            assert time.monotonic() - start < 5
    finally:
        proc.kill()
        proc.wait(timeout=30)
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), "2"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
        start = time.monotonic()
        with lock_dir(tmp_path, "training run") as lock:  # once the holder let go of it, after its 2 s
            assert lock.held and time.monotonic() - start > 1
            assert proc.wait(timeout=10) == 0
            assert json.loads((tmp_path / LOCK_NAME).read_text())["job"] == "job-a"
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_partition_refuses_a_busy_directory_and_touches_nothing(tmp_path):
    g, data = small_graph()
    sc.partition(g, 2, tmp_path, node_data=data, method="contiguous")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != LOCK_NAME}
    stale = tmp_path / ".part-0.pt.0123456789ab.tmp"
    stale.write_bytes(b"half a part of the run that holds the lock")
    with lock_dir(tmp_path, "partition run"):
        with pytest.raises(RunDirError, match="is in use by another partition run"):
            sc.partition(g, 3, tmp_path, node_data=data, method="contiguous")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name not in (LOCK_NAME, stale.name)} == before
    assert stale.exists()  # the holder's temporary file is not ours to delete
    assert load_partition(tmp_path, 1, 2).global_ids.numel() == 20


def test_stale_temp_files_are_cleaned_on_the_next_start(tmp_path):
    g, data = small_graph()
    stale = [tmp_path / ".part-1.pt.aaaaaaaaaaaa.tmp", tmp_path / ".manifest.json.bbbbbbbbbbbb.tmp"]
    keep = [tmp_path / "notes.tmp", tmp_path / ".other.aaaa.tmp"]  # not a temp file of ours
    for p in stale + keep:
        p.write_bytes(b"x")
    sc.partition(g, 2, tmp_path, node_data=data, method="contiguous")
    assert not any(p.exists() for p in stale) and all(p.exists() for p in keep)
    assert remove_stale_temps(tmp_path, ["other"]) == [keep[1]]


def test_written_files_follow_the_umask(tmp_path):
    g, data = small_graph()
    old = os.umask(0o002)
    try:
        sc.partition(g, 2, tmp_path / "parts", node_data=data, method="contiguous")
        save_checkpoint(tmp_path / "run" / "checkpoint.pt", {"epoch": 1, "w": torch.ones(3)})
    finally:
        os.umask(old)
    files = [*(tmp_path / "parts").iterdir(), tmp_path / "run" / "checkpoint.pt"]
    assert {p.name for p in files} == {LOCK_NAME, "manifest.json", "part-0.pt", "part-1.pt", "checkpoint.pt"}
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o664, (p, oct(p.stat().st_mode))
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt")["epoch"] == 1


def test_graph_identity_does_not_depend_on_the_number_of_parts(tmp_path):
    g, data = small_graph()
    ids = {n: sc.partition(g, n, tmp_path / f"p{n}", node_data=data).graph_sha256 for n in (1, 2, 3)}
    assert len(set(ids.values())) == 1 and len(ids[1]) == 64
    assert read_manifest(tmp_path / "p2").graph_sha256 == ids[1]
    other = dict(data, y=data["y"].flip(0))  # same sizes, other labels
    assert sc.partition(g, 2, tmp_path / "other", node_data=other).graph_sha256 != ids[1]
    flipped = sc.Graph.from_edges(g.dst, g.src, g.num_nodes)  # same sizes, edges reversed
    assert sc.partition(flipped, 2, tmp_path / "flipped", node_data=data).graph_sha256 != ids[1]


def test_old_manifests_without_an_identity_still_load(tmp_path):
    import json

    g, data = small_graph()
    sc.partition(g, 2, tmp_path, node_data=data)
    d = json.loads((tmp_path / "manifest.json").read_text())
    del d["graph_sha256"]
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    assert read_manifest(tmp_path).graph_sha256 is None
    assert load_partition(tmp_path, 0, 2).rank == 0


def test_lock_refusal_is_fast(tmp_path):
    with lock_dir(tmp_path, "training run"):
        start = time.monotonic()
        with pytest.raises(RunDirError):
            lock_dir(tmp_path, "training run")
        assert time.monotonic() - start < 1.0


def test_a_file_where_a_directory_belongs_is_named_as_such(tmp_path):
    from sarcompile.data.manifest import read_manifest
    from sarcompile.errors import PartitionError

    f = tmp_path / "afile"
    f.write_text("not a directory")
    with pytest.raises(RunDirError, match=f"'{f}' is a file, not a directory: choose a directory for the partition"):
        lock_dir(f, "partition run")
    with pytest.raises(PartitionError, match=f"'{f}' is a file, not a partition directory"):
        read_manifest(f)
    assert f.read_text() == "not a directory"
