"""Writing a typed dataset in ogbn-mag's on-disk layout, as OGB's mag.zip extracts, so that
:func:`sarcompile.load_ogb_mag` (through the ``ogb`` package) reads it back: for the
trainer's tests and its acceptance run (``benchmarks/train_mag.py``) on MAG-like graphs
of any size.

>>> import tempfile, pathlib
>>> from sarcompile.data.synthetic import mag_like
>>> ds = mag_like(40, 30, 3, 5, features=4, num_classes=3, add_reverse=False)
>>> root = write_mag(pathlib.Path(tempfile.mkdtemp()), ds)
>>> import sarcompile as sc
>>> sc.load_ogb_mag(root).graph.num_nodes("paper")
40
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch

from sarcompile.data.datasets import SPLIT_OF_MASK, HeteroDataset

# float32 to text and back exactly: 9 significant digits identify every float32
FLOAT_FORMAT = "%.9g"


def _write(path: Path, rows: np.ndarray, fmt: str = "%d", header: list[str] | None = None) -> None:
    """A gzip'd CSV as OGB's: no header except the per-type tables. Level 1: the files are
    large and read once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = np.asarray(rows)
    with gzip.open(path, "wb", compresslevel=1) as f:
        if header:
            f.write((",".join(header) + "\n").encode())
        np.savetxt(f, rows.reshape(len(rows), -1), fmt=fmt, delimiter=",")


def _flags(path: Path, types: list[str], which: str) -> None:
    line = ",".join(str(t == which) for t in types)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(",".join(types) + "\n" + line + "\n")


def write_mag(root: Path, ds: HeteroDataset) -> Path:
    """Write ``ds`` under ``root/ogbn_mag`` and return ``root`` (what load_ogb_mag takes).

    ``ds`` is an ogbn-mag-shaped dataset without reverse relations (the loader adds them):
    every relation goes to ``raw/relations``, the target type's ``x`` and ``y`` to
    ``raw/node-feat`` and ``raw/node-label``, its masks to the ``time`` split. The target
    type is OGB's ``paper``."""
    if any(rel[1].startswith("rev_") for rel in ds.graph.edge_types):
        raise ValueError("write the dataset without reverse relations (mag_like(add_reverse=False)): "
                         "load_ogb_mag adds them")
    if ds.target_type != "paper":
        raise ValueError(f"ogbn-mag's labelled type is 'paper', not {ds.target_type!r}")
    g, folder = ds.graph, root / "ogbn_mag"
    raw, types = folder / "raw", list(g.node_types)
    _write(raw / "num-node-dict.csv.gz", np.array([[g.num_nodes(t) for t in types]]), header=types)
    (raw / "triplet-type-list.csv.gz").parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(raw / "triplet-type-list.csv.gz", "wt") as f:
        f.writelines(",".join(rel) + "\n" for rel in g.edge_types)
    _flags(raw / "nodetype-has-label.csv.gz", types, "paper")
    for i, (rel, rg) in enumerate(g.items()):
        rel_dir = raw / "relations" / "___".join(rel)
        _write(rel_dir / "edge.csv.gz", torch.stack([rg.src, rg.dst], 1).numpy())
        _write(rel_dir / "num-edge-list.csv.gz", np.array([rg.num_edges]))
        _write(rel_dir / "edge_reltype.csv.gz", np.full(rg.num_edges, i))
    paper = ds.node_data["paper"]
    n = g.num_nodes("paper")
    _write(raw / "node-feat" / "paper" / "node-feat.csv.gz", paper["x"].numpy(), fmt=FLOAT_FORMAT)
    _write(raw / "node-feat" / "paper" / "node_year.csv.gz", np.full(n, 2019))
    _write(raw / "node-label" / "paper" / "node-label.csv.gz", paper["y"].numpy())
    split = folder / "split" / "time"
    _flags(split / "nodetype-has-split.csv.gz", types, "paper")
    for mask, part in SPLIT_OF_MASK.items():
        _write(split / "paper" / f"{part}.csv.gz", torch.nonzero(paper[mask]).flatten().numpy())
    (folder / "RELEASE_v2.txt").write_text("")
    return root
