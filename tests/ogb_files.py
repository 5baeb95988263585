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
from dataclasses import dataclass
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


NUM_NODES = 60


@dataclass
class Written:
    """What a fixture wrote: the directed edges and node values as stored on disk."""

    root: Path
    edges: np.ndarray  # [E, 2]
    x: np.ndarray
    y: np.ndarray  # -1 where unlabelled
    split: dict[str, np.ndarray]

    def symmetric_edge_set(self) -> set[tuple[int, int]]:
        return {(int(u), int(v)) for u, v in self.edges} | {(int(v), int(u)) for u, v in self.edges}


def random_values(seed: int, num_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Directed edges with a self-loop, a repeated edge and a reciprocal pair; features that are
    exact in decimal (so CSV round-trips them), labels and a split covering every node."""
    rng = np.random.default_rng(seed)
    edges = rng.integers(0, NUM_NODES, size=(150, 2))
    edges = np.concatenate([edges, [[5, 5], edges[0], edges[1, ::-1]]])
    x = rng.integers(-16, 16, size=(NUM_NODES, 4)) / 8
    y = rng.integers(0, num_classes, size=NUM_NODES)
    order = rng.permutation(NUM_NODES)
    split = {"train": order[:30], "valid": order[30:45], "test": order[45:]}
    return edges, x, y, split


def write_csv_gz(path: Path, rows: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = rows.reshape(len(rows), -1)
    with gzip.open(path, "wt") as f:  # OGB's CSVs have no header
        f.writelines(",".join(str(v) for v in row) + "\n" for row in rows.tolist())


def write_ogbn_arxiv(root: Path, seed: int = 0) -> Written:
    """A 60-node ogbn-arxiv laid out as OGB's arxiv.zip extracts (csv format)."""
    return write_csv_format(root / "ogbn_arxiv", "time", 40, seed, extra={"node_year": np.full(NUM_NODES, 2020)})


def write_ogbn_products(root: Path, seed: int = 2) -> Written:
    """A 60-node ogbn-products (csv format, one direction per edge: ogb adds the reverse)."""
    return write_csv_format(root / "ogbn_products", "sales_ranking", 47, seed, extra={})


def write_csv_format(folder: Path, split_name: str, num_classes: int, seed: int, extra: dict) -> Written:
    edges, x, y, split = random_values(seed, num_classes)
    raw = folder / "raw"
    write_csv_gz(raw / "edge.csv.gz", edges)
    write_csv_gz(raw / "num-node-list.csv.gz", np.array([NUM_NODES]))
    write_csv_gz(raw / "num-edge-list.csv.gz", np.array([len(edges)]))
    write_csv_gz(raw / "node-feat.csv.gz", x)
    write_csv_gz(raw / "node-label.csv.gz", y)
    for name, values in extra.items():
        write_csv_gz(raw / f"{name}.csv.gz", values)
    for part, index in split.items():
        write_csv_gz(folder / "split" / split_name / f"{part}.csv.gz", index)
    (folder / "RELEASE_v1.txt").write_text("")
    return Written(folder.parent, edges, x, y, split)


def write_ogbn_papers100m(root: Path, seed: int = 1) -> Written:
    """A 60-node ogbn-papers100M in OGB's binary format, with NaN labels for unlabelled
    nodes and the split as a ``split_dict.pt`` (ogb's shortcut file) holding numpy arrays."""
    edges, x, y, split = random_values(seed, num_classes=172)
    y[::3] = -1
    folder = root / "ogbn_papers100M"
    (folder / "raw").mkdir(parents=True)
    np.savez(
        folder / "raw" / "data.npz",
        edge_index=edges.T.copy(),
        num_nodes_list=np.array([NUM_NODES]),
        num_edges_list=np.array([len(edges)]),
        node_feat=x.astype(np.float16),
        node_year=np.full((NUM_NODES, 1), 2020),
    )
    np.savez(folder / "raw" / "node-label.npz", node_label=np.where(y < 0, np.nan, y).astype(np.float32)[:, None])
    (folder / "split" / "time").mkdir(parents=True)
    torch.save(split, folder / "split" / "time" / "split_dict.pt")
    (folder / "RELEASE_v1.txt").write_text("")
    return Written(root, edges, x, y, split)
