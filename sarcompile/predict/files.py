"""A predictions directory: every worker's rows as ``.npy`` files, the manifest that lists
them, and :func:`read_predictions`, which gives them back in global node order.

Worker ``r`` writes, per node type it predicts (one-type graphs: one, unnamed), its nodes'
global ids and its rows of the output::

    part-{r}.ids.npy  part-{r}.values.npy                   # one-type graph
    {type}.part-{r}.ids.npy  {type}.part-{r}.values.npy     # typed graph, per node type

each written to a temporary name and renamed into place. Rank 0 writes ``predictions.json``
last, once every worker has written: per file its sha256, dtype and shape, per node type
its node count, and the world size, the model's identity (the run, the checkpoint's epoch
and sha256, its config) and the partition's (its graph sha256 and name, whose node ids the
rows are keyed by). A directory without the manifest is one whose writing did not finish.

Where the partition keeps the user's own node ids (:mod:`sarcompile.data.node_ids`: an edge
CSV partitioned with ``--own-ids``, an OGB dataset with its ``mapping/`` files), rank 0
copies its id files here as well (``node_ids.npy``, typed ``node_ids.{type}.npy``), after
checking them against the partition's manifest, and each output's ``user_ids`` records the
copy (file, sha256, kind, dtype, length): the directory maps its rows back to the user's
ids without the partition. ``read_predictions(DIR, ids=True)`` returns them with the rows.

:func:`read_predictions` checks the manifest and every file against it, then assembles the
rows once into ``global.npy`` (typed: ``{type}.global.npy``), in global node order, and
memory-maps it (copy-on-write: writing into the tensor changes no file). ``global.json``
records the assembled files' checksums for the manifest they came from, so later reads
check that file instead of assembling again. Where the directory is read-only the rows are
assembled in memory instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sarcompile.data.node_ids import ids_file_name, open_ids
from sarcompile.data.manifest import Manifest
from sarcompile.data.rundir import _atomic_write, _create_temp, _fsync_dir, _sha256
from sarcompile.errors import PartitionError, PredictionError

__all__ = ["FORMAT", "MANIFEST_NAME", "copy_user_ids", "is_ours", "read_predictions", "read_predictions_manifest",
           "record_user_ids", "write_rows"]

FORMAT = 1
MANIFEST_NAME = "predictions.json"
ASSEMBLED_NAME = "global.json"
_OURS = re.compile(r"(?:[\w-]+\.)?(?:part-\d+\.(?:ids|values)|global)\.npy|node_ids(?:\.[\w-]+)?\.npy|"
                   r"\..+\.tmp|\.lock|"
                   + "|".join(re.escape(n) for n in (MANIFEST_NAME, ASSEMBLED_NAME)))


def is_ours(name: str) -> bool:
    """Whether a file of that name is one a predictions directory holds (or its lock, or a
    temporary file of an interrupted write)."""
    return _OURS.fullmatch(name) is not None


def _stem(ntype: str | None, index: int) -> str:
    """The file name prefix of a node type's files: its name where it is a plain word."""
    if ntype is None:
        return ""
    return f"{ntype}." if re.fullmatch(r"[\w-]+", ntype) else f"type{index}."


def write_rows(out: Path, rank: int, ntype: str | None, index: int, ids: torch.Tensor,
               values: torch.Tensor) -> dict[str, Any]:
    """Write worker ``rank``'s rows of node type ``ntype`` (the ``index``-th predicted; None
    on a one-type graph): its nodes' global ``ids`` and their ``values``. Returns the
    manifest's record of the two files. bfloat16, which ``.npy`` lacks, is written as float32."""
    if values.dtype == torch.bfloat16:
        values = values.float()
    arrays = {"ids": ids.detach().cpu().to(torch.int64).numpy(), "values": values.detach().cpu().contiguous().numpy()}
    record: dict[str, Any] = {"rank": rank, "rows": int(ids.numel())}
    for kind, array in arrays.items():
        path = out / f"{_stem(ntype, index)}part-{rank}.{kind}.npy"
        _atomic_write(path, lambda f, a=array: np.save(f, a, allow_pickle=False))
        record[kind] = {"file": path.name, "sha256": _sha256(path), "dtype": str(array.dtype),
                        "shape": list(array.shape)}
    return record


def record_user_ids(manifest: Manifest, outputs: list[dict[str, Any]]) -> None:
    """Set every output's ``user_ids``: the record of the copy of the partition's id file of
    its node type that :func:`copy_user_ids` makes (None where the partition has none)."""
    records = manifest.node_ids or {}
    for index, output in enumerate(outputs):
        record = records.get(output["type"]) if manifest.typed else manifest.node_ids
        output["user_ids"] = None if record is None else {**record, "file": ids_file_name(output["type"], index)}


def copy_user_ids(parts: Path, manifest: Manifest, out: Path, outputs: list[dict[str, Any]]) -> None:
    """Rank 0: copy the id files :func:`record_user_ids` recorded from the partition ``parts``
    into ``out``, each checked first: a missing or damaged one raises :class:`PartitionError`."""
    records = manifest.node_ids if manifest.typed else {None: manifest.node_ids}
    for output in outputs:
        if output["user_ids"] is None:
            continue
        open_ids(parts, records[output["type"]], PartitionError, f"re-run sarcompile partition for '{parts}'")
        with open(parts / records[output["type"]]["file"], "rb") as source:
            _atomic_write(out / output["user_ids"]["file"], lambda f: shutil.copyfileobj(source, f, 1 << 24))


def read_predictions_manifest(directory: str | os.PathLike) -> tuple[dict[str, Any], str]:
    """The manifest of a predictions directory and its sha256, or a :class:`PredictionError`."""
    path = Path(directory) / MANIFEST_NAME
    if not Path(directory).is_dir():
        raise PredictionError(f"predictions directory '{directory}' does not exist: run "
                              "`python -m sarcompile.predict --run-dir RUN --parts P --out DIR` first")
    if not path.is_file():
        raise PredictionError(f"'{directory}' has no {MANIFEST_NAME}: no predictions were written there, or the "
                              "run that wrote them did not finish; run sarcompile.predict again")
    try:
        text = path.read_bytes()
        manifest = json.loads(text)
    except (OSError, ValueError) as e:
        raise PredictionError(f"cannot read '{path}' ({e}): the manifest is damaged; run sarcompile.predict "
                              "again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or "outputs" not in manifest:
        raise PredictionError(f"'{path}' is not a predictions manifest of this version of sarcompile (format "
                              f"{FORMAT}); run sarcompile.predict again")
    return manifest, hashlib.sha256(text).hexdigest()


def read_predictions(directory: str | os.PathLike, ids: bool = False) -> Any:
    """Every node's row of the predictions (or ``--layer`` embeddings) that
    ``python -m sarcompile.predict --out DIR`` wrote, in global node order: a tensor
    ``[num_nodes, ...]``, or a dict of them per node type for a typed graph. Memory-mapped
    copy-on-write from ``DIR/global.npy`` (assembled by the first read; see the module).

    With ``ids=True``: ``(user_ids, rows)``, where ``user_ids[i]`` is the user's own id of
    row ``i`` (a read-only memory-mapped numpy array of int64 or strings; a dict per node
    type for a typed graph), for a partition that keeps them (:mod:`sarcompile.data.node_ids`).
    Predictions of a partition made from ids ``0..n-1`` (row ``i`` is node ``i``), or a
    missing or damaged id file, raise a :class:`PredictionError`.

    A missing, truncated or changed file, or rows that do not cover every node exactly
    once, raise a :class:`PredictionError` naming the file and what to do.

    Example (after ``torchrun ... -m sarcompile.predict --run-dir runs/products --parts p4 --out pred``):

    >>> out = sc.read_predictions("pred")   # doctest: +SKIP
    >>> out.shape, out.argmax(-1)[:3]       # doctest: +SKIP
    (torch.Size([2449029, 47]), tensor([4, 4, 7]))
    >>> asins, out = sc.read_predictions("pred", ids=True)   # doctest: +SKIP
    >>> asins[:3]                                           # doctest: +SKIP
    array(['B00004SB92', 'B00004T2XA', 'B00004T2Y0'], dtype='<U10')
    """
    directory = Path(directory)
    manifest, digest = read_predictions_manifest(directory)
    assembled = _assembled_record(directory, digest)
    result, changed = {}, False
    for index, output in enumerate(manifest["outputs"]):
        name = f"{_stem(output['type'], index)}global.npy"
        path = directory / name
        if name in assembled and path.is_file() and _sha256(path) == assembled[name]:
            result[output["type"]] = _mapped(path)
            continue
        rows = _assemble(directory, output, path)
        if isinstance(rows, Path):
            assembled[name], changed = _sha256(rows), True
            rows = _mapped(rows)
        result[output["type"]] = rows
    if changed:
        try:
            text = json.dumps({"manifest_sha256": digest, "files": assembled}, indent=1) + "\n"
            _atomic_write(directory / ASSEMBLED_NAME, lambda f: f.write(text.encode()))
        except OSError:  # a read-only directory keeps no record: the next read assembles again
            pass
    rows = result if manifest["typed"] else result[None]
    if not ids:
        return rows
    user_ids = {o["type"]: _user_ids(directory, o) for o in manifest["outputs"]}
    return (user_ids if manifest["typed"] else user_ids[None]), rows


def _user_ids(directory: Path, output: dict[str, Any]) -> np.ndarray:
    """An output's user ids (the copy :func:`copy_user_ids` made), checked and memory-mapped."""
    record = output.get("user_ids")
    if record is None:
        what = f"node type {output['type']!r} of " if output["type"] is not None else ""
        raise PredictionError(f"{what}the partition these predictions in '{directory}' were made on keeps no node ids "
                              "of yours (it was made from ids 0..n-1: row i is node i); partition with --own-ids, "
                              "or from OGB files with their mapping/ folder, to get them")
    return open_ids(directory, record, PredictionError, "run sarcompile.predict again")


def _mapped(path: Path) -> torch.Tensor:
    return torch.from_numpy(np.load(path, mmap_mode="c", allow_pickle=False))


def _assembled_record(directory: Path, digest: str) -> dict[str, str]:
    """The checksums of the assembled files, if they were assembled from this manifest."""
    try:
        record = json.loads((directory / ASSEMBLED_NAME).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict) or record.get("manifest_sha256") != digest:
        return {}
    return dict(record.get("files") or {})


def _assemble(directory: Path, output: dict[str, Any], path: Path) -> Path | torch.Tensor:
    """One node type's rows from every part file, checked, put in global order: into
    ``path`` (returned once renamed into place), or into memory where ``path`` cannot be
    written."""
    what = f"node type {output['type']!r}" if output["type"] is not None else "the nodes"
    shape, dtype = tuple(output["shape"]), np.dtype(output["dtype"])
    tmp = None
    try:
        fd, tmp = _create_temp(path)
        os.close(fd)
        rows = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
    except OSError:
        rows = np.empty(shape, dtype=dtype)
    try:
        seen = np.zeros(output["num_nodes"], dtype=bool)
        for part in output["parts"]:
            ids, values = (_checked(directory, part[kind], kind) for kind in ("ids", "values"))
            if ids.size and (ids.min() < 0 or ids.max() >= output["num_nodes"]):
                raise PredictionError(f"'{directory / part['ids']['file']}' holds node ids outside "
                                      f"[0, {output['num_nodes']}) of {what}; run sarcompile.predict again")
            if seen[ids].any() or len(np.unique(ids)) != ids.size:
                raise PredictionError(f"'{directory / part['ids']['file']}' holds rows of nodes another file "
                                      f"holds too; run sarcompile.predict again")
            seen[ids] = True
            rows[ids] = values
        if not seen.all():
            raise PredictionError(f"{int((~seen).sum())} of {what} have no row in '{directory}' (e.g. node "
                                  f"{int(np.flatnonzero(~seen)[0])}); run sarcompile.predict again")
        if tmp is None:
            return torch.from_numpy(rows)
        rows.flush()
        del rows
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def _checked(directory: Path, record: dict[str, Any], kind: str) -> np.ndarray:
    """A part's ``.npy`` file, memory-mapped, after checking it against its manifest record."""
    path = directory / record["file"]
    if not path.is_file():
        raise PredictionError(f"'{path}' is missing: the predictions in '{directory}' are incomplete; run "
                              "sarcompile.predict again")
    if _sha256(path) != record["sha256"]:
        raise PredictionError(f"'{path}' does not match the checksum in {MANIFEST_NAME}: the file is damaged or "
                              "from another run; run sarcompile.predict again")
    array = np.load(path, mmap_mode="r", allow_pickle=False)
    if list(array.shape) != record["shape"] or str(array.dtype) != record["dtype"]:
        raise PredictionError(f"'{path}' holds {array.dtype} {list(array.shape)}, the manifest says "
                              f"{record['dtype']} {record['shape']} ({kind}); run sarcompile.predict again")
    return array
