"""A pool of real gloo worker processes that run many test cases per process group.

Starting a process group costs seconds; a hypothesis test wants dozens of cases. So each
world size gets one group of processes, kept for the test session, and each case is a
job sent to all its ranks. Every wait is bounded: a stuck or dead worker fails the test
with a message instead of hanging it.
"""

from __future__ import annotations

import io
import os
import queue
import tempfile
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp

JOB_TIMEOUT_S = 120.0


# Tensors go through the queues as torch.save bytes: queue pickling would share each
# tensor through its own file descriptor, and many small cases exhaust them.
def _dumps(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)


def _worker_main(rank: int, world_size: int, store_path: str, jobs, results) -> None:
    os.environ["SARCOMPILE_TIMEOUT"] = "60"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        while True:
            job = jobs.get()
            if job is None:
                break
            try:
                fn, payload = _loads(job)
                results.put((rank, True, _dumps(fn(rank, world_size, payload))))
            except Exception:  # report to the parent; it fails the test with the traceback
                results.put((rank, False, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class WorkerPool:
    """``world_size`` processes in one gloo group; :meth:`run` sends one job to every rank."""

    def __init__(self, world_size: int):
        ctx = mp.get_context("spawn")
        self.world_size = world_size
        self.closed = False
        self._dir = tempfile.TemporaryDirectory()
        self.jobs = [ctx.Queue() for _ in range(world_size)]
        self.results = ctx.Queue()
        store = os.path.join(self._dir.name, "store")
        self.procs = [
            ctx.Process(target=_worker_main, args=(r, world_size, store, self.jobs[r], self.results), daemon=True)
            for r in range(world_size)
        ]
        for p in self.procs:
            p.start()

    def run(self, fn: Callable[[int, int, Any], Any], payloads: list[Any], timeout: float = JOB_TIMEOUT_S) -> list[Any]:
        """Run ``fn(rank, world_size, payloads[rank])`` on every rank; results by rank."""
        for r in range(self.world_size):
            self.jobs[r].put(_dumps((fn, payloads[r])))
        out: dict[int, Any] = {}
        errors = []
        for _ in range(self.world_size):
            try:
                rank, ok, value = self.results.get(timeout=timeout)
            except queue.Empty:
                dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
                self.close()
                raise TimeoutError(f"workers did not finish within {timeout}s (dead ranks: {dead})") from None
            if ok:
                out[rank] = _loads(value)
            else:
                errors.append(f"rank {rank}:\n{value}")
        if errors:
            self.close()  # peers of a failed rank may be mid-exchange: start afresh next time
            raise AssertionError("worker failed:\n" + "\n".join(errors))
        return [out[r] for r in range(self.world_size)]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for q in self.jobs:
            q.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        self._dir.cleanup()
