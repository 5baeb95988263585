"""A worker that dies or stops answering makes the others fail fast with a clear error."""

from __future__ import annotations

import os
import queue
import tempfile
import time

import pytest
import torch.multiprocessing as mp


def _worker(rank: int, store_path: str, behaviour: str, results) -> None:
    os.environ["SARCOMPILE_TIMEOUT"] = "5"
    import torch
    import torch.distributed as dist

    import sarcompile as sc
    from sarcompile.shard import ShardGraph, split_graph

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    g = sc.Graph.from_edges(torch.tensor([0, 1, 2, 3]), torch.tensor([2, 3, 0, 1]), 4)
    parts = split_graph(g, torch.tensor([0, 0, 1, 1]), 2)
    shard = ShardGraph.from_part(parts[rank], rank, 2, 4, 4)
    if rank == 1:
        if behaviour == "die":
            os._exit(3)
        time.sleep(30)  # alive but silent
        os._exit(0)
    start = time.monotonic()
    try:
        sc.spmm(shard, torch.randn(2, 3), "sum")
        results.put(("no error", time.monotonic() - start))
    except sc.CommError as e:
        results.put((str(e), time.monotonic() - start))
    results.close()
    results.join_thread()  # os._exit would drop a message still in the queue's feeder thread
    os._exit(0)


@pytest.mark.parametrize("behaviour", ["die", "hang"])
def test_peer_failure_raises_comm_error_within_timeout(behaviour):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=_worker, args=(r, os.path.join(d, "store"), behaviour, results)) for r in range(2)]
        for p in procs:
            p.start()
        try:
            message, took = results.get(timeout=60)
        except queue.Empty:
            pytest.fail("rank 0 neither finished nor raised within 60 s")
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
    assert "did not answer" in message and "worker 1" in message, message
    assert took < 15, f"took {took:.1f}s with a 5 s timeout"
