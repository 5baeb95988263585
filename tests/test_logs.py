"""SARCOMPILE_LOGS: each family prints what it says, per rank, and nothing when off."""

from __future__ import annotations

import re
import sys

import pytest
from commands import ROOT, import_script, run

import sarcompile as sc
from sarcompile import logs


def test_names_are_checked_and_plus_asks_for_more():
    try:
        logs.set_logs(" comm, +plan ")
        assert logs.ON == {"comm", "plan"} and logs.verbose("plan") and not logs.verbose("comm")
        with pytest.raises(ValueError, match=r"unknown log name\(s\) kernel; valid names: passes, plan, comm, memory, kernels"):
            logs.set_logs("comm,kernel")
    finally:
        logs.set_logs("")
    assert logs.ON == frozenset() and not logs.enabled("comm")


def test_every_family_under_torchrun(tmp_path):
    """Two workers train one epoch with every family on: each rank prints each family, its
    first line says what the family is for, and a run without the variable prints none."""
    data = import_script(ROOT / "examples" / "make_graph.py").sbm(400, 4, 4, 0.8, 8, 0)
    g = sc.Graph.from_edges(data["src"], data["dst"], data["num_nodes"])
    keys = ("x", "y", "train_mask", "val_mask", "test_mask")
    sc.partition(g, 2, tmp_path / "parts", node_data={k: data[k] for k in keys})
    train = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
             "sarcompile.train", "--parts", str(tmp_path / "parts"), "--epochs", "1", "--hidden", "8",
             "--no-progress", "--model", "gat", "--heads", "2"]
    # (the command's stderr is folded into what `run` returns through a shell redirect)
    everything = "passes,plan,comm,memory,kernels"
    out = run(["bash", "-c", " ".join([*train, "--out", str(tmp_path / "on"), "2>&1"])], SARCOMPILE_LOGS=everything)
    first = {}
    for line in out.splitlines():
        m = re.match(r"\[rank (\d)\] sarcompile\.(\w+): (.*)", line)
        if m:
            first.setdefault((int(m[1]), m[2]), m[3])
    for rank in (0, 1):
        assert first[rank, "passes"].startswith("GNN after trace (")
        assert re.match(r"GNN on 2 workers, mode=sar: \d+ ops, estimated peak per worker .*; compiled in", first[rank, "plan"])
        assert re.match(r"attention forward: rows \d+ B to worker \d, \d+ B from worker \d, waited [\d.]+ ms",
                        first[rank, "comm"]), first[rank, "comm"]
        assert re.match(r"after attention forward: resident [\d.]+ MiB, remote blocks alive [\d.]+ MiB \(most at once so "
                        r"far [\d.]+ MiB\)(, CPU cache [\d.]+ MiB idle)?$", first[rank, "memory"]), first[rank, "memory"]
        assert re.match(r"\S+ on cpu: torch_kernels \(executor='auto' on cpu tensors: generated Triton kernels run on "
                        r"CUDA\)$", first[rank, "kernels"])
        assert (f"[rank {rank}] sarcompile.kernels: attention on cpu: torch_kernels (executor='auto' on cpu tensors: "
                "generated Triton kernels run on CUDA)") in out.splitlines()
    # the backward's rounds too: gradients pushed back, and the blocks fetched again (remat)
    assert re.search(r"\[rank 0\] sarcompile\.comm: attention backward: gradients \d+ B to worker 1", out)
    assert re.search(r"\[rank 0\] sarcompile\.comm: attention backward: rows \d+ B to worker 1", out)
    quiet = run(["bash", "-c", " ".join([*train, "--out", str(tmp_path / "off"), "2>&1"])], SARCOMPILE_LOGS="")
    assert "sarcompile." not in quiet.replace("sarcompile.train", "")
