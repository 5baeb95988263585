"""OGB's homogeneous datasets read from their raw files a chunk at a time, for
:func:`partition_files`: what :func:`sarcompile.data.datasets.load_ogb` gives, never whole.

``load_ogb`` goes through the ``ogb`` package, which parses every raw file into memory
(and caches a pickle of all of it). Here each raw file is converted into raw binary
scratch files as it is read: OGB's gzip CSVs through pandas' chunked reader, the arrays
inside papers100M's ``data.npz`` in place where the zip stores them uncompressed (else
decompressed as a stream). Edges come in the order ``ogb`` gives them; a dataset OGB
stores directed (arxiv, papers100M) is symmetrized as ``load_ogb`` does it (both
directions, each pair once, sorted), by writing out the adjacency buckets of
:mod:`.adjacency` with the self-loops merged back in. Labels get -1 where missing, the
split becomes boolean masks, and the files are checked first, with ``load_ogb``'s errors.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sarcompile.data.datasets import SPLIT_OF_MASK, _check_files, _mask, _meta, _read_split, ogb_mapping_file, \
    read_ogb_mapping
from sarcompile.data.node_ids import Ids
from sarcompile.errors import DatasetError
from sarcompile.data.manifest import Manifest
from sarcompile.data.outofcore.adjacency import build_buckets
from sarcompile.data.outofcore.convert import ScratchWriter, read_csv
from sarcompile.data.outofcore.partition import locked_scratch, start_budget, write_partition
from sarcompile.data.outofcore.sources import DiskArray, EdgeFiles

__all__ = ["StreamedDataset", "partition_ogb", "stream_ogb"]

CSV_NEEDED = ("edge", "num-node-list", "node-feat", "node-label")


@dataclass
class StreamedDataset:
    """A dataset as files: its edges and node tensors on disk, in ``load_ogb``'s form."""

    name: str
    edges: EdgeFiles
    node_data: dict[str, DiskArray]
    num_classes: int
    symmetrized: bool
    node_ids: Ids | None = None  # OGB's id of every node (load_ogb's node_ids), on disk where integers


def partition_ogb(
    name: str, root: str | Path, num_parts: int, out_dir: str | Path, *, symmetrize: bool | None = None,
    method: str = "metis", seed: int = 0, memory_limit: int | str | None = None,
    scratch_dir: str | Path | None = None, log: Callable[[str], None] = lambda s: None,
) -> tuple[Manifest, StreamedDataset]:
    """:func:`.partition_files` of an OGB dataset read from its raw files (see the module
    docstring): the directory ``sarcompile.partition`` writes for ``load_ogb``'s dataset."""
    budget = start_budget(num_parts, method, memory_limit)
    with locked_scratch(Path(out_dir), scratch_dir) as scratch:
        ds = stream_ogb(name, root, scratch, budget.chunk_edges, symmetrize, log)
        budget = budget.for_nodes(ds.edges.num_nodes)
        manifest = write_partition(ds.edges, ds.node_data, num_parts, Path(out_dir), scratch, budget, method=method,
                                   seed=seed, name=name, allow_nonfinite=False, log=log, node_ids=ds.node_ids)
    return manifest, ds


def stream_ogb(name: str, root: str | Path, scratch: Path, chunk_rows: int, symmetrize: bool | None = None,
               log: Callable[[str], None] = lambda s: None) -> StreamedDataset:
    """Convert dataset ``name`` under ``root`` (laid out as for ``load_ogb``) into files in
    ``scratch``, ``chunk_rows`` rows at a time."""
    meta = _meta(name)
    folder = Path(root) / name.replace("-", "_")
    binary = meta["binary"] == "True"
    _check_files(name, folder, meta, _raw_files(binary))
    raw = folder / "raw"
    writer = ScratchWriter(scratch, chunk_rows)
    if binary:
        n = int(_npz_array(raw / "data.npz", "num_nodes_list", scratch).read(0, 1)[0])
        edge_index = _npz_array(raw / "data.npz", "edge_index", scratch)
        src, dst = (_row(edge_index, i) for i in range(2))
        feat = _npz_array(raw / "data.npz", "node_feat", scratch)
        x = writer.convert("x", _chunks(feat, _rows(chunk_rows, feat.row_bytes)), np.float32)
        labels = _chunks(_npz_array(raw / "node-label.npz", "node_label", scratch), chunk_rows)
    else:
        n = int(np.loadtxt(raw / "num-node-list.csv.gz", dtype=np.int64, ndmin=1)[0])
        pairs = read_csv(raw / "edge.csv.gz", np.int64, chunk_rows)
        if meta["add_inverse_edge"] == "True":  # ogb interleaves: each edge, then its reverse
            pairs = (np.repeat(p, 2, axis=0) for p in pairs)
            pairs = (np.where(np.arange(len(p))[:, None] % 2 == 1, p[:, ::-1], p) for p in pairs)
        src, dst = writer.edges(pairs)
        width = _csv_width(raw / "node-feat.csv.gz")
        # As ogb does: parsed as float64, then float32.
        x = writer.convert("x", read_csv(raw / "node-feat.csv.gz", np.float64, _rows(chunk_rows, 8 * width)), np.float32)
        labels = read_csv(raw / "node-label.csv.gz", np.float64, chunk_rows)
    if x.rows != n:
        raise DatasetError(f"{name}: expected node features with {n} rows, got {x.rows}")
    y = writer.labels(labels, name)
    if y.rows != n:
        raise DatasetError(f"{name}: expected one label per node ({n}), got {y.rows}")
    edges = EdgeFiles(src, dst, n)
    symmetrize = meta["add_inverse_edge"] != "True" if symmetrize is None else symmetrize
    if symmetrize:
        log(f"{name}: symmetrizing {edges.num_edges} edges")
        edges = _symmetrized(edges, writer)
    split = _read_split(name, folder, meta)
    node_data = {"x": x, "y": y}
    for mask, part in SPLIT_OF_MASK.items():
        node_data[mask] = writer.array(mask, _mask(split[part], n, name, part).numpy())
    mapping = ogb_mapping_file(folder)
    ids = None if mapping is None else read_ogb_mapping(mapping, n, chunk_rows,
                                                         lambda chunks: writer.convert("node_ids", chunks, np.int64))
    return StreamedDataset(name, edges, node_data, int(meta["num classes"]), symmetrize, ids)


def _raw_files(binary: bool) -> Callable[[Path, dict[str, str]], list[Path]]:
    """The files read here: always the raw ones (ogb's processed cache is one pickle)."""
    def needed(folder: Path, meta: dict[str, str]) -> list[Path]:
        raw = folder / "raw"
        files = [raw / "data.npz", raw / "node-label.npz"] if binary else [raw / f"{f}.csv.gz" for f in CSV_NEEDED]
        split = folder / "split" / meta["split"]
        if not (split / "split_dict.pt").is_file():
            files += [split / f"{part}.csv.gz" for part in ("train", "valid", "test")]
        return files
    return needed


def _symmetrized(edges: EdgeFiles, writer: ScratchWriter) -> EdgeFiles:
    """Both directions of every edge, each pair once, sorted by (src, dst), self-loops as
    given: the adjacency buckets (which drop self-loops) with the loops merged back."""
    n = edges.num_nodes
    looped = np.zeros(n, dtype=bool)
    for _, src, dst in edges.chunks(writer.chunk_rows):
        looped[src[src == dst]] = True
    buckets = build_buckets(edges, writer.scratch, writer.chunk_rows, max(writer.chunk_rows, 1 << 12))

    def pairs():
        for block in buckets.blocks():
            loops = np.flatnonzero(looped[block.lo : block.hi]) + block.lo
            key = np.sort(np.concatenate([block.a * n + block.b, loops * (n + 1)]))
            yield np.stack([key // n, key % n], axis=1)

    src, dst = writer.edges(pairs())
    for path in buckets.files:
        path.unlink()
    return EdgeFiles(src, dst, n)


def _row(array: DiskArray, i: int) -> DiskArray:
    """Row ``i`` of a two-dimensional array, as a one-dimensional array."""
    count = array.shape[1]
    return DiskArray(array.path, (count,), array.dtype, array.offset + i * count * array.dtype.itemsize)


def _npz_array(path: Path, key: str, scratch: Path) -> DiskArray:
    """Member ``key`` of an ``.npz``: read in place when the zip stores it uncompressed
    (``np.savez``), else decompressed as a stream into ``scratch``."""
    try:
        with zipfile.ZipFile(path) as z:
            info = z.getinfo(f"{key}.npy")
            if info.compress_type == zipfile.ZIP_STORED:
                with open(path, "rb") as f:  # the data follows the member's local header
                    f.seek(info.header_offset + 26)
                    name_len, extra_len = np.frombuffer(f.read(4), dtype="<u2")
                    start = info.header_offset + 30 + int(name_len) + int(extra_len)
                return DiskArray.npy(path, start)
            out = scratch / f"{path.stem}-{key}.npy"
            with z.open(info) as member, open(out, "wb") as f:
                while block := member.read(1 << 24):
                    f.write(block)
            return DiskArray.npy(out)
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        raise DatasetError(f"cannot read {key!r} from '{path}' ({type(e).__name__}: {e}); re-extract OGB's zip") \
            from None


def _rows(chunk_rows: int, row_bytes: int) -> int:
    """Rows of ``row_bytes`` each that hold what ``chunk_rows`` edges (two int64) would."""
    return max(1, chunk_rows * 16 // max(row_bytes, 1))


def _csv_width(path: Path) -> int:
    """The number of columns of a gzip CSV, from its first line."""
    import gzip

    try:
        with gzip.open(path, "rt") as f:
            return f.readline().count(",") + 1
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DatasetError(f"cannot read '{path}' ({type(e).__name__}: {e}); re-extract OGB's zip") from None


def _chunks(array: DiskArray, rows: int) -> Iterator[np.ndarray]:
    return (chunk for _, chunk in array.chunks(rows))
