"""Opt-in communication reduction for one partitioned op (a *site*): what its exchange
rounds send, and when.

Exact SAR (the default) fetches every remote block every step. A
:class:`~sarcompile.ir.vocab.LinkPolicy`
changes that for one site, in three independent ways:

* **stale halos** (DIGEST, ``staleness=K``): remote blocks are fetched on iterations 0, K,
  2K, ... and cached; in between, the op reads the cached blocks, fetches nothing and
  sends no gradient for remote rows (those contributions are dropped, as in DIGEST).
* **pipelined, bounded staleness** (PipeGCN-style, ``bounded_staleness=S``): iterations
  0, S, 2S, ... are exact and synchronous. In the others the op uses remote features the
  peers sent during the previous iteration (so the exchange overlaps a whole iteration of
  compute) and adds the remote gradients sent during the previous backward. Data used is
  never more than one iteration old, and never more than S: :attr:`LinkState.ages`
  records it.
* **compression** (Sylvie, ``compress="1bit"|"2bit"|"int4"|"int8"``): every row that
  crosses workers -- forward features and backward feature-gradients, never parameters
  and never local tensors -- is quantized per row (:func:`~sarcompile.codegen.torch_kernels.pack`)
  and dequantized on receipt. With **error feedback** (the default) the sender keeps, per
  destination, what quantization lost and adds it to the next transmission, so errors
  do not accumulate: over repeated sends the receiver's average converges to the truth.
  ``error_feedback=False`` is the published method instead: stochastic rounding, no
  residual. On the wire, ``lo`` and ``scale`` travel as bfloat16 (2 bytes each per row).

Only training forwards (autograd on) advance a site's iteration; evaluation under
``torch.no_grad()`` always runs exact, synchronous and uncompressed.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import torch

from sarcompile.codegen import torch_kernels
from sarcompile.dist.traffic import live
from sarcompile.ir.vocab import LinkPolicy
from sarcompile.runtime.columns import Columns

__all__ = ["EXACT", "ExactWire", "LinkState", "Wire", "link_states", "load_link_states"]

WIRE_SCALE = torch.bfloat16  # dtype of each row's lo and scale on the wire


class ExactWire:
    """Exact SAR's wire, the identity: rows travel as they are, and a block received is
    the block visited.

    The exchange rounds (:mod:`sarcompile.runtime.rounds`) send through this wire or a
    link's :class:`Wire`, by the same methods: :meth:`gather` and :meth:`encode` make what
    is sent, :meth:`receive` and :meth:`empty` what is received into (a block of rows; the
    gradients pushed back), :meth:`block` and :meth:`decode` read it."""

    def gather(self, src: torch.Tensor | Columns, rows: torch.Tensor, stream: str, peer: int,
               iteration: int) -> torch.Tensor:
        """``src[rows]`` to send ``peer``, gathered straight into the buffer sent."""
        out = torch.empty((rows.numel(), *src.shape[1:]), dtype=src.dtype, device=src.device)
        if isinstance(src, Columns):
            return src.gather(rows, out)
        with torch.no_grad():
            return torch.index_select(src, 0, rows, out=out)

    def encode(self, rows: torch.Tensor, stream: str, peer: int, iteration: int) -> torch.Tensor:
        return rows.contiguous()

    def receive(self, rows: int, tail: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A block of ``rows`` rows to receive into, counted among the remote blocks alive
        (:data:`~sarcompile.dist.traffic.live`) from now on."""
        return live.track(self.empty(rows, tail, dtype, device))

    def block(self, buf: torch.Tensor, rows: int, tail: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return buf

    def empty(self, rows: int, tail: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty((rows, *tail), dtype=dtype, device=device)

    def decode(self, buf: torch.Tensor, rows: int, tail: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return buf


EXACT = ExactWire()


class Wire:
    """Encodes rows for one peer and decodes what arrives, per the policy's compression
    (the methods the rounds use: see :class:`ExactWire`)."""

    def __init__(self, policy: LinkPolicy, rank: int):
        self.policy = policy
        self.rank = rank
        self.residual: dict[tuple[str, int], torch.Tensor] = {}  # error feedback, per (stream, peer)

    def wire_bytes(self, rows: int, width: int, dtype: torch.dtype) -> int:
        if not self.policy.bits:
            return rows * width * dtype.itemsize
        return rows * (torch_kernels.packed_row_bytes(width, self.policy.bits) + 2 * WIRE_SCALE.itemsize)

    def encode(self, rows: torch.Tensor, stream: str, peer: int, iteration: int) -> torch.Tensor:
        """What to send ``peer``: the rows themselves, or their packed bytes. ``stream``
        names what the rows are (e.g. "forward features", "backward gradients"): each
        stream and peer has its own error-feedback residual."""
        if not self.policy.bits:
            return rows.contiguous()
        flat = rows.reshape(rows.shape[0], -1)
        lo_scale = _wire_levels(flat, self.policy.bits)  # from the rows alone (see below)
        key = (stream, peer)
        if self.policy.error_feedback:
            res = self.residual.get(key)
            if res is not None and res.shape == flat.shape:
                flat = flat + res
            noise = None
        else:  # the published method: unbiased stochastic rounding, nothing carried over
            seed = zlib.crc32(f"{self.policy.site} {stream} {self.rank} {peer} {iteration}".encode())
            # Drawn on the CPU, whatever the rows' device: the same seed gives the same noise
            # on every device (a CUDA generator's stream differs), so runs agree across them.
            gen = torch.Generator(device="cpu").manual_seed(seed)  # reproducible, unlike hash() of a str
            noise = torch.rand(flat.shape, generator=gen, device="cpu").to(flat.device)
        # Levels from the rows alone, not rows + residual: values pushed outside by the
        # residual are clamped and the rest carried on, so the residual stays within the
        # rows' range. (Levels that widened with the residual let it grow to many times
        # the values: each send's error did too, and 1-bit SAGE training collapsed.)
        packed = _codec(flat).pack(flat, self.policy.bits, noise, lo_scale)
        packed.lo, packed.scale = packed.lo.to(WIRE_SCALE), packed.scale.to(WIRE_SCALE)  # exact: see _wire_levels
        if self.policy.error_feedback:
            self.residual[key] = flat - self._unpack(packed, flat.dtype)
        # lo and scale first: views of the buffer as bfloat16 need an even offset
        return torch.cat([packed.lo.view(torch.uint8), packed.scale.view(torch.uint8), packed.data.reshape(-1)])

    def gather(self, src: torch.Tensor | Columns, rows: torch.Tensor, stream: str, peer: int,
               iteration: int) -> torch.Tensor:
        """``src[rows]`` as sent to ``peer`` (:meth:`encode`)."""
        return self.encode(src[rows], stream, peer, iteration).contiguous()

    def receive(self, rows: int, tail: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A buffer to receive a block of ``rows`` rows into. Uncompressed, it is the block
        itself, as :meth:`ExactWire.receive` makes it; packed, its bytes, which
        :meth:`block` unpacks."""
        if not self.policy.bits:
            return EXACT.receive(rows, tail, dtype, device)
        return self.empty(rows, tail, dtype, device)

    def block(self, buf: torch.Tensor, rows: int, tail: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The block :meth:`receive`'s buffer holds, once arrived; unpacked, it is counted
        among the remote blocks alive (:data:`~sarcompile.dist.traffic.live`) from now on."""
        if not self.policy.bits:
            return buf
        return live.track(self.decode(buf, rows, tail, dtype))

    def empty(self, rows: int, tail: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A receive buffer for ``rows`` rows of shape ``tail`` on ``device`` (the rows'
        own: nccl receives into device memory)."""
        if not self.policy.bits:
            return torch.empty((rows, *tail), dtype=dtype, device=device)
        return torch.empty(self.wire_bytes(rows, math.prod(tail), dtype), dtype=torch.uint8, device=device)

    def decode(self, buf: torch.Tensor, rows: int, tail: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if not self.policy.bits:
            return buf
        width = math.prod(tail)
        nb = torch_kernels.packed_row_bytes(width, self.policy.bits)
        s = WIRE_SCALE.itemsize
        lo = buf[: rows * s].view(WIRE_SCALE)
        scale = buf[rows * s : 2 * rows * s].view(WIRE_SCALE)
        data = buf[2 * rows * s :].reshape(rows, nb)
        packed = torch_kernels.Packed(data, lo, scale, self.policy.bits, width)
        return self._unpack(packed, dtype).reshape(rows, *tail)

    @staticmethod
    def _unpack(packed: torch_kernels.Packed, dtype: torch.dtype) -> torch.Tensor:
        packed = torch_kernels.Packed(packed.data, packed.lo.float(), packed.scale.float(), packed.bits, packed.width)
        return _codec(packed.data).unpack(packed, dtype)


def _wire_levels(rows: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row ``lo`` and ``scale`` as the receiver will see them (bfloat16 values, held in
    float32), with ``lo <= min`` and ``lo + scale * (2**bits - 1) >= max``: every value of
    the row is representable, so error feedback can always pay its residual back. (Rounding
    lo or scale to nearest could leave the row's extremes out of reach forever, and their
    residual would grow without bound.)"""
    if rows.shape[1] == 0:  # aminmax refuses an empty row
        zeros = torch.zeros(rows.shape[0], device=rows.device)
        return zeros, zeros
    lo, hi = torch.aminmax(rows.to(torch.float32), dim=1)
    lo_w = _round(lo, down=True)
    scale_w = _round((hi - lo_w) / (2**bits - 1), down=False)
    return lo_w, scale_w


def _round(t: torch.Tensor, down: bool) -> torch.Tensor:
    """``t`` rounded to bfloat16 towards -inf (``down``) or +inf, as float32."""
    r = t.to(WIRE_SCALE)
    beyond = torch.full_like(r, float("-inf") if down else float("inf"))
    wrong_side = (r.float() > t) if down else (r.float() < t)
    return torch.where(wrong_side, torch.nextafter(r, beyond), r).float()


def _codec(t: torch.Tensor):
    """Generated kernels on CUDA, torch code elsewhere (bit-identical either way)."""
    if t.is_cuda:
        from sarcompile.codegen import triton_available

        if triton_available():
            from sarcompile.codegen import triton_quantize

            return triton_quantize
    return torch_kernels


@dataclass
class Pending:
    """An exchange posted during one iteration and completed during the next."""

    iteration: int
    works: list
    bufs: dict[int, tuple[torch.Tensor, int]]  # peer -> (receive buffer, rows)


@dataclass
class LinkState:
    """What one site remembers across iterations on one worker."""

    policy: LinkPolicy
    wire: Wire
    iteration: int = -1  # of the current (or last) training forward
    cache: dict[int, torch.Tensor] = field(default_factory=dict)  # remote blocks, by source part
    cache_iteration: int = -1  # when the cached features were produced
    pending: dict[str, Pending | None] = field(default_factory=lambda: {"forward": None, "backward": None})
    ages: list[int] = field(default_factory=list)  # per training forward: age of the remote data used
    exchanges: list[int] = field(default_factory=list)  # iterations whose forward fetched synchronously


# -- checkpoints: a worker's links, saved and resumed at the same number of workers ---------------
def link_states(graph) -> list[dict]:
    """This worker's state of every link of ``graph`` (``part.graph``: one-type, or typed
    with a shard per relation), each shard's by the keys that derive it (see
    :meth:`~sarcompile.graph.shard.ShardGraph.derived`): tensors, numbers, strings, lists
    and dicts only. The exchanges a pipelined link posted for the next iteration are
    completed first (their data is part of the state); the links go on as they were."""
    return [{"relation": relation, "derived": path, "sites": {site: _saved(state) for site, state in shard.links.items()}}
            for relation, path, shard in _shards(graph) if shard.links]


def load_link_states(graph, saved: list[dict]) -> None:
    """Put the links :func:`link_states` saved back in ``graph`` (the same partition on
    the same number of workers), making the derived shards that held them."""
    roots = dict((relation, shard) for relation, path, shard in _shards(graph) if not path)
    for entry in saved:
        shard = roots[entry["relation"]]
        for key in entry["derived"]:
            shard = shard.derived(tuple(key))
        shard.links.update({int(site): _loaded(state, shard.rank) for site, state in entry["sites"].items()})


def _shards(graph):
    """``(relation key or "", keys deriving it, shard)`` of every shard of ``graph``, the
    derived ones after their source."""
    relations = getattr(graph, "relations", None)
    roots = [("", graph)] if relations is None else [(str(key), shard) for key, shard in relations.items()]

    def walk(path: list, shard):
        yield path, shard
        for key, child in list(shard._derived.items()):
            yield from walk([*path, list(key)], child)

    for relation, root in roots:
        for path, shard in walk([], root):
            yield relation, path, shard


def _saved(state: LinkState) -> dict:
    pending = {}
    for direction, got in state.pending.items():
        if got is not None:
            for work in got.works:
                work.wait()
            got.works = []  # completed: the next iteration takes the buffers as they are
        pending[direction] = None if got is None else {"iteration": got.iteration,
                                                      "bufs": {q: [buf, rows] for q, (buf, rows) in got.bufs.items()}}
    return {"policy": list(state.policy), "iteration": state.iteration, "cache": dict(state.cache),
            "cache_iteration": state.cache_iteration, "pending": pending, "ages": list(state.ages),
            "exchanges": list(state.exchanges),
            "residual": [[stream, peer, t] for (stream, peer), t in state.wire.residual.items()]}


def _loaded(saved: dict, rank: int) -> LinkState:
    policy = LinkPolicy(*saved["policy"])
    wire = Wire(policy, rank)
    wire.residual = {(stream, int(peer)): t for stream, peer, t in saved["residual"]}
    pending = {d: None if p is None else Pending(p["iteration"], [], {int(q): (b, int(n)) for q, (b, n) in p["bufs"].items()})
               for d, p in saved["pending"].items()}
    return LinkState(policy, wire, iteration=saved["iteration"], cache={int(q): t for q, t in saved["cache"].items()},
                     cache_iteration=saved["cache_iteration"], pending=pending, ages=list(saved["ages"]),
                     exchanges=list(saved["exchanges"]))
