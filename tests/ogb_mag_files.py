"""Writing a random ogbn-mag in OGB's on-disk layout (mag.zip as extracted), with the values
written kept to compare against: the typed datasets' tests and the out-of-core ones."""

from __future__ import annotations


import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np



NUM_NODES = {"author": 7, "field_of_study": 5, "institution": 3, "paper": 9}


NUM_CLASSES = 349  # master.csv's: ogb reports it whatever the files hold


RELATIONS = [  # as mag.zip's triplet-type-list.csv.gz lists them
    ("author", "affiliated_with", "institution"),
    ("author", "writes", "paper"),
    ("paper", "cites", "paper"),
    ("paper", "has_topic", "field_of_study"),
]


MASKS = {"train_mask": "train", "val_mask": "valid", "test_mask": "test"}


@dataclass
class WrittenMag:
    root: Path
    edges: dict[tuple[str, str, str], np.ndarray]  # [E, 2] per relation, as stored
    x: np.ndarray
    y: np.ndarray
    split: dict[str, np.ndarray]


def write_csv_gz(path: Path, rows: np.ndarray | list, header: list[str] | None = None) -> None:
    """OGB's gzip CSVs: no header except the per-type tables (num-node-dict, nodetype-has-*)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = np.asarray(rows, dtype=object)
    rows = rows.reshape(len(rows), -1)
    with gzip.open(path, "wt") as f:
        if header:
            f.write(",".join(header) + "\n")
        f.writelines(",".join(str(v) for v in row) + "\n" for row in rows.tolist())


def write_ogbn_mag(root: Path, seed: int = 0) -> WrittenMag:
    """A tiny ogbn-mag laid out as OGB's mag.zip extracts (to ``root/ogbn_mag``): random
    edges with a repeated one, a cites self-loop, and isolated nodes of every type."""
    rng = np.random.default_rng(seed)
    folder, types = root / "ogbn_mag", list(NUM_NODES)
    raw = folder / "raw"
    write_csv_gz(raw / "num-node-dict.csv.gz", [list(NUM_NODES.values())], header=types)
    write_csv_gz(raw / "triplet-type-list.csv.gz", RELATIONS)
    write_csv_gz(raw / "nodetype-has-label.csv.gz", [[t == "paper" for t in types]], header=types)
    edges = {}
    for i, (s, r, d) in enumerate(RELATIONS):
        # The last node of each type is left out: isolated unless another relation reaches it.
        e = np.stack([rng.integers(0, NUM_NODES[s] - 1, 12), rng.integers(0, NUM_NODES[d] - 1, 12)], 1)
        e = np.concatenate([e, e[:1]] + ([[[2, 2]]] if s == d else []))
        edges[(s, r, d)] = e
        rel = raw / "relations" / f"{s}___{r}___{d}"
        write_csv_gz(rel / "edge.csv.gz", e)
        write_csv_gz(rel / "num-edge-list.csv.gz", [len(e)])
        write_csv_gz(rel / "edge_reltype.csv.gz", np.full(len(e), i))
    n = NUM_NODES["paper"]
    x = rng.integers(-16, 16, size=(n, 4)) / 8  # exact in decimal: the CSV round-trip is lossless
    y = rng.integers(0, NUM_CLASSES, size=n)
    write_csv_gz(raw / "node-feat" / "paper" / "node-feat.csv.gz", x)
    write_csv_gz(raw / "node-feat" / "paper" / "node_year.csv.gz", rng.integers(2010, 2020, n))
    write_csv_gz(raw / "node-label" / "paper" / "node-label.csv.gz", y)
    split_dir = folder / "split" / "time"
    write_csv_gz(split_dir / "nodetype-has-split.csv.gz", [[t == "paper" for t in types]], header=types)
    order = rng.permutation(n)
    split = {"train": order[:5], "valid": order[5:7], "test": order[7:]}
    for part, index in split.items():
        write_csv_gz(split_dir / "paper" / f"{part}.csv.gz", index)
    (folder / "RELEASE_v2.txt").write_text("")
    return WrittenMag(root, edges, x, y, split)
