"""The arithmetic of a plan's memory estimate, per worker: what a step holds at its peak.

Two parts are exact -- saved activations (:func:`scale_saved` of what the probe run saw
autograd keep) and remote blocks alive at once (:func:`remote_peak` over each exchanging op's
rounds, :class:`Exchange`), which tests compare with the runtime's own counters; the
workspace of the kernels (:func:`workspace`) is a documented approximation, and the
libraries' code pages a measured constant (:data:`KERNEL_CODE_BYTES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sarcompile.ir.opdef import Temporaries
from sarcompile.plan.sizes import WorkerStats

__all__ = ["KERNEL_CODE_BYTES", "Exchange", "optimizer_factor", "remote_peak", "scale_saved", "workspace"]


# The libraries' code a training step runs for the first time (libtorch's sparse, scatter
# and autograd paths, gloo) is paged in from disk and counts in the resident size like data:
# 11-14 MiB per process with torch 2.13 on CPU, whatever the graph or the number of workers
# (benchmarks/vs_dgl.py's ledger, "code_pages"). Without it the estimate was 18% low at
# N = 8, where the data is small.
KERNEL_CODE_BYTES = 12 * 2**20


def scale_saved(saved: dict[int, tuple[int, tuple[int, ...]]], sizes: dict[int, int]) -> int:
    """Bytes the probe's saved tensors take on a worker: each scales with the size (rows
    of a node type, or the edges of one graph variant) that one of its dims equals;
    ``sizes`` maps the probe's sizes to the worker's."""
    total = 0
    for nbytes, shape in saved.values():
        dim = next((d for d in shape if d in sizes), None)
        total += nbytes if dim is None else nbytes * sizes[dim] // dim
    return total


def optimizer_factor(optimizer: Any) -> int:
    """Tensors of state per parameter element that ``optimizer`` keeps."""
    if optimizer is None:
        return 0
    name = optimizer if isinstance(optimizer, str) else type(optimizer).__name__
    name = name.lower()
    if name.startswith("adam"):
        return 2
    if name == "sgd":
        momentum = 0.0 if isinstance(optimizer, str) else optimizer.defaults.get("momentum", 0.0)
        return 1 if (isinstance(optimizer, str) or momentum) else 0
    raise ValueError(f"unknown optimizer {name!r}: give 'adam', 'sgd' or an optimizer instance")


@dataclass
class Exchange:
    """What the memory estimate needs of one exchanging op, per worker in round order
    (q = r-1, r-2, ...): the bytes of each block received and of the rows sent in the same
    round, and which directions move blocks (fetch) or gradients (push)."""

    blocks: list[list[int]]
    sends: list[list[int]]
    keeps: bool  # the remote blocks stay for backward
    forward: tuple[bool, bool]  # (fetches, pushes)
    backward: tuple[bool, bool]
    row_bytes: int
    temporaries: Temporaries
    stats: list[WorkerStats]  # per worker, the sizes of the graph the op aggregates over
    in_flight: int = 1  # blocks posted ahead, and pushes not yet completed (blocks_in_flight)
    over_block: bool = False  # backward writes the gradient it pushes over the block it fetched again


def _round_peak(blocks: list[int], sends: list[int], fetch: bool, push: bool, in_flight: int = 1,
                over_block: bool = False) -> int:
    """Most bytes alive at once over one exchange's rounds, in the order
    ``rounds._sync_rounds`` keeps. Round k visits its block, with the next ``in_flight``
    blocks arriving meanwhile, each with the rows sent for it gathered into their own
    buffer (with none in flight, a block's rows go out while it arrives). When gradients go
    back, the visit makes the block's gradient (written over the block if ``over_block``).
    Fetching too, it goes out once the rows sent ahead are gone, with the owner's gradient
    for the rows sent arriving, and completes before the next block is posted. Pushing
    alone, the last ``in_flight`` rounds' gradients (each that block's gradient and the
    owner's, arriving) are on their way during a visit."""

    def ahead(k: int, sent: bool = True) -> int:
        return sum(blocks[j] + (sends[j] if sent else 0) for j in range(k + 1, min(k + 1 + in_flight, len(blocks))))

    peak = 0
    for k, block in enumerate(blocks):
        arriving = block + (0 if in_flight else sends[k])
        if fetch and push:
            visiting = block + (0 if over_block else block) + ahead(k)
            now = max(arriving, visiting, block + sends[k] + ahead(k, sent=False))
        elif fetch:
            now = max(arriving, block + ahead(k))
        elif push:
            now = block + sends[k] + sum(blocks[j] + sends[j] for j in range(max(k - in_flight, 0), k))
        else:
            now = 0
        peak = max(peak, now)
    return peak


def remote_peak(ops: list[Exchange], r: int, buffers: bool, backward: bool = True) -> int:
    """Most remote bytes alive at worker ``r`` at once over a step, ``ops`` in program
    order: the blocks received alone, or with ``buffers`` also the rows gathered to send
    and the gradients on their way back. Without ``backward`` (a forward under
    ``torch.no_grad()``), an op that keeps its blocks frees them when it returns."""
    kept, peak = 0, 0

    def rounds(op: Exchange, fetch: bool, push: bool, blocks: list[int]) -> int:
        sends = op.sends[r] if buffers else [0] * len(blocks)
        return _round_peak(blocks, sends, fetch, push and buffers, op.in_flight, op.over_block)

    for op in ops:  # forward: kept blocks pile up until backward
        blocks = op.blocks[r]
        now = sum(blocks) + rounds(op, False, op.forward[1], blocks) if op.keeps else rounds(op, *op.forward, blocks)
        peak = max(peak, kept + now)
        kept += sum(blocks) if op.keeps and backward else 0
    if not backward:
        return peak
    for op in reversed(ops):  # backward: each op frees its own
        peak = max(peak, kept + rounds(op, *op.backward, op.blocks[r]))
        kept -= sum(op.blocks[r]) if op.keeps else 0
    return peak


def workspace(comm: list[Exchange], r: int, node_rows: bool = True) -> int:
    """Temporaries of the most demanding op at worker ``r`` -- an approximation: node-row
    gradient buffers (unless not ``node_rows``: a forward alone, whose node rows are its
    results, counted among the activations), per-edge temporaries of the largest block of
    the op's graph (kernels run one block at a time) and bounded per-edge chunks.

    Gradients on their way back to their owners are remote bytes (:func:`_round_peak`)."""
    return max(
        (e.temporaries.node_rows * e.stats[r].nodes * e.row_bytes * node_rows
         + e.stats[r].largest_block(r) * e.temporaries.edge_bytes + e.temporaries.chunk_bytes for e in comm),
        default=0,
    )
