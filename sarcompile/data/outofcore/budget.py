"""A memory limit for the whole process, turned into the sizes the streaming passes use.

The limit counts the process's peak resident set, the interpreter and torch included, so
the budget is what is left above the resident set at the start (:func:`current_rss`),
less a margin for the allocator's slack. Every size below is derived from it; the bytes
per item are what the passes hold at once, measured on this code (see the comments).
"""

from __future__ import annotations

import re
import resource
from dataclasses import dataclass, replace

from sarcompile.errors import PartitionError

__all__ = ["Budget", "current_rss", "parse_size", "peak_rss"]

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

MARGIN = 64 * 2**20  # the allocator's free lists and fragmentation, Python objects
# Per node, held through a run: labels, cluster sizes and weights, parts, local rows and
# their sort (int64 each), degrees; measured 240-260 bytes at 4M-16M nodes.
NODE_BYTES = 256
CHUNK_EDGE_BYTES = 160  # per streamed edge: the chunk, both directions, keys and sort temporaries
BUCKET_ENTRY_BYTES = 96  # per adjacency entry of a loaded bucket: two ids, key, unique's sort
METIS_ENTRY_BYTES = 72  # per coarse adjacency entry: CSR and weights (24) + METIS itself (~40, measured)
METIS_NODE_BYTES = 640  # per coarse node in METIS (measured 380-630 on 200k-1M node graphs)
IN_MEMORY_EDGE_BYTES = 300  # today's path per edge: src, dst, the symmetric CSR's unique, METIS (~250 measured)


def parse_size(text: str) -> int:
    """``"8GiB"``, ``"1.5GB"``, ``"512MiB"`` or a plain number of bytes, as bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise PartitionError(f"cannot read the size {text!r}: write e.g. 8GiB, 1.5GB or 512MiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def current_rss() -> int:
    """The process's resident set now, in bytes."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:  # no procfs: the peak is an upper bound
        return peak_rss()


def peak_rss() -> int:
    """The process's peak resident set so far, in bytes: ``VmHWM``, this process's own.
    (``getrusage``'s ``ru_maxrss`` also counts the parent's resident set at the fork that
    started it, so a process started from a large one reports that one's size.)"""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass(frozen=True)
class Budget:
    """What a partition run may hold: ``limit`` bytes of peak RSS, of which ``baseline``
    were resident when it started, and arrays of :data:`NODE_BYTES` for each of
    ``num_nodes`` nodes held throughout (0 until :meth:`for_nodes` is called)."""

    limit: int
    baseline: int
    num_nodes: int = 0

    @classmethod
    def start(cls, limit: int) -> "Budget":
        return cls(limit, current_rss())

    @property
    def total(self) -> int:
        """Bytes above the baseline and the margin."""
        return self.limit - self.baseline - MARGIN

    @property
    def work(self) -> int:
        """Bytes a pass may hold at once beside the per-node arrays."""
        return self.total - self.num_nodes * NODE_BYTES

    def for_nodes(self, num_nodes: int) -> "Budget":
        """This budget with the per-node arrays of ``num_nodes`` nodes reserved; a limit that
        leaves the passes less than a quarter is refused, saying how much would do."""
        budget = replace(self, num_nodes=num_nodes)
        if budget.work < self.total // 4:
            least = self.baseline + MARGIN + num_nodes * NODE_BYTES * 4 // 3
            raise PartitionError(
                f"a memory limit of {_mib(self.limit)} is too small for {num_nodes} nodes: this process "
                f"already holds {_mib(self.baseline)} and the per-node arrays need {_mib(num_nodes * NODE_BYTES)}; "
                f"give --memory-limit at least {_mib(least)}"
            )
        return budget

    @property
    def chunk_edges(self) -> int:
        """Edges per streamed chunk."""
        return _clamp(self.work // 4 // CHUNK_EDGE_BYTES, 1 << 12, 1 << 24)

    @property
    def bucket_entries(self) -> int:
        """Adjacency entries per on-disk bucket, loaded one at a time."""
        return _clamp(self.work // 4 // BUCKET_ENTRY_BYTES, 1 << 12, 1 << 27)

    @property
    def metis_entries(self) -> int:
        """Adjacency entries of the largest graph METIS is given (half the passes' share, with its nodes)."""
        return max(self.work // 2 // METIS_ENTRY_BYTES, 1 << 10)

    def metis_fits(self, num_nodes: int, entries: int) -> bool:
        return num_nodes * METIS_NODE_BYTES + entries * METIS_ENTRY_BYTES <= self.work // 2

    def in_memory_fits(self, num_nodes: int, num_edges: int) -> bool:
        """Whether today's whole-graph METIS (load everything, :func:`sarcompile.data.partitioning.assign`)
        fits: then the out-of-core run gives exactly its assignment."""
        return num_nodes * (NODE_BYTES + METIS_NODE_BYTES) + num_edges * IN_MEMORY_EDGE_BYTES <= self.total


def _clamp(value: int, low: int, high: int) -> int:
    return int(min(max(value, low), high))


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"
