"""Part files written and read back: atomically, under the directory's lock, checked
against the manifest.

Every file is written to a temporary name and renamed into place, and the manifest is
removed before any part changes and written last: a run that dies half-way leaves a
directory that refuses to load rather than one that mixes two partitionings. A partition
run locks the directory (``.lock``, see :mod:`sarcompile.data.rundir`), so a second one on the
same directory is refused, and deletes the temporary files a killed run left there.

A part file read back must match the manifest's checksum and halo sizes; a typed part
file (see :mod:`sarcompile.data.typed_partition`) holds one part per relation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from sarcompile.errors import PartitionError
from sarcompile.graph.hetero import parse_relation_key
from sarcompile.graph.shard import PartData
from sarcompile.data.manifest import MANIFEST, Manifest, PartInfo
from sarcompile.data.node_ids import IDS_FILES, write_node_ids
from sarcompile.data.rundir import _atomic_write, _fsync_dir, _sha256, lock_dir, remove_stale_temps

__all__ = ["write_directory", "write_locked", "read_part", "read_part_file", "read_typed"]


def write_directory(
    out: Path, parts: Sequence[tuple[dict, Callable[[int], PartInfo]]],
    manifest_of: Callable[[list[PartInfo]], Manifest], node_ids: Any = None,
) -> Manifest:
    """Write every part (its saved dict, and what makes its manifest entry once written),
    the user's node ids where given (see :mod:`.node_ids`) and then the manifest, atomically and under the directory's lock
    (see the module docstring); returns the manifest."""
    with lock_dir(out, "partition run"):  # creates out
        return write_locked(out, len(parts), iter(parts), manifest_of, node_ids)


def write_locked(
    out: Path, num_parts: int, parts: Iterator[tuple[dict, Callable[[int], PartInfo]]],
    manifest_of: Callable[[list[PartInfo]], Manifest], node_ids: Any = None,
) -> Manifest:
    """:func:`write_directory` for a caller that holds ``out``'s lock already, with the
    parts made one at a time as ``parts`` yields them (only one is ever in memory)."""
    # Temporary files of a killed run can go: nobody else writes here while we hold the lock.
    remove_stale_temps(out, ["part-*.pt", MANIFEST, IDS_FILES])
    # From here until the new manifest lands the directory must not load: drop the old
    # manifest first (durably) so old and new part files can never be read as one set.
    (out / MANIFEST).unlink(missing_ok=True)
    _fsync_dir(out)
    _remove_stale_parts(out, num_parts)
    for stale in out.glob(IDS_FILES):  # another graph's ids must not outlive its manifest
        stale.unlink()
    infos = []
    for r, (payload, info) in enumerate(parts):
        path = _write_part(out, r, payload)
        del payload  # a part can be large: drop it before the next is made
        infos.append(replace(info(r), file=path.name, sha256=_sha256(path), bytes=path.stat().st_size))
    if len(infos) != num_parts:
        raise PartitionError(f"internal error: {len(infos)} parts written of {num_parts}")
    manifest = manifest_of(infos)
    if node_ids is not None:
        manifest = replace(manifest, node_ids=write_node_ids(out, node_ids))
    _atomic_write(out / MANIFEST, lambda f: f.write(manifest.to_json().encode()))
    return manifest


def _write_part(out: Path, rank: int, payload: dict) -> Path:
    """Write ``part-{rank}.pt`` atomically; its path."""
    path = out / f"part-{rank}.pt"
    _atomic_write(path, lambda f: torch.save(payload, f))
    return path


def _remove_stale_parts(out: Path, num_parts: int) -> None:
    """Delete part files of an earlier partitioning into more parts (they may be large)."""
    for path in out.glob("part-*.pt"):
        index = path.stem.removeprefix("part-")
        if index.isdigit() and int(index) >= num_parts:
            path.unlink()


def read_part(out_dir: str | os.PathLike, manifest: Manifest, rank: int, mmap: bool = False) -> PartData:
    """Part ``rank``, after checking it exists and matches the manifest's checksum and halos.
    With ``mmap``, its tensors are copy-on-write views of the mapped file."""
    path, saved = read_part_file(out_dir, manifest, rank, mmap)
    part = _as_part(saved, path)
    _check_halos(part, manifest.halo_sizes, rank, path)
    return part


def read_part_file(
    out_dir: str | os.PathLike, manifest: Manifest, rank: int, mmap: bool = False,
) -> tuple[Path, dict]:
    """The path and saved contents of part ``rank``'s file, after checking it exists and
    matches the manifest's checksum."""
    info = manifest.parts[rank]
    path = Path(out_dir) / info.file
    if not path.is_file():
        raise PartitionError(f"part file '{path}' is missing; re-run partition")
    if _sha256(path) != info.sha256:
        raise PartitionError(
            f"part file '{path}' does not match the manifest's checksum: "
            "file corrupt or from another partitioning; re-run partition"
        )
    return path, _load_part(path, mmap)


def _load_part(path: Path, mmap: bool) -> dict:
    try:
        # weights_only (in every torch >= 2.2 this package supports) refuses arbitrary pickles.
        # (a str: torch 2.2 maps only a file named by one)
        saved = torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # unpickling raises many types; every one means the same here
        if mmap:  # a file system that cannot map files: read it whole (a damaged file fails there too)
            return _load_part(path, mmap=False)
        raise PartitionError(f"cannot read part file '{path}' ({type(e).__name__}: {e}); re-run partition") from None
    if not isinstance(saved, dict):
        raise PartitionError(f"part file '{path}' holds a {type(saved).__name__}, not a part; re-run partition")
    return saved


def _as_part(saved: dict, path: Path) -> PartData:
    try:
        return PartData(**saved)
    except TypeError as e:
        raise PartitionError(f"part file '{path}' is not a part of this format ({e}); re-run partition") from None


def read_typed(out_dir: str | os.PathLike, manifest: Manifest, rank: int) -> tuple[Path, dict, dict]:
    """(path, saved dict, relations as PartData by triple), checked against the manifest."""
    path, saved = read_part_file(out_dir, manifest, rank)
    if set(saved) != {"global_ids", "node_data", "relations"}:
        raise PartitionError(f"part file '{path}' is not a typed part (keys {sorted(saved)}); re-run partition")
    ids = saved["global_ids"]
    if set(ids) != set(manifest.node_types):
        raise PartitionError(f"part file '{path}' has node types {sorted(ids)} but the manifest "
                             f"{sorted(manifest.node_types)}; re-run partition")
    relations = {}
    for key, info in manifest.edge_types.items():
        if key not in saved["relations"]:
            raise PartitionError(f"part file '{path}' has no relation {key}; re-run partition")
        rel = parse_relation_key(key)
        part = _as_part({**saved["relations"][key], "global_ids": ids[rel[2]], "node_data": {}}, path)
        _check_halos(part, info["halo_sizes"], rank, path, f" of relation {key}")
        relations[rel] = part
    return path, saved, relations


def _check_halos(part: PartData, halo_sizes: list[list[int]], rank: int, path: Path, what: str = "") -> None:
    """The rows this part sends to each peer must be the halo sizes the manifest promises."""
    sent = [len(s) for s in part.send_index]
    promised = [halo_sizes[q][rank] for q in range(len(halo_sizes))]
    if sent != promised:
        raise PartitionError(
            f"part file '{path}' sends {sent} rows{what} to its peers but the manifest says {promised}; "
            "re-run partition"
        )
