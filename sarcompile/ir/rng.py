"""Counter-based random numbers: a uniform draw is a hash of (key, salt), not RNG state.

Dropout masks drawn this way depend only on *which* node or edge an entry belongs to, so
they are the same however the graph is split across workers, and the backward pass can
draw the same mask again instead of storing it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from sarcompile.ir.opdef import EDGE_CHUNK_ELEMENTS

__all__ = ["edge_keep", "keep", "mix32", "node_keep", "normal_rows", "site_salt", "uniform"]

_MASK32 = 0xFFFFFFFF


def mix32(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (two multiply-xorshift rounds) of int64 values in [0, 2^32).

    The multiplier stays below 2^27, so products fit in int64 without overflow."""
    h = (((h >> 16) ^ h) * 0x45D9F3B) & _MASK32
    h = (((h >> 16) ^ h) * 0x45D9F3B) & _MASK32
    return (h >> 16) ^ h


def _hash(keys: torch.Tensor, salt: torch.Tensor) -> torch.Tensor:
    """A 32-bit hash of every non-negative int64 key and the salt, on the salt's device (a
    model's buffer: where the model is), wherever the keys are. The keys' high half goes
    through its own round; keys below 2^32 (every node and edge key of a graph of fewer
    than 4 billion entries) share it, so it is hashed once, not per key."""
    keys = keys.to(salt.device)
    if keys.numel() and int(keys.max()) <= _MASK32:
        salted = mix32(mix32(salt & _MASK32))  # (keys >> 32) is 0 for all: one scalar round
        return mix32(keys ^ salted)
    salted = mix32((keys >> 32) ^ mix32(salt & _MASK32))
    return mix32((keys & _MASK32) ^ salted)


def uniform(keys: torch.Tensor, salt: torch.Tensor) -> torch.Tensor:
    """A float64 in [0, 1) for every non-negative int64 key, a pure function of (key, salt)."""
    return _hash(keys, salt).to(torch.float64) / 2.0**32


def keep(keys: torch.Tensor, salt: torch.Tensor, p: float) -> torch.Tensor:
    """Whether each key is kept by dropout of probability ``p``: ``uniform(keys, salt) >=
    p``, compared on the integer hash (``h / 2^32 >= p`` exactly when ``h >=
    ceil(p * 2^32)``, both sides exact in float64), with no float draws made."""
    return _hash(keys, salt) >= math.ceil(p * 2.0**32)


def _entry_keys(ids: torch.Tensor, width: int) -> Iterator[tuple[slice, torch.Tensor]]:
    """``(rows, keys)`` for bounded slices of ``ids``: the key ``id * width + position`` of
    each of the ``width`` entries of those rows. :data:`~sarcompile.ir.opdef.EDGE_CHUNK_ELEMENTS`
    entries at a time: the int64 keys and hash temporaries of every entry at once would be
    several times the values drawn from them."""
    step = max(1, EDGE_CHUNK_ELEMENTS // max(width, 1))
    for lo in range(0, ids.numel(), step):
        rows = slice(lo, lo + step)
        yield rows, ids[rows].long().unsqueeze(1) * width + torch.arange(width)  # (a shard's ids may be int32)


def _kept_chunks(ids: torch.Tensor, width: int, p: float, salt: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
    """``(rows, kept)`` for bounded slices of ``ids``: whether each of the ``width`` entries
    of those rows is kept by dropout of probability ``p``, keyed by (id, position, salt)."""
    for rows, keys in _entry_keys(ids, width):
        yield rows, keep(keys, salt, p)


def normal_rows(ids: torch.Tensor, width: int, salt: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal draws ``[len(ids), width]``, entry ``(i, j)`` a pure function of
    ``(ids[i], j, salt)``: row ``r`` of a table is the same whichever rows are drawn with
    it, so a worker draws only its own rows of a table one machine draws whole.

    The inverse normal CDF of the hash's uniform at the middle of its 2^32 bins (never 0
    or 1), in float64: the N(0, 1) of ``nn.Embedding``'s initialisation, its tails cut at
    6.2 standard deviations (where 2^-32 of the mass is)."""
    out = torch.empty((ids.numel(), width), dtype=dtype, device=salt.device)
    for rows, keys in _entry_keys(ids, width):
        u = (_hash(keys, salt).to(torch.float64) + 0.5) / 2.0**32
        out[rows] = torch.special.ndtri(u).to(dtype)
    return out


def edge_keep(edge_ids: torch.Tensor, heads: int, p: float, salt: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Dropout multiplier ``[E, heads]`` (0 or 1/(1-p)) keyed by global edge id and head, so
    every worker draws the same mask for an edge and backward draws it again."""
    out = torch.empty((edge_ids.numel(), heads), dtype=dtype, device=salt.device)
    for rows, kept in _kept_chunks(edge_ids, heads, p, salt):
        out[rows] = kept.to(dtype) / (1.0 - p)
    return out


def node_keep(ids: torch.Tensor, x: torch.Tensor, p: float, salt: torch.Tensor) -> torch.Tensor:
    """Whether each entry of ``x`` (a row per node, ``ids`` their global ids) is kept by
    dropout of probability ``p``, as a bool tensor of ``x``'s shape keyed by (node id,
    position in the row, salt)."""
    width = x[0].numel() if x.shape[0] else 1
    kept = torch.empty((x.shape[0], width), dtype=torch.bool, device=x.device)
    for rows, chunk in _kept_chunks(ids, width, p, salt):
        kept[rows] = chunk
    return kept.reshape(x.shape)


def site_salt(salt: torch.Tensor, site: int) -> torch.Tensor:
    """The salt of the ``site``-th dropout of a program: one step's salt mixed with the site,
    so that two dropouts of one step draw independent masks."""
    return salt ^ mix32(torch.tensor(site + 1, dtype=torch.long))
