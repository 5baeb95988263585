"""The worker pool of the zoo sweeps (``pyg_zoo.py``, ``pyg_hetero_zoo.py``, ``dgl_zoo.py``,
``dgl_hetero_zoo.py``): ``world_size`` gloo workers that run many cases each.

Starting a process group costs seconds and a sweep runs dozens of cases, so each world size
gets one group of ``torch.multiprocessing`` processes (forked from a server that imported
everything once: :func:`start_server`) on a FileStore, and each case
is a job sent to every rank. A worker loads each partition directory once and runs the
zoo's ``case(part, payload)`` on its part; an exception is answered as ``{"error":
describe_error(e)}``, which the sweep judges. Every wait is bounded.

Neither PyG nor DGL is imported here (the DGL zoos run under torch 2.2 in DGL's
environment): the zoo names its front-end's package, which each worker imports before it
joins the group.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import queue
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
import torch.multiprocessing as mp
from multiprocessing import forkserver

JOB_TIMEOUT_S = 90.0
START_TIMEOUT_S = 180.0
COMM_TIMEOUT_S = "20"  # SARCOMPILE_TIMEOUT in the workers: a peer that died fails fast


def describe_error(e: BaseException) -> dict:
    """An exception as the sweep judges it: its class, whether sarcompile raised it (a
    refusal) or it is a communication error (often a peer's failure seen from here), its
    first line and its innermost frames. Call it while ``e`` is being handled."""
    import sarcompile as sc

    msg = str(e).strip().splitlines()
    return {"type": type(e).__name__, "sarcompile": isinstance(e, sc.SarcompileError),
            "comm": isinstance(e, sc.CommError), "message": msg[0] if msg else "",
            "traceback": traceback.format_exc(limit=-6)}


# Payloads and results cross the queues as torch.save bytes: queue pickling would share each
# tensor through its own file descriptor, and many cases exhaust them.
def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def _worker_main(rank: int, world_size: int, store_path: str, jobs, results, case: Callable[[Any, dict], dict],
                 frontend: str) -> None:
    os.environ["SARCOMPILE_TIMEOUT"] = COMM_TIMEOUT_S
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        import sarcompile as sc

        importlib.import_module(frontend)  # sarcompile's front-end loads when the program imports the library
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    except Exception:
        results.put((rank, -1, False, traceback.format_exc()))
        return
    results.put((rank, -1, True, None))
    parts: dict[str, Any] = {}
    try:
        while True:
            job = jobs.get()
            if job is None:
                break
            job_id, data = job
            try:
                payload = _loads(data)
                d = payload["dir"]
                if d not in parts:
                    parts[d] = sc.load_partition(d, rank, world_size)
                results.put((rank, job_id, True, _dumps(case(parts[d], payload))))
            except Exception as e:  # reported to the parent, which judges the case
                results.put((rank, job_id, True, _dumps({"error": describe_error(e)})))
    finally:
        dist.destroy_process_group()


SERVER_ZOO = "ZOO_POOL_SERVER_OF"  # set in the fork server only: the zoo it imports


def in_server(zoo: str) -> bool:
    """Whether this process is the fork server importing zoo module ``zoo``: a zoo may then
    do at import what every worker would otherwise do for itself (PyG builds each layer
    class's generated code once per process, about 1.4 s)."""
    return os.environ.get(SERVER_ZOO) == zoo


@contextlib.contextmanager
def _environment(**values: str):
    """Within: ``os.environ`` updated with ``values``; as it was again on the way out."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def start_server(case: Callable[[Any, dict], dict], frontend: str):
    """Start the server the workers fork from (at once, so that its imports overlap the
    sweep's single-machine runs), and return its multiprocessing context. It imports torch,
    sarcompile, the front-end and the zoo once (each spawned worker importing them itself
    was a fifth of a sweep's time), the zoo knowing itself there (:func:`in_server`)."""
    zoo = case.__module__
    if zoo == "__main__":  # a zoo run as a script: the server imports it by name (3.11's would not import __main__)
        zoo = Path(sys.modules["__main__"].__file__).stem
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["sarcompile", frontend, zoo])
    # The server imports the zoo and its neighbours from this directory (Python 3.11's fork
    # server does not take the parent's sys.path, which spawned workers did): on its
    # PYTHONPATH only, not on that of whatever this process starts later.
    path = os.pathsep.join(p for p in (os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH")) if p)
    with _environment(PYTHONPATH=path, **{SERVER_ZOO: zoo}):
        forkserver.ensure_running()
    return ctx


class Pool:
    """``world_size`` worker processes in one gloo group; :meth:`run` sends one case to all,
    which ``case(part, payload)`` runs on each rank's part of ``payload["dir"]``. ``case``
    must be importable by the spawned workers (a module-level function of the zoo);
    ``frontend`` is the package each worker imports first (``"torch_geometric"``, ``"dgl"``)."""

    def __init__(self, world_size: int, case: Callable[[Any, dict], dict], frontend: str):
        ctx = start_server(case, frontend)
        self.world_size = world_size
        self.closed = False
        self._dir = tempfile.TemporaryDirectory(prefix="zoo-pool-")
        self.jobs = [ctx.Queue() for _ in range(world_size)]
        self.results = ctx.Queue()
        self._next = 0
        store = os.path.join(self._dir.name, "store")
        self.procs = [ctx.Process(target=_worker_main, daemon=True,
                                  args=(r, world_size, store, self.jobs[r], self.results, case, frontend))
                      for r in range(world_size)]
        for p in self.procs:
            p.start()
        for _ in range(world_size):
            rank, _, ok, err = self._get(START_TIMEOUT_S, -1)
            if not ok:
                self.close()
                raise RuntimeError(f"worker {rank} failed to start:\n{err}")

    def _get(self, timeout: float, job_id: int):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            try:
                item = self.results.get(timeout=left)
            except queue.Empty:
                raise TimeoutError from None
            if item[1] == job_id:
                return item
            # a late answer to an earlier, abandoned job: drop it

    def run(self, payload: dict, timeout: float = JOB_TIMEOUT_S) -> list[dict]:
        """One result per rank (a dict with "error" where that rank raised); raises
        TimeoutError when a rank does not answer in time (the pool is then closed)."""
        self._next += 1
        data = _dumps(payload)
        for q in self.jobs:
            q.put((self._next, data))
        out: dict[int, dict] = {}
        try:
            for _ in range(self.world_size):
                rank, _, _, value = self._get(timeout, self._next)
                out[rank] = _loads(value)
        except TimeoutError:
            dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
            self.close()
            raise TimeoutError(f"no answer from ranks {sorted(set(range(self.world_size)) - set(out))} "
                               f"within {timeout:.0f}s (dead: {dead})") from None
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
                p.join(timeout=5)
        self._dir.cleanup()
