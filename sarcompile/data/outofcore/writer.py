"""Part files written one at a time from scratch files, the same files
:func:`sarcompile.data.partitioning.partition` writes for the same assignment.

Two streaming passes scatter what each part needs into per-part scratch files: the edges
(``edge id, src, dst``, in edge order) into their destination's part, and every node
tensor's rows into their node's part (checked as they pass, in node order). A part is
then made from its own scratch files alone, except its send lists, which are the halos
other parts read from it: those are collected first, from every part's edges, and kept
(they are at most the cut's size). So memory holds one part, the per-node part and
local-row arrays, and the send lists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sarcompile.errors import GraphError
from sarcompile.data.manifest import PartInfo
from sarcompile.graph.shard import PartData, local_rows
from sarcompile.data.validate import check_node_data
from sarcompile.data.outofcore.sources import DiskArray, EdgeFiles

__all__ = ["PartWriter"]


@dataclass
class PartWriter:
    """Scatters a graph by ``parts`` into ``scratch`` and then makes each part's saved dict."""

    edges: EdgeFiles
    node_data: dict[str, DiskArray]
    parts: np.ndarray  # the part of every node
    num_parts: int
    scratch: Path
    chunk_edges: int
    allow_nonfinite: bool = False

    def __post_init__(self) -> None:
        _, counts, _, local = local_rows(torch.from_numpy(self.parts), self.num_parts)
        self.local = local.numpy()
        self.counts = counts.tolist()
        self.edge_cut = 0
        self.send: list[list[np.ndarray]] = []

    def scatter(self) -> None:
        """Both scatter passes, then the send lists."""
        self.edge_cut = self._scatter_edges()
        for key, array in self.node_data.items():
            self._scatter_rows(key, array)
        self.send = self._send_lists()

    def _edge_file(self, r: int) -> Path:
        return self.scratch / f"edges-{r}.bin"

    def _rows_file(self, key: str, r: int) -> Path:
        return self.scratch / f"rows-{key}-{r}.bin"

    def _scatter_edges(self) -> int:
        cut = 0
        with contextlib.ExitStack() as stack:
            outs = [stack.enter_context(open(self._edge_file(r), "wb")) for r in range(self.num_parts)]
            for start, src, dst in self.edges.chunks(self.chunk_edges):
                dst_part = self.parts[dst]
                cut += int((self.parts[src] != dst_part).sum())
                eid = np.arange(start, start + src.size, dtype=np.int64)
                _scatter(outs, dst_part, np.stack([eid, src, dst], axis=1))
        return cut

    def _scatter_rows(self, key: str, array: DiskArray) -> None:
        rows = max(1, self.chunk_edges * 24 // max(array.row_bytes, 1))  # about one edge chunk's bytes
        with contextlib.ExitStack() as stack:
            outs = [stack.enter_context(open(self._rows_file(key, r), "wb")) for r in range(self.num_parts)]
            for start, chunk in array.chunks(rows):
                ids = torch.arange(start, start + len(chunk))
                check_node_data({key: torch.from_numpy(chunk)}, ids=ids, allow_nonfinite=self.allow_nonfinite,
                                where="node_data", error=GraphError)
                _scatter(outs, self.parts[start : start + len(chunk)], chunk)

    def _read_edges(self, r: int) -> np.ndarray:
        return np.fromfile(self._edge_file(r), dtype=np.int64).reshape(-1, 3)

    def _send_lists(self) -> list[list[np.ndarray]]:
        """``send[q][r]``: the sorted local rows of part ``q`` that part ``r``'s edges read."""
        k, n = self.num_parts, max(self.parts.size, 1)
        send = [[np.empty(0, dtype=np.int64) for _ in range(k)] for _ in range(k)]
        for r in range(k):
            src = self._read_edges(r)[:, 1]
            q = self.parts[src]
            cross = q != r
            key = np.unique(q[cross] * n + self.local[src[cross]])
            owner = key // n
            for peer, rows in zip(range(k), np.split(key % n, np.cumsum(np.bincount(owner, minlength=k))[:-1])):
                send[peer][r] = rows
        return send

    def halo_sizes(self) -> list[list[int]]:
        """``[r][q]``: rows part ``r`` receives from ``q`` (the manifest's ``halo_sizes``)."""
        return [[len(self.send[q][r]) for q in range(self.num_parts)] for r in range(self.num_parts)]

    def payloads(self) -> Iterator[tuple[dict, Callable[[int], PartInfo]]]:
        """Each part's saved dict and manifest entry, one part at a time."""
        for r in range(self.num_parts):
            e = self._read_edges(r)
            eid, src, dst = (torch.from_numpy(e[:, i].copy()) for i in range(3))
            del e
            src_part = torch.from_numpy(self.parts[src.numpy()])
            part = PartData(
                global_ids=torch.from_numpy(np.flatnonzero(self.parts == r).astype(np.int64)),
                edge_src_part=src_part,
                edge_src_local=torch.from_numpy(self.local[src.numpy()]),
                edge_src_gid=src,
                edge_dst_local=torch.from_numpy(self.local[dst.numpy()]),
                edge_ids=eid,
                send_index=[torch.from_numpy(rows) for rows in self.send[r]],
                node_data={key: self._read_rows(key, array, r) for key, array in self.node_data.items()},
            )
            info = PartInfo(
                file="", num_nodes=self.counts[r], num_edges=int(eid.numel()), sha256="", bytes=0,
                self_loops=int((src == dst).sum()),
                block_edges=torch.bincount(src_part, minlength=self.num_parts).tolist(),
            )
            yield part.to_dict(), lambda rank, info=info: info

    def _read_rows(self, key: str, array: DiskArray, r: int) -> torch.Tensor:
        rows = np.fromfile(self._rows_file(key, r), dtype=array.dtype).reshape(self.counts[r], *array.shape[1:])
        return torch.from_numpy(rows)


def _scatter(outs: list, parts: np.ndarray, rows: np.ndarray) -> None:
    """Append each row of ``rows`` to ``outs[parts[i]]``, keeping their order within a part."""
    order = np.argsort(parts, kind="stable")
    counts = np.bincount(parts, minlength=len(outs))
    for out, piece in zip(outs, np.split(rows[order], np.cumsum(counts)[:-1])):
        np.ascontiguousarray(piece).tofile(out)
