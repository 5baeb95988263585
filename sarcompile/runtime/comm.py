"""Process group set-up and the sequential exchange rounds every partitioned op runs on.

Round ``k`` of an aggregation on worker ``r``: send to ``p = (r + k) mod N``, receive from
``q = (r - k) mod N`` with pairwise ``isend``/``irecv`` (gloo has no all-to-all), so every
worker is busy every round. Round 0 is the local block and moves nothing. Gradients for
remote rows travel the opposite way in the same rounds and are summed by their owner.

All traffic is counted per phase in :data:`stats`; every received block is counted by
:data:`live`, which tracks how many remote blocks are alive at once (SAR keeps at most two
per aggregation: the one being reduced and the one being prefetched). The exchange's
buffers come from :data:`pool` (:mod:`sarcompile.dist.pool`) and go back to it when
their round is over, so a step allocates nothing new once the sizes repeat.
"""

from __future__ import annotations

import atexit
import fcntl
import ipaddress
import logging
import math
import os
import socket
import struct
import sys
import time
import weakref
from collections import defaultdict, deque
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from sarcompile.errors import CommError
from sarcompile import logs
from sarcompile.dist import cpu_cache
from sarcompile.dist import failure
from sarcompile.dist import memory
from sarcompile.dist import relaunch
from sarcompile.runtime.link import Pending
from sarcompile.dist.pool import BufferPool
from sarcompile.graph.tables import table_type

__all__ = [
    "Columns", "empty_cache", "global_max", "global_sum", "init", "live", "pool", "run_rounds", "shutdown", "stats",
    "sync_gradients", "timeout",
]

TAG_FEATURES, TAG_GRADS = 11, 12
_DEFAULT_TIMEOUT_S = 300.0
_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's (first) IPv4 address

log = logging.getLogger(__name__)


def timeout() -> float:
    """Seconds any single wait may take (``SARCOMPILE_TIMEOUT``, default 300; a number > 0)."""
    raw = os.environ.get("SARCOMPILE_TIMEOUT")
    if raw is None or not raw.strip():
        return _DEFAULT_TIMEOUT_S
    return _check_timeout(raw, "SARCOMPILE_TIMEOUT")


def stall_timeout() -> float:
    """Seconds a peer's heartbeat may stand still before the job is stopped
    (``SARCOMPILE_STALL_TIMEOUT``, default 20; a number > 0): see :mod:`sarcompile.dist.failure`."""
    raw = os.environ.get("SARCOMPILE_STALL_TIMEOUT")
    if raw is None or not raw.strip():
        return failure.STALL_S
    return _check_timeout(raw, "SARCOMPILE_STALL_TIMEOUT",
                          f"how long a peer's heartbeat may stand still; default {failure.STALL_S:.0f}")


def _check_timeout(raw, name: str,
                   meaning: str = f"how long one wait for a peer worker may take; default {_DEFAULT_TIMEOUT_S:.0f}"
                   ) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a number of seconds > 0 ({meaning}), got {raw!r}")
    return value


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ


def init(backend: str | None = None, timeout_s: float | None = None) -> tuple[int, int]:
    """Join the process group torchrun describes in the environment; returns (rank, world size).

    Without torchrun's variables this starts a one-worker group, so the same script runs
    on one machine with ``python script.py``. gloo on CPU, nccl when CUDA is available.

    On more than one worker it also starts the failure watchdog
    (:mod:`sarcompile.dist.failure`): a worker that fails makes every other one exit
    within seconds, and under torchrun a worker dies with its agent. On any number of
    workers it applies the memory policy: glibc's mmap threshold fixed, so freed tensors
    leave the resident set, and huge pages asked of torch where its first tensor is still
    to come (:func:`~sarcompile.dist.memory.apply_policy`, ``SARCOMPILE_MALLOC``).

    Under ``torchrun --max-restarts K`` the restarted workers meet again by themselves:
    they agree on a namespace of torchrun's store of their own, where nothing the killed
    workers wrote is seen (:mod:`sarcompile.dist.relaunch`).

    Example:

    >>> rank, world_size = sc.init()   # under torchrun: this worker's; here, a one-worker group
    >>> rank, world_size
    (0, 1)
    >>> sc.shutdown()
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    # Before the big allocations: torch's huge pages and glibc's thresholds apply to what comes after.
    memory.apply_policy()
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    limit = timeout() if timeout_s is None else _check_timeout(timeout_s, "timeout_s")
    stall = stall_timeout()
    wait = timedelta(seconds=limit)
    parent = None
    if _under_torchrun():
        parent = os.getppid()
        failure.die_with_parent()  # SIGTERM when the torchrun agent dies, even during rendezvous
    if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        if int(os.environ["WORLD_SIZE"]) > 1:
            choose_interface(backend)
        try:
            if relaunch.uses_agent_store():  # kept across restarts: this start's own namespace of it
                rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
                store, _ = relaunch.generation_store(relaunch.agent_store(limit), rank, world_size, limit)
                dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=wait)
            else:
                dist.init_process_group(backend, timeout=wait)
        except RuntimeError as e:
            store = isinstance(e, (dist.DistNetworkError, dist.DistStoreError))
            if not (store or "connectFullMesh" in str(e)):
                raise
            var = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
            bound = os.environ.get(var)
            what = "the rendezvous store" if store else "the other workers"
            raise CommError(
                f"could not connect to {what} (MASTER_ADDR={os.environ['MASTER_ADDR']}, "
                f"{backend} bound to {f'interface {bound}' if bound else 'the address the hostname resolves to'}): "
                f"{str(e).splitlines()[0][:300]} On several machines, give torchrun an address every machine "
                f"reaches, or set {var} (docs/several-machines.md)."
            ) from None
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=wait)
    # A gloo process that exits with its group still up can abort at random; tear down first.
    atexit.register(shutdown)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if world_size > 1:
        failure.start(dist.distributed_c10d._get_default_store(), rank, world_size, parent=parent,
                      stall_s=stall)
        _hook_excepthook()
    return rank, world_size


def _hook_excepthook() -> None:
    """An uncaught exception in a script that called :func:`init`: show it as usual,
    then tell the other workers (they exit within seconds) instead of waiting for them
    in the shutdown barrier."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        if failure.active() is None or not isinstance(value, BaseException):
            previous(kind, value, tb)
            return
        if not failure.is_consequence(value):  # a failed exchange's traceback tells nothing: report names the culprit
            previous(kind, value, tb)
        failure.report(value, rank=dist.get_rank(), distributed=True, printed=True)

    sys.excepthook = hook


def choose_interface(backend: str = "gloo") -> str | None:
    """Bind gloo (and nccl) to the network interface that routes to ``MASTER_ADDR``.

    gloo otherwise binds to the address the machine's *hostname* resolves to, which is
    often a loopback address (``127.0.1.1 myhost`` in /etc/hosts, containers, network
    namespaces): the workers on one machine then reach each other but never the other
    machines ("connectFullMesh failed", or a connect timeout). When ``GLOO_SOCKET_IFNAME``
    (``NCCL_SOCKET_IFNAME`` for nccl) is unset and ``MASTER_ADDR`` is not a loopback
    address, this sets it to the interface holding the local address the kernel would
    send from to reach ``MASTER_ADDR``. Values the user set are kept. Returns the
    interface chosen (None when nothing was set); logs the choice at INFO level
    (``logging.getLogger("sarcompile.runtime.comm")``).
    """
    names = ["GLOO_SOCKET_IFNAME"] + (["NCCL_SOCKET_IFNAME"] if backend == "nccl" else [])
    unset = [n for n in names if not os.environ.get(n)]
    master = os.environ.get("MASTER_ADDR", "")
    if not unset or not master:
        return None
    found = route_interface(master, int(os.environ.get("MASTER_PORT") or 29500))
    if found is None:
        return None
    ifname, local = found
    for n in unset:
        os.environ[n] = ifname
    log.info("%s=%s: the interface of %s, the local address that routes to MASTER_ADDR=%s",
             "/".join(unset), ifname, local, master)
    return ifname


def route_interface(host: str, port: int = 29500) -> tuple[str, str] | None:
    """(interface name, local address) this machine would use to reach ``host``, or None
    when ``host`` is a loopback address, does not resolve, has no route, or the address is
    on the loopback interface (``host`` is this machine itself, without a network)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError) as e:
        log.info("MASTER_ADDR=%s does not resolve here (%s): not choosing a network interface", host, e)
        return None
    if not infos or any(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos):
        if int(os.environ.get("LOCAL_WORLD_SIZE") or 0) not in (0, int(os.environ.get("WORLD_SIZE") or 0)):
            log.warning(
                "MASTER_ADDR=%s is a loopback address here, but the job spans several machines "
                "(WORLD_SIZE=%s, LOCAL_WORLD_SIZE=%s): workers on other machines cannot reach it. Give "
                "torchrun an address the other machines reach (--master-addr; with --rdzv-backend c10d, "
                "--local-addr), or make this machine's hostname resolve to one (see "
                "docs/several-machines.md).", host, os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE"))
        return None
    family, _, _, _, sockaddr = infos[0]
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)  # UDP: picks the route and source address, sends nothing
            local = s.getsockname()[0].split("%")[0]
    except OSError as e:
        log.info("no route to MASTER_ADDR=%s (%s): not choosing a network interface", host, e)
        return None
    ifname = _interface_with_address(local)
    if ifname is None or ipaddress.ip_address(local).is_loopback or _is_loopback_interface(ifname):
        log.info("local address %s (towards MASTER_ADDR=%s) is on no non-loopback interface", local, host)
        return None
    return ifname, local


def _is_loopback_interface(ifname: str) -> bool:
    try:
        with open(f"/sys/class/net/{ifname}/flags") as f:
            return bool(int(f.read(), 16) & 0x8)  # IFF_LOOPBACK
    except (OSError, ValueError):
        return ifname == "lo"


def _interface_with_address(local: str) -> str | None:
    """The name of the interface holding address ``local`` (stdlib only: ioctl for IPv4,
    /proc/net/if_inet6 for IPv6)."""
    addr = ipaddress.ip_address(local)
    if addr.version == 4:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                try:
                    got = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                except OSError:  # no IPv4 address on this interface
                    continue
                if socket.inet_ntoa(got[20:24]) == local:
                    return name
        return None
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6 and ipaddress.ip_address(int(fields[0], 16)) == addr:
                    return fields[5]
    except OSError:
        pass
    return None


def shutdown() -> None:
    """Tear the process group down, all workers together (safe to call twice).

    A worker that tears down while a peer still talks to it can make gloo abort the peer
    ("terminate called without an active exception"), so all meet at a barrier first.
    The failure watchdog runs until after it, so a peer failing meanwhile still ends this
    worker in seconds.

    Example:

    >>> rank, world_size = sc.init()
    >>> sc.shutdown()   # safe to call again, or without init
    """
    if not (dist.is_available() and dist.is_initialized()):
        failure.stop()
        return
    if dist.get_world_size() > 1:
        try:
            _wait([dist.barrier(async_op=True)], "shutdown", "shutdown")
        except CommError:
            pass  # a peer is already gone: nothing left to wait for
    failure.stop()
    dist.destroy_process_group()
    pool.clear()


def empty_cache() -> int:
    """Release the idle buffers the exchange keeps for reuse (its pool:
    :mod:`sarcompile.dist.pool`) and the idle blocks of the CPU caching allocator
    (:mod:`sarcompile.dist.cpu_cache`), as ``torch.cuda.empty_cache()`` does for CUDA's
    cached blocks: after training, before something else that needs the memory. Returns the
    bytes released. Training can go on; its next steps make their buffers again.

    Example:

    >>> released = sc.empty_cache()   # bytes
    >>> sc.empty_cache()              # nothing idle is left
    0
    """
    cache = cpu_cache.stats()
    idle = pool.idle_bytes + (cache.idle_bytes if cache else 0)  # (the pool's buffers are lent, to the cache)
    pool.clear()
    cpu_cache.release()
    return idle


# -- accounting ---------------------------------------------------------------------------
@dataclass
class CommStats:
    """Bytes sent and received by this worker, per phase (forward, backward, allreduce),
    and the seconds it spent blocked on the others, per kind of wait: ``exchange`` (halo
    rows and their gradients, while nothing else is left to compute) and ``allreduce``
    (collectives: gradients, loss, counts; the time the slowest worker takes to get there
    included)."""

    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    received: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    waited: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def reset(self) -> None:
        self.sent.clear()
        self.received.clear()
        self.waited.clear()

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {"sent": dict(self.sent), "received": dict(self.received)}

    def time_ledger(self, step_s: float, optimizer_s: float) -> dict[str, float]:
        """A training step of ``step_s`` seconds, of which the optimizer took ``optimizer_s``,
        split as :data:`TIME_LEDGER` says by the waits counted since :meth:`reset`."""
        wait, reduce = self.waited.get("exchange", 0.0), self.waited.get("allreduce", 0.0)
        return {"compute": step_s - wait - reduce - optimizer_s, "exchange_wait": wait, "allreduce": reduce,
                "optimizer": optimizer_s}


# The time ledger of a training step (CommStats.time_ledger), in seconds: computing, blocked
# on the halo exchange, in all-reduces (the slowest worker's lateness included), and in the
# optimizer's step. They add up to the step's wall time.
TIME_LEDGER = ("compute", "exchange_wait", "allreduce", "optimizer")


class LiveBlocks:
    """Counts remote blocks that are still referenced, via weak-reference finalizers."""

    def __init__(self) -> None:
        self.count = self.peak = 0
        self.bytes = self.peak_bytes = 0

    def track(self, buf: torch.Tensor) -> torch.Tensor:
        """Count ``buf``, a block received, while it is alive; returns it."""
        nbytes = buf.numel() * buf.element_size()
        self.count += 1
        self.bytes += nbytes
        self.peak, self.peak_bytes = max(self.peak, self.count), max(self.peak_bytes, self.bytes)
        weakref.finalize(buf, self._free, nbytes)
        return buf

    def _free(self, nbytes: int) -> None:
        self.count -= 1
        self.bytes -= nbytes

    def reset_peak(self) -> None:
        self.peak, self.peak_bytes = self.count, self.bytes


stats = CommStats()
live = LiveBlocks()
pool = BufferPool()  # the exchange's buffers, reused across rounds, ops and steps


def _wait(works: list, what: str, kind: str = "exchange") -> float:
    """Wait for posted ``works``, within the timeout; the time blocked is counted in
    ``stats.waited[kind]`` and returned."""
    limit = timedelta(seconds=timeout())
    start = time.perf_counter()
    for w in works:
        try:
            w.wait(limit)
        except RuntimeError as e:  # gloo reports closed peers and timeouts as RuntimeError
            raise CommError(
                f"{what}: a peer worker did not answer within {limit.total_seconds():.0f}s or went away "
                f"({e}). Check the other workers' logs; raise SARCOMPILE_TIMEOUT if they are just slow."
            ) from None
    waited = time.perf_counter() - start
    stats.waited[kind] += waited
    return waited


# -- the rounds -----------------------------------------------------------------------------
Visit = Callable[[int, "torch.Tensor | None"], "torch.Tensor | None"]


@dataclass(frozen=True)
class Columns:
    """Node tensors side by side, as the one ``[n, sum of widths]`` tensor a round sends,
    without making it: ``columns[rows]`` gathers the rows straight into one buffer.
    (Attention sends ``h`` with ``a_src``; a whole concatenated copy would be one more
    ``[n, H*C]`` buffer next to the exchange's own, at its peak.) As a round's ``push_into``
    the gradients received add into each part (:meth:`index_add_`): they stay tensors of
    their own, which autograd can add the other gradients of ``h`` into in place."""

    parts: tuple[torch.Tensor, ...]  # 2-D, the same rows and dtype

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.parts[0].shape[0], sum(p.shape[1] for p in self.parts)))

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype

    @property
    def device(self) -> torch.device:
        return self.parts[0].device

    def __getitem__(self, rows: torch.Tensor) -> torch.Tensor:
        """The rows, as data to send: autograd does not see the gather (out= cannot be
        differentiated)."""
        return self.gather(rows, self.new_empty((rows.numel(), self.shape[1])))

    def gather(self, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The rows, written into ``out`` (``[rows, sum of widths]``)."""
        with torch.no_grad():
            for p, columns in self._beside(out):
                torch.index_select(p, 0, rows, out=columns)
        return out

    def index_add_(self, dim: int, rows: torch.Tensor, source: torch.Tensor) -> "Columns":
        """``self[rows] += source`` (``source``: ``[rows, sum of widths]``), part by part."""
        for p, columns in self._beside(source):
            p.index_add_(dim, rows, columns)
        return self

    def _beside(self, wide: torch.Tensor):
        """Each part with its own columns of ``wide`` (``[any rows, sum of widths]``)."""
        start = 0
        for p in self.parts:
            yield p, wide[:, start : start + p.shape[1]]
            start += p.shape[1]

    def new_empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        return self.parts[0].new_empty(shape)

    def detach(self) -> "Columns":
        return Columns(tuple(p.detach() for p in self.parts))


TAG_PIPELINE = 1000  # + 2 * site (+1 for gradients): pipelined exchanges of one site


@dataclass
class _Round:
    """One round's posted transfers: to worker ``p``, from worker ``q``."""

    p: int
    q: int
    buf: torch.Tensor | None = None  # what is received into
    outgoing: torch.Tensor | None = None  # what is sent: the pool has it back once it is
    works: list = field(default_factory=list)
    sending: object = None  # the send's work, among ``works``
    sent: int = 0  # bytes, for SARCOMPILE_LOGS=comm


def _gather(src: torch.Tensor | Columns, rows: torch.Tensor) -> torch.Tensor:
    """``src[rows]`` into a buffer of the pool."""
    out = pool.take((rows.numel(), *src.shape[1:]), src.dtype, src.device)
    if isinstance(src, Columns):
        return src.gather(rows, out)
    with torch.no_grad():
        return torch.index_select(src, 0, rows, out=out)


def _isend(t: torch.Tensor, peer: int, tag: int, phase: str):
    """Post a send, counting its bytes under ``phase``."""
    stats.sent[phase] += t.numel() * t.element_size()
    return _post(dist.isend, t, peer, tag)


def _irecv(buf: torch.Tensor, peer: int, tag: int, phase: str):
    """Post a receive into ``buf``, counting its bytes under ``phase``."""
    stats.received[phase] += buf.numel() * buf.element_size()
    return _post(dist.irecv, buf, peer, tag)


def _post(op, t: torch.Tensor, peer: int, tag: int):
    """``op`` (isend or irecv) of ``t`` with ``peer``. gloo refuses at once when the peer's
    connection is already closed: a CommError naming it, as :func:`_wait` gives for a wait."""
    try:
        return op(t, peer, tag=tag)
    except RuntimeError as e:
        raise CommError(
            f"worker {peer} did not answer: its connection is closed ({str(e).splitlines()[0][:300]}). "
            "It has most likely exited; check its log."
        ) from None


def run_rounds(
    shard,
    visit: Visit,
    *,
    fetch: torch.Tensor | None = None,
    push_into: torch.Tensor | Columns | Callable[[], torch.Tensor | Columns] | None = None,
    lookahead: int = 1,
    phase: str = "forward",
    what: str = "exchange",
    link=None,
    iteration: int = 0,
    visit_keeps: bool = False,
) -> torch.Tensor | None:
    """Visit every source partition once, local first, then ``q = r-1, r-2, ...``.

    ``fetch``: a node tensor (or :class:`Columns`) whose rows each peer needs; ``visit(q,
    block)`` then gets ``q``'s halo rows of it (the local block gets ``fetch`` itself), with ``lookahead``
    rounds posted ahead (1 for SAR; N-1 fetches everything at once, as domain parallel).
    ``push_into``: if given, what ``visit`` returns for ``q`` (gradient rows for ``q``'s
    halo) is sent back to ``q``, and what peers return for our rows is summed into it; up
    to ``lookahead`` rounds' pushes stay in flight while the next blocks are visited (when
    blocks are fetched too, the blocks ahead are what is in flight during a visit, and a
    push completes before the next block is posted). ``visit`` may return its block's own
    buffer, the gradients written over the rows it has read. ``push_into`` may be a tensor,
    :class:`Columns`, or a function that makes it (the local block's gradient, say): it is
    called once the first blocks are posted, so that their transfer overlaps it. Returns
    what was pushed into.

    ``link`` (a :class:`~sarcompile.runtime.link.LinkState`, None for exact SAR) makes the
    rounds of training ``iteration`` compressed, stale or pipelined (see that module).

    The exchange's buffers come from :data:`pool` and go back to it at the end of their
    round: the rows gathered to send, the gradients received, the gradient rows ``visit``
    returned (if it took them from the pool) once sent, and each block received once
    visited, unless ``visit_keeps`` says ``visit`` keeps the blocks it is given (``stash``)
    or the link's cache keeps them.
    """
    kind = "sync" if link is None else link.policy.kind(iteration)
    cached = link is not None and bool(link.policy.staleness > 1 or link.policy.bounded)
    if kind == "sync" or (kind == "pipelined" and push_into is None and link.pending["forward"] is None):
        if cached and push_into is None:
            link.cache.clear()
        blocks, push_into = _sync_rounds(shard, visit, fetch, push_into, lookahead, phase, what, link, iteration,
                                         keep=cached and push_into is None, visit_keeps=visit_keeps,
                                         reuse=link.cache if cached and push_into is not None else None)
        if cached and push_into is None:  # a forward: keep the blocks for stale iterations
            link.cache, link.cache_iteration = blocks, iteration
            link.ages.append(0)
            link.exchanges.append(iteration)
        if link is not None and link.policy.bounded and push_into is not None:
            _drain(link, "backward", what)  # last iteration's late gradients: superseded
    else:
        push_into = push_into() if callable(push_into) else push_into
        _local_rounds(shard, visit, fetch, push_into, link, iteration, phase, what, kind)
    pipelined_next = link is not None and link.policy.bounded and link.policy.kind(iteration + 1) != "sync"
    if pipelined_next and push_into is None and fetch is not None:  # a forward: send for the next iteration
        _post_pipelined(shard, link, fetch, iteration, phase, what)
    if "memory" in logs.ON and not _offline:  # (not the plan's probe, which runs on a one-worker shard)
        logs.log("memory", f"after {_named(what, phase)}: resident {memory.status_bytes('VmRSS') / 2**20:.1f} MiB, remote "
                 f"blocks alive {live.bytes / 2**20:.2f} MiB (most at once so far {live.peak_bytes / 2**20:.2f} MiB), "
                 f"exchange pool {pool.held_bytes / 2**20:.1f} MiB ({pool.idle_bytes / 2**20:.1f} idle)"
                 + (f", CPU cache {cache.idle_bytes / 2**20:.1f} MiB idle" if (cache := cpu_cache.stats()) else ""))
    return push_into


def _sync_rounds(shard, visit, fetch, push_into, lookahead, phase, what, link, iteration, keep, reuse, visit_keeps):
    """The exact exchange (optionally compressed). Returns the remote blocks received if
    ``keep`` (else each is freed, or given back to the pool, after its visit; ``{}``) and
    the buffer pushed into. ``reuse``: blocks already held (a stale-capable forward's),
    visited instead of fetching them again."""
    n, r = shard.world_size, shard.rank
    tail = lambda t: tuple(t.shape[1:])
    wire = None if link is None else link.wire
    if reuse is not None and fetch is not None:
        fetch_remote = None  # backward re-reads the blocks forward kept
    else:
        fetch_remote = fetch
    received: dict[int, torch.Tensor] = {}
    recycle = not (keep or visit_keeps)

    def post_fetch(k: int) -> _Round:
        p, q = (r + k) % n, (r - k) % n
        posted = _Round(p, q)
        rows = shard.send_index[p]
        if rows.numel():
            if wire is None:
                send = posted.outgoing = _gather(fetch_remote, rows)
            else:
                send = wire.encode(fetch_remote[rows], f"{phase} features", p, iteration).contiguous()
            posted.sent = send.nbytes
            posted.sending = _isend(send, p, TAG_FEATURES, phase)
            posted.works.append(posted.sending)
        if shard.blocks[q].num_src:
            rows_q = shard.blocks[q].num_src
            if wire is None or not wire.policy.bits:
                shape, dtype, device = (rows_q, *tail(fetch_remote)), fetch_remote.dtype, fetch_remote.device
                block = pool.take(shape, dtype, device) if recycle else torch.empty(shape, dtype=dtype, device=device)
                posted.buf = live.track(block)
            else:
                posted.buf = wire.empty(rows_q, tail(fetch_remote), fetch_remote.dtype, fetch_remote.device)
            posted.works.append(_irecv(posted.buf, q, TAG_FEATURES, phase))
        return posted

    def post_push(k: int, grad_rows: torch.Tensor | None) -> _Round:
        p, q = (r + k) % n, (r - k) % n
        posted = _Round(p, q)
        if wire is None:  # a buffer of the pool, if visit took it there: given back once sent
            posted.outgoing = grad_rows
        if shard.blocks[q].num_src:
            if wire is None:
                send = grad_rows.contiguous()
            else:
                send = wire.encode(grad_rows, f"{phase} gradients", q, iteration).contiguous()
            posted.sent = send.nbytes
            posted.works.append(_isend(send, q, TAG_GRADS, phase))
        if shard.send_index[p].numel():
            rows_p = shard.send_index[p].numel()
            if wire is None:
                posted.buf = pool.take((rows_p, *tail(push_into)), push_into.dtype, push_into.device)
            else:
                posted.buf = wire.empty(rows_p, tail(push_into), push_into.dtype, push_into.device)
            posted.works.append(_irecv(posted.buf, p, TAG_GRADS, phase))
        return posted

    def finish_push(posted: _Round) -> None:
        p, q, buf = posted.p, posted.q, posted.buf
        waited = _wait(posted.works, f"{what}: gradients to worker {q} / from worker {p}")
        if "comm" in logs.ON:
            _log_round(what, phase, "gradients", q, posted.sent, p, buf, waited)
        if buf is not None:
            rows_p = shard.send_index[p].numel()
            if wire is not None:
                buf = wire.decode(buf, rows_p, tail(push_into), push_into.dtype)
            push_into.index_add_(0, shard.send_index[p], buf)
            pool.give(posted.buf)
        if posted.outgoing is not None:
            pool.give(posted.outgoing)

    pending = deque()  # fetches posted, their blocks not yet visited
    posted = 0

    def release_sends() -> None:
        """Wait for the rows sent for the blocks ahead to be gone (the peers posted their
        receives before their own visits) and give their buffers back."""
        for ahead in pending:
            if ahead.outgoing is not None:
                _wait([ahead.sending], f"{what}: features to worker {ahead.p}")
                ahead.works.remove(ahead.sending)  # (gloo counts completions: a second wait would hang)
                pool.give(ahead.outgoing)
                ahead.outgoing = ahead.sending = None

    def post_fetches_until(last: int) -> None:
        nonlocal posted
        while fetch_remote is not None and posted < min(last, n - 1):
            posted += 1
            pending.append(post_fetch(posted))

    post_fetches_until(lookahead)
    if callable(push_into):
        push_into = push_into()
    local = visit(r, fetch)
    if push_into is not None and local is not None:
        push_into += local
        pool.give(local)
    in_flight = deque()  # pushes posted, their gradients not yet added
    for k in range(1, n):
        if fetch_remote is not None:
            post_fetches_until(k)  # (none ahead: this block's fetch is posted as it is visited)
            arrived = pending.popleft()
            q, buf = arrived.q, arrived.buf
            waited = _wait(arrived.works, f"{what}: features to worker {arrived.p} / from worker {q}")
            if "comm" in logs.ON:
                _log_round(what, phase, "rows", arrived.p, arrived.sent, q, buf, waited)
            if arrived.outgoing is not None:
                pool.give(arrived.outgoing)
            del arrived
            if buf is None:  # nothing to receive from q: an empty block keeps kernels uniform
                buf = fetch.new_empty((0, *tail(fetch)))
            elif wire is not None and wire.policy.bits:
                buf = live.track(wire.decode(buf, shard.blocks[q].num_src, tail(fetch), fetch.dtype))
            if push_into is not None:
                # Fetching and pushing, a round holds three block-sized buffers (six if all
                # were in flight at once; plan._round_peak): the block, then its gradient,
                # which visit may write over it; the block ahead; and the rows sent for the
                # block ahead, until the gradient's receive takes their place. So the last
                # round's push completes before the next block is posted, and the rows sent
                # are waited for before the push is.
                while in_flight:
                    finish_push(in_flight.popleft())
            post_fetches_until(k + lookahead)
            if keep:
                received[q] = buf
        elif reuse is not None and fetch is not None:
            q = (r - k) % n
            buf = reuse.get(q, fetch.new_empty((0, *tail(fetch))))
        else:
            q, buf = (r - k) % n, None
        out = visit(q, buf)
        if recycle and fetch_remote is not None and not _same_memory(out, buf):
            pool.give(buf)  # its whole life was this round (a block not from the pool is ignored)
        del buf
        if push_into is not None and fetch_remote is not None:
            release_sends()
        if push_into is not None:
            # Each push in flight holds two block-sized buffers (plan._round_peak): the
            # oldest completes before the next is posted, never one more than `lookahead`.
            while in_flight and len(in_flight) >= lookahead:
                finish_push(in_flight.popleft())
            in_flight.append(post_push(k, out))
            del out
            if not lookahead:
                finish_push(in_flight.popleft())
    while in_flight:
        finish_push(in_flight.popleft())
    return received, push_into


def _same_memory(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether ``a`` is ``b``'s memory (a visit that wrote its gradients over its block:
    the buffer then goes back to the pool once they are sent, not after the visit)."""
    return a is not None and b is not None and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _log_round(what: str, phase: str, payload: str, to: int, sent: int, source: int, got: torch.Tensor | None,
               waited: float) -> None:
    """One exchange round for SARCOMPILE_LOGS=comm: ``sent`` bytes to ``to``, ``got`` (the
    buffer received into, None for nothing) from ``source``."""
    received = 0 if got is None else got.nbytes
    logs.log("comm", f"{_named(what, phase)}: {payload} {sent} B to worker {to}, {received} B from worker {source}, "
             f"waited {waited * 1e3:.2f} ms")


def _named(what: str, phase: str) -> str:
    """``spmm(mean) forward``, ``attention backward`` (``what`` of a backward names it already)."""
    return what if what.endswith(phase) else f"{what} {phase}"


def _local_rounds(shard, visit, fetch, push_into, link, iteration, phase, what, kind) -> None:
    """A stale or pipelined iteration: visit the blocks held, exchange nothing now."""
    n, r = shard.world_size, shard.rank
    tail = lambda t: tuple(t.shape[1:])
    if push_into is None and kind == "pipelined":  # features the peers sent last iteration
        got = link.pending["forward"]
        link.pending["forward"] = None
        _wait(got.works, f"{what}: pipelined features")
        link.cache = {q: live.track(link.wire.decode(buf, rows, tail(fetch), fetch.dtype)) for q, (buf, rows) in got.bufs.items()}
        link.cache_iteration = got.iteration
    if push_into is None:
        link.ages.append(iteration - link.cache_iteration)
    local = visit(r, fetch)
    if push_into is not None and local is not None:
        push_into += local
        pool.give(local)
    late: dict[int, torch.Tensor] = {}
    for k in range(1, n):
        q = (r - k) % n
        block = None if fetch is None else link.cache.get(q, fetch.new_empty((0, *tail(fetch))))
        out = visit(q, block)
        if push_into is not None and out is not None and shard.blocks[q].num_src:
            late[q] = out
    if push_into is None or kind != "pipelined":
        return  # stale: remote gradients are dropped until the next refresh
    # Pipelined backward: add what peers sent during the last backward, send ours for the next.
    _drain(link, "backward", what, into=(shard, push_into))
    if link.policy.kind(iteration + 1) == "sync":
        return  # the next iteration is exact: late gradients would be superseded
    works, bufs = [], {}
    tag = TAG_PIPELINE + 2 * link.policy.site + 1
    for q, rows in late.items():
        send = link.wire.encode(rows, f"{phase} gradients", q, iteration).contiguous()
        works.append(_isend(send, q, tag, phase))
    for p in range(n):
        count = shard.send_index[p].numel() if p != r else 0
        if count:
            buf = link.wire.empty(count, tail(push_into), push_into.dtype, push_into.device)
            works.append(_irecv(buf, p, tag, phase))
            bufs[p] = (buf, count)
    link.pending["backward"] = Pending(iteration, works, bufs)


def _drain(link, direction: str, what: str, into=None) -> None:
    """Complete the exchange posted last iteration; add gradients ``into`` (shard, tensor)."""
    got = link.pending[direction]
    link.pending[direction] = None
    if got is None:
        return
    _wait(got.works, f"{what}: pipelined gradients")
    if into is None:
        return
    shard, push_into = into
    for p, (buf, rows) in got.bufs.items():
        push_into.index_add_(0, shard.send_index[p], link.wire.decode(buf, rows, tuple(push_into.shape[1:]), push_into.dtype))


def _post_pipelined(shard, link, fetch: torch.Tensor, iteration: int, phase: str, what: str) -> None:
    """Send this iteration's feature rows for the peers' next iteration, and post the receives."""
    n, r = shard.world_size, shard.rank
    tag = TAG_PIPELINE + 2 * link.policy.site
    works, bufs = [], {}
    src = fetch.detach()
    for k in range(1, n):
        p, q = (r + k) % n, (r - k) % n
        rows = shard.send_index[p]
        if rows.numel():
            send = link.wire.encode(src[rows], f"{phase} features", p, iteration).contiguous()
            works.append(_isend(send, p, tag, phase))
        if shard.blocks[q].num_src:
            buf = link.wire.empty(shard.blocks[q].num_src, tuple(fetch.shape[1:]), fetch.dtype, fetch.device)
            works.append(_irecv(buf, q, tag, phase))
            bufs[q] = (buf, shard.blocks[q].num_src)
    link.pending["forward"] = Pending(iteration, works, bufs)


# -- collectives users call -------------------------------------------------------------------
def global_sum(t: torch.Tensor, phase: str | None = None) -> torch.Tensor:
    """All-reduce (SUM) of ``t`` across workers; returns a new tensor (``t`` is untouched).
    With a ``phase`` the bytes are counted in :data:`stats` under it.

    Example:

    >>> sc.global_sum(torch.tensor([3., 1.]))   # on N workers: the elementwise sum over them
    tensor([3., 1.])
    """
    out = t.detach().clone()
    if dist.is_initialized() and dist.get_world_size() > 1 and not _offline:
        if phase is not None:
            stats.sent[phase] += out.numel() * out.element_size()
            stats.received[phase] += out.numel() * out.element_size()
        work = dist.all_reduce(out, async_op=True)
        _wait([work], "global_sum", "allreduce")
    return out


_offline = False


def is_offline() -> bool:
    """Inside :func:`offline`: code that would check something across workers skips it."""
    return _offline


@contextmanager
def offline():
    """Within this block :func:`global_sum` is the identity on every worker: for running a
    program on one worker alone (the planner's probe) without waiting for the others."""
    global _offline
    before, _offline = _offline, True
    try:
        yield
    finally:
        _offline = before


def global_max(t: torch.Tensor, phase: str | None = None) -> torch.Tensor:
    """Elementwise maximum of ``t`` across workers (all-reduce MAX); returns a new tensor.
    With a ``phase`` the bytes are counted in :data:`stats` under it.

    Example:

    >>> sc.global_max(torch.tensor(7))   # on N workers: the largest value over them
    tensor(7)
    """
    out = t.detach().clone()
    if dist.is_initialized() and dist.get_world_size() > 1 and not _offline:
        if phase is not None:
            stats.sent[phase] += out.numel() * out.element_size()
            stats.received[phase] += out.numel() * out.element_size()
        _wait([dist.all_reduce(out, op=dist.ReduceOp.MAX, async_op=True)], "global_max", "allreduce")
    return out


def sync_gradients(model: torch.nn.Module) -> None:
    """All-reduce (SUM) every parameter's ``.grad`` so each worker holds the global gradient;
    node tables, whose rows each worker owns alone, are left as they are.

    Parameters without a gradient on this worker count as zero, so every worker joins
    every all-reduce in the same order.

    Example:

    >>> lin = torch.nn.Linear(2, 1)
    >>> lin(torch.ones(1, 2)).sum().backward()
    >>> sc.sync_gradients(lin)   # on N workers: every .grad summed over them; on one, unchanged
    >>> lin.weight.grad
    tensor([[1., 1.]])
    """
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return
    # A node table's rows live on one worker each (sarcompile.graph.tables): its gradient is whole.
    params = [p for p in model.parameters() if p.requires_grad and table_type(p) is None]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    # counted as the reduced tensor, sent and received once (whatever the algorithm moves)
    stats.sent["allreduce"] += flat.numel() * flat.element_size()
    stats.received["allreduce"] += flat.numel() * flat.element_size()
    _wait([dist.all_reduce(flat, async_op=True)], "sync_gradients", "allreduce")
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
