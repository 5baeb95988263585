"""Real graphs to partition: OGB node property prediction datasets read from local files.

    >>> ds = load_ogb("ogbn-arxiv", "dataset")  # doctest: +SKIP
    >>> ds.graph.num_nodes, ds.num_classes, ds.symmetrized, tuple(ds.node_data["x"].shape)
    (169343, 40, True, (169343, 128))
    >>> sorted(ds.node_data)
    ['test_mask', 'train_mask', 'val_mask', 'x', 'y']

The heterogeneous ogbn-mag has its own loader, :func:`load_ogb_mag`, giving a
:class:`HeteroDataset` (node tensors per node type)::

    >>> mag = load_ogb_mag("dataset")  # doctest: +SKIP
    >>> mag.graph.node_types, mag.num_classes, tuple(mag.node_data["paper"]["x"].shape)  # doctest: +SKIP
    (('author', 'field_of_study', 'institution', 'paper'), 349, (736389, 128))

The files are read by the ``ogb`` package itself, from ``<root>/<name with - as _>/``
laid out as OGB's zip extracts. This module never downloads: it checks the files are in
place first and otherwise raises a :class:`DatasetError` naming the missing path, the URL
to fetch on a machine with internet, and where to unzip it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from sarcompile.errors import DatasetError, GraphError
from sarcompile.graph.graph import Graph
from sarcompile.graph.hetero import HeteroGraph, Relation
from sarcompile.data.validate import MASKS

__all__ = ["SUPPORTED", "Dataset", "HeteroDataset", "load_ogb", "load_ogb_mag", "add_reverse_relations",
           "symmetrize_edges"]

SUPPORTED = ("ogbn-arxiv", "ogbn-products", "ogbn-papers100M")
CSV_FILES = ("edge", "num-node-list", "num-edge-list", "node-feat", "node-label")
BINARY_FILES = ("data.npz", "node-label.npz")
SPLIT_FILES = ("train.csv.gz", "valid.csv.gz", "test.csv.gz")
MAG = "ogbn-mag"
MAG_TARGET = "paper"  # the one node type of ogbn-mag with features, labels and a split
SPLIT_OF_MASK = dict(zip(MASKS, ("train", "valid", "test")))  # mask name -> the OGB split part it marks


@dataclass
class Dataset:
    """One graph with its node tensors, ready for :func:`sarcompile.partition`.

    ``node_data`` has one row per node: ``x`` (float32 features), ``y`` (int64 class,
    -1 where the node has no label) and the bool ``train_mask``, ``val_mask`` and
    ``test_mask`` of the dataset's official split. ``symmetrized`` says whether the
    edges are the union of both directions of the stored ones.

    Example:

    >>> data = sc.load_ogb("ogbn-arxiv", root="dataset")   # doctest: +SKIP
    >>> data.graph.num_nodes, sorted(data.node_data)   # doctest: +SKIP
    (169343, ['test_mask', 'train_mask', 'val_mask', 'x', 'y'])
    """

    name: str
    graph: Graph
    node_data: dict[str, torch.Tensor] = field(repr=False)
    num_classes: int
    symmetrized: bool = False
    # OGB's own id of every node (mapping/nodeidx2*.csv.gz: MAG paper ids, Amazon ASINs),
    # where the dataset's folder has it; what the partition keeps (sarcompile.data.node_ids)
    node_ids: np.ndarray | None = field(default=None, repr=False)


@dataclass
class HeteroDataset:
    """A typed graph with node tensors per node type, ready for :func:`sarcompile.partition`.

    ``node_data[t]`` has one row per node of type ``t``. The ``target_type`` (the type
    whose class is predicted) has ``x`` (float32 features), ``y`` (int64 class) and the
    bool ``train_mask``, ``val_mask`` and ``test_mask``; types without stored values have
    an empty dict.

    Example:

    >>> mag = sc.load_ogb_mag(root="dataset")   # doctest: +SKIP
    >>> mag.graph.node_types   # doctest: +SKIP
    ['author', 'field_of_study', 'institution', 'paper']
    """

    name: str
    graph: HeteroGraph
    node_data: dict[str, dict[str, torch.Tensor]] = field(repr=False)
    num_classes: int
    target_type: str = MAG_TARGET
    # OGB's own ids per node type (mapping/{type}_entidx2name.csv.gz), for the types that have them
    node_ids: dict[str, np.ndarray] | None = field(default=None, repr=False)


def load_ogb(name: str, root: str | Path, symmetrize: bool | None = None) -> Dataset:
    """Load OGB dataset ``name`` (one of :data:`SUPPORTED`) from ``root/<name with - as _>/``.

    ``symmetrize=None`` does what OGB's examples do: datasets OGB stores directed
    (arxiv, papers100M) get both directions of every edge (see :func:`symmetrize_edges`);
    products, which OGB already gives both directions, is kept as stored. ``True`` or
    ``False`` forces the choice. Where the folder has OGB's ``mapping/nodeidx2*.csv.gz``
    (arxiv's and papers100M's MAG paper ids, products' ASINs), ``node_ids`` holds them.

    The first load parses the raw files and leaves ogb's cache in ``processed/``; later
    loads read the cache. That cache is a pickle, unpickled in full (as ogb itself does):
    load only dataset directories you trust. Raises :class:`DatasetError` for an
    unsupported name, missing files or files ogb cannot read; it never downloads or prompts.

    Example:

    >>> data = sc.load_ogb("ogbn-arxiv", root="dataset")   # doctest: +SKIP
    >>> sc.partition(data.graph, 4, "arxiv4", node_data=data.node_data)   # doctest: +SKIP
    """
    meta = _meta(name)
    folder = Path(root) / name.replace("-", "_")
    _check_files(name, folder, meta, _needed_files)
    ogb_data, split = _read(name, Path(root), folder)

    num_nodes = int(ogb_data.graph["num_nodes"])
    edge_index = torch.from_numpy(np.ascontiguousarray(ogb_data.graph["edge_index"]))
    src, dst = edge_index[0], edge_index[1]
    if symmetrize is None:
        symmetrize = meta["add_inverse_edge"] != "True"
    if symmetrize:
        src, dst = symmetrize_edges(src, dst, num_nodes)

    node_data = {
        "x": _features(ogb_data.graph.get("node_feat"), num_nodes, name),
        "y": _labels(ogb_data.labels, num_nodes, name),
        **{mask: _mask(split[part], num_nodes, name, part) for mask, part in SPLIT_OF_MASK.items()},
    }
    graph = Graph.from_edges(src, dst, num_nodes)
    mapping = ogb_mapping_file(folder)
    ids = None if mapping is None else read_ogb_mapping(mapping, num_nodes)
    return Dataset(name, graph, node_data, int(ogb_data.num_classes), bool(symmetrize), ids)


def load_ogb_mag(root: str | Path, add_reverse: bool = True) -> HeteroDataset:
    """Load ogbn-mag from ``root/ogbn_mag/`` (OGB's mag.zip extracted there, csv format).

    Node types and relations come in ogb's order (sorted), each relation's edges as
    stored. ``add_reverse`` adds ``(dst, "rev_" + name, src)`` for every relation between
    two different types (see :func:`add_reverse_relations`), so authors, institutions and
    fields of study receive messages too; ``paper cites paper`` stays directed as stored.
    Only papers carry values: ``x`` (128 float32 features), ``y`` (the venue, one of 349)
    and the masks of OGB's time split (train up to 2017, valid 2018, test 2019). OGB's
    ``mapping/{type}_entidx2name.csv.gz`` files, where present, give ``node_ids``.

    Caching, trust and errors are as in :func:`load_ogb`: a :class:`DatasetError` names
    any missing file, the URL and where to unzip; nothing is downloaded.

    Example:

    >>> mag = sc.load_ogb_mag(root="dataset")   # doctest: +SKIP
    >>> sc.partition(mag.graph, 4, "mag4", node_data=mag.node_data)   # doctest: +SKIP
    """
    meta = _master_column(MAG)
    folder = Path(root) / "ogbn_mag"
    _check_files(MAG, folder, meta, _mag_needed_files)
    ogb_data, split = _read(MAG, Path(root), folder)

    graph = ogb_data.graph
    num_nodes = {str(t): int(n) for t, n in graph["num_nodes_dict"].items()}
    edges: dict[Relation, tuple[torch.Tensor, torch.Tensor]] = {
        tuple(rel): tuple(torch.from_numpy(np.ascontiguousarray(ei)))
        for rel, ei in graph["edge_index_dict"].items()
    }
    if add_reverse:
        edges = add_reverse_relations(edges)
    try:
        hetero = HeteroGraph.from_edges(edges, num_nodes)
    except GraphError as e:
        raise DatasetError(
            f"{MAG}: the files in '{folder}' do not form a graph ({e}); re-extract OGB's zip there"
        ) from None

    n = num_nodes.get(MAG_TARGET, 0)
    paper = {
        "x": _features((graph["node_feat_dict"] or {}).get(MAG_TARGET), n, MAG),
        "y": _labels(ogb_data.labels.get(MAG_TARGET), n, MAG),
        **{mask: _mask(_typed_split(split, part), n, MAG, part) for mask, part in SPLIT_OF_MASK.items()},
    }
    node_data = {t: (paper if t == MAG_TARGET else {}) for t in hetero.node_types}
    files = {t: ogb_mapping_file(folder, t) for t in hetero.node_types}
    ids = {t: read_ogb_mapping(path, num_nodes[t]) for t, path in files.items() if path is not None}
    return HeteroDataset(MAG, hetero, node_data, int(ogb_data.num_classes), MAG_TARGET, ids or None)


def add_reverse_relations(
    edges: dict[Relation, tuple[torch.Tensor, torch.Tensor]],
) -> dict[Relation, tuple[torch.Tensor, torch.Tensor]]:
    """``edges`` followed by ``(d, "rev_" + r, s)`` with the same edges reversed, for every
    relation ``(s, r, d)`` with ``s != d``: the relations PyG's ``ToUndirected`` adds to
    ogbn-mag. A relation within one type has no other type to reach, so it gets none.
    Raises :class:`GraphError` if a reverse relation already exists under that name.

    >>> add_reverse_relations({("a", "r", "b"): (torch.tensor([0]), torch.tensor([1]))})
    {('a', 'r', 'b'): (tensor([0]), tensor([1])), ('b', 'rev_r', 'a'): (tensor([1]), tensor([0]))}
    """
    out = dict(edges)
    for (s, r, d), (src, dst) in edges.items():
        if s == d:
            continue
        rev = (d, f"rev_{r}", s)
        if rev in edges:
            raise GraphError(f"cannot add the reverse of {(s, r, d)}: the edges already have a relation {rev}")
        out[rev] = (dst, src)
    return out


def symmetrize_edges(src: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every edge in both directions, each ``(u, v)`` pair once, sorted by ``(u, v)``.

    Self-loops stay exactly when the input has them (once each).

    >>> symmetrize_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 0, 2, 0]), 3)
    (tensor([0, 0, 1, 2, 2]), tensor([1, 2, 0, 0, 2]))
    """
    # One int64 key per pair (num_nodes**2 fits for any graph that fits in memory);
    # torch.unique sorts and de-duplicates them in one pass.
    key = torch.unique(torch.cat([src * num_nodes + dst, dst * num_nodes + src]))
    return key // num_nodes, key % num_nodes


# -- checking the files before ogb sees them ---------------------------------------------------
def ogb_mapping_file(folder: Path, ntype: str | None = None) -> Path | None:
    """OGB's file of the original id of every node (of type ``ntype``) in a dataset's
    folder, or None where it has none: ``mapping/nodeidx2paperid.csv.gz`` and the like,
    ``mapping/{type}_entidx2name.csv.gz`` for ogbn-mag. A gzip CSV under a header line
    (``node idx,paper id``): the node index, then its id."""
    if ntype is not None:
        path = folder / "mapping" / f"{ntype}_entidx2name.csv.gz"
        return path if path.is_file() else None
    found = sorted((folder / "mapping").glob("nodeidx2*.csv.gz"))
    if len(found) > 1:
        raise DatasetError(f"'{folder / 'mapping'}' has {len(found)} node id files ({', '.join(p.name for p in found)}); "
                           "OGB's zip has one: re-extract it")
    return found[0] if found else None


def read_ogb_mapping(path: Path, num_nodes: int, chunk_rows: int = 1 << 20,
                     store: Callable[[Iterator[np.ndarray]], Any] = lambda c: np.concatenate(list(c))) -> Any:
    """The ids of an OGB mapping file (see :func:`ogb_mapping_file`) in node order, checked:
    one per node, rows in node order. Integers (int64) where every id is one, else strings
    (then held in memory). ``store`` takes the integer ids a chunk at a time (default:
    into one array; out of core: into a file)."""
    try:
        ids = store(_mapping_chunks(path, np.int64, chunk_rows))
    except (ValueError, OverflowError):  # an id that is not a 64-bit integer: all are strings
        try:
            ids = np.concatenate(list(_mapping_chunks(path, str, chunk_rows)))
        except ValueError as e:  # a node index that is not a number, or no rows
            raise DatasetError(f"'{path}' is not OGB's node id mapping ({e}); re-extract OGB's zip") from None
    if ids.shape[0] != num_nodes:
        raise DatasetError(f"'{path}' has {ids.shape[0]} ids for {num_nodes} nodes; re-extract OGB's zip")
    return ids


def _mapping_chunks(path: Path, dtype: type, chunk_rows: int) -> Iterator[np.ndarray]:
    """The id column of an OGB mapping file ``chunk_rows`` at a time, each row's index checked."""
    import pandas as pd  # an ogb dependency

    first, text = 0, dtype is str
    try:
        with pd.read_csv(path, header=0, dtype={0: np.int64, 1: dtype}, chunksize=chunk_rows, compression="gzip",
                         **({"keep_default_na": False, "na_filter": False} if text else {})) as reader:
            for frame in reader:
                index = frame.iloc[:, 0].to_numpy()
                if frame.shape[1] != 2 or not np.array_equal(index, np.arange(first, first + len(index))):
                    raise DatasetError(f"'{path}' is not OGB's node id mapping (two columns, node index 0, 1, ... "
                                       "in order, then its id); re-extract OGB's zip")
                first += len(index)
                yield frame.iloc[:, 1].to_numpy().astype(str) if text else frame.iloc[:, 1].to_numpy()
    except (pd.errors.ParserError, pd.errors.EmptyDataError, OSError, EOFError, UnicodeDecodeError) as e:
        raise DatasetError(f"cannot read '{path}' ({type(e).__name__}: {e}); re-extract OGB's zip") from None


def _meta(name: str) -> dict[str, str]:
    """:func:`_master_column` of a dataset :func:`load_ogb` supports."""
    if name not in SUPPORTED:
        hint = f"; {MAG} is heterogeneous: load it with load_ogb_mag" if name == MAG else ""
        raise DatasetError(
            f"dataset {name!r} is not supported; choose one of {', '.join(SUPPORTED)} "
            f"(homogeneous OGB node property prediction){hint}"
        )
    return _master_column(name)


def _master_column(name: str) -> dict[str, str]:
    """The dataset's column of ogb's own master.csv (file names, URL, version, split)."""
    import pandas as pd  # an ogb dependency; read master.csv exactly as ogb does

    master = Path(_ogb().__file__).with_name("master.csv")
    return dict(pd.read_csv(master, index_col=0, keep_default_na=False)[name])


def _check_files(
    name: str, folder: Path, meta: dict[str, str], needed_files: Callable[[Path, dict[str, str]], list[Path]]
) -> None:
    """Raise :class:`DatasetError` unless ogb will find everything without downloading or asking.

    ogb asks on stdin whether to re-download when the folder lacks its RELEASE file, and
    downloads when the raw files (or its processed cache) are missing. ``needed_files``
    lists the files ogb reads for this dataset; it runs once the folder is known to exist.
    """
    url = meta["url"]
    fetch = (
        f"download {url} on a machine with internet, unzip it and move the folder "
        f"'{meta['download_name']}' it holds to '{folder}'"
    )
    if not folder.is_dir():
        raise DatasetError(f"{name}: '{folder}' does not exist; {fetch}")
    release = folder / f"RELEASE_v{meta['version']}.txt"
    if not release.is_file():
        raise DatasetError(
            f"{name}: '{release}' is missing (OGB's zip has it; without it ogb would offer to re-download): "
            f"re-extract {url} into '{folder}', or create that empty file if the files there are OGB's "
            f"version {meta['version']}"
        )
    missing = [str(p) for p in needed_files(folder, meta) if not p.exists()]
    if missing:
        raise DatasetError(f"{name}: missing {', '.join(repr(p) for p in missing)}; {fetch}")


def _needed_files(folder: Path, meta: dict[str, str]) -> list[Path]:
    needed = []
    if not (folder / "processed" / "data_processed").is_file():  # the cache replaces raw/
        raw = folder / "raw"
        if meta["binary"] == "True":
            needed += [raw / f for f in BINARY_FILES]
        else:
            extra = [] if meta["additional node files"] == "None" else meta["additional node files"].split(",")
            needed += [raw / f"{f}.csv.gz" for f in (*CSV_FILES, *extra)]
    split = folder / "split" / meta["split"]
    if not (split / "split_dict.pt").is_file():  # ogb's shortcut replaces the three lists
        needed += [split / f for f in SPLIT_FILES]
    return needed


def _mag_needed_files(folder: Path, meta: dict[str, str]) -> list[Path]:
    """What ogb's heterogeneous csv reader opens for ogbn-mag. ogb turns a missing file into
    a bare "No necessary file" (or skips it silently: paper features), so each is checked here."""
    needed = []
    if not (folder / "processed" / "data_processed").is_file():
        raw = folder / "raw"
        triplets = raw / "triplet-type-list.csv.gz"
        needed += [raw / "num-node-dict.csv.gz", triplets, raw / "nodetype-has-label.csv.gz",
                   raw / "node-feat" / MAG_TARGET / "node-feat.csv.gz",
                   raw / "node-label" / MAG_TARGET / "node-label.csv.gz"]
        if triplets.is_file():  # it names the relation folders; its absence is reported above
            for triplet in _read_triplets(triplets):
                rel = raw / "relations" / "___".join(triplet)
                needed += [rel / "edge.csv.gz", rel / "num-edge-list.csv.gz"]
    split = folder / "split" / meta["split"]
    if not (split / "split_dict.pt").is_file():
        needed += [split / "nodetype-has-split.csv.gz", *(split / MAG_TARGET / f for f in SPLIT_FILES)]
    return needed


def _read_triplets(path: Path) -> list[Relation]:
    """The ``(src, name, dst)`` rows of a ``triplet-type-list.csv.gz``, read as ogb reads them."""
    import pandas as pd

    try:
        rows = pd.read_csv(path, compression="gzip", header=None)
        return [(str(s), str(r), str(d)) for s, r, d in zip(rows[0], rows[1], rows[2])]
    except Exception as e:  # noqa: BLE001 -- pandas raises many types for a damaged file
        raise DatasetError(f"cannot read '{path}' ({type(e).__name__}: {e}); re-extract OGB's zip") from None


# -- reading through ogb ----------------------------------------------------------------------
def _ogb() -> Any:
    """ogb's node property prediction package, imported on first use: it pulls in pandas
    and starts a version check, which ``import sarcompile`` should not pay for."""
    import ogb.nodeproppred

    return ogb.nodeproppred


@functools.cache
def _dataset_class() -> type:
    """ogb's ``NodePropPredDataset``, reading back the caches ogb itself wrote.

    ogb ``torch.save``s numpy arrays and reloads them with a bare ``torch.load``, which
    torch >= 2.6 refuses (``weights_only`` became the default). These two methods load
    the same files with ``weights_only=False`` (what ogb got on older torch) and defer
    to ogb for everything else.
    """

    class TrustedCacheDataset(_ogb().NodePropPredDataset):
        def pre_process(self) -> None:
            cache = Path(self.root) / "processed" / "data_processed"
            if not cache.is_file():
                cache.parent.mkdir(exist_ok=True)  # ogb's torch.save needs it; OGB's zips ship it
                super().pre_process()
                return
            try:
                loaded = torch.load(cache, map_location="cpu", weights_only=False)
                self.graph, self.labels = loaded["graph"], loaded["labels"]
            except Exception as e:  # noqa: BLE001 -- unpickling raises many types; each means a bad cache
                raise DatasetError(
                    f"cannot read ogb's cache '{cache}' ({type(e).__name__}: {e}); "
                    "delete it to rebuild it from raw/"
                ) from None

        def get_idx_split(self, split_type: str | None = None) -> dict[str, Any]:
            path = Path(self.root) / "split" / (split_type or self.meta_info["split"]) / "split_dict.pt"
            if path.is_file():
                return torch.load(path, map_location="cpu", weights_only=False)
            return super().get_idx_split(split_type)

    return TrustedCacheDataset


def _read(name: str, root: Path, folder: Path) -> tuple[Any, dict[str, Any]]:
    """ogb's dataset object and its split, with ogb's progress prints sent to stderr
    (stdout belongs to the caller's results)."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            data = _dataset_class()(name, root=str(root))
            return data, data.get_idx_split()
    except DatasetError:
        raise
    except Exception as e:  # noqa: BLE001 -- the raw files are outside input; pandas and numpy raise many types
        reason = " ".join(str(e).split())[:300]
        raise DatasetError(
            f"ogb cannot read {name} from '{folder}' ({type(e).__name__}: {reason}); "
            f"re-extract OGB's zip there (delete '{folder / 'processed'}' to rebuild the cache)"
        ) from None


def _read_split(name: str, folder: Path, meta: dict[str, str]) -> dict[str, Any]:
    """The split's node indices by part, read as ogb's ``get_idx_split`` reads them
    (its ``split_dict.pt`` shortcut, else the three CSVs), without loading the dataset."""
    import pandas as pd

    path = folder / "split" / meta["split"]
    try:
        if (path / "split_dict.pt").is_file():  # ogb's own shortcut; trusted as ogb trusts it
            return torch.load(path / "split_dict.pt", map_location="cpu", weights_only=False)
        return {part: pd.read_csv(path / f"{part}.csv.gz", compression="gzip", header=None).values.T[0]
                for part in ("train", "valid", "test")}
    except Exception as e:  # noqa: BLE001 -- pandas and unpickling raise many types for a damaged file
        raise DatasetError(f"{name}: cannot read the split in '{path}' ({type(e).__name__}: {e}); "
                           "re-extract OGB's zip") from None


# -- node tensors ------------------------------------------------------------------------------
def _typed_split(split: dict[str, Any], part: str) -> Any:
    """The target type's indices in one part of a heterogeneous split (``split[part][type]``)."""
    try:
        return split[part][MAG_TARGET]
    except (KeyError, TypeError):
        raise DatasetError(f"{MAG}: the split has no {part!r} indices for node type {MAG_TARGET!r}") from None


def _features(feat: np.ndarray | None, num_nodes: int, name: str) -> torch.Tensor:
    if feat is None or len(feat) != num_nodes:
        raise DatasetError(f"{name}: expected node features with {num_nodes} rows, got {_shape(feat)}")
    return torch.from_numpy(np.ascontiguousarray(feat)).to(torch.float32)


def _labels(labels: np.ndarray, num_nodes: int, name: str, first: int = 0) -> torch.Tensor:
    """Labels as int64, -1 where a label is missing (papers100M stores those as NaN);
    ``first``: the id of the first node in ``labels`` (for a chunk of them)."""
    labels = np.asarray(labels)
    if labels.shape not in ((num_nodes,), (num_nodes, 1)):
        raise DatasetError(f"{name}: expected one label per node ({num_nodes}), got {_shape(labels)}")
    labels = labels.reshape(-1)
    if labels.dtype.kind == "f":
        labels = np.where(np.isnan(labels), -1, labels)
        # Anything else that is not a whole number would be truncated by the cast below.
        bad = np.flatnonzero(~np.isfinite(labels) | (labels != np.round(labels)))
        if bad.size:
            raise DatasetError(
                f"{name}: node {first + int(bad[0])} has label {labels[bad[0]]}, not a class id "
                f"({bad.size} such labels); the label file is damaged or not this dataset's"
            )
    elif labels.dtype.kind not in "iu":
        raise DatasetError(f"{name}: labels have dtype {labels.dtype}, expected integer class ids")
    return torch.from_numpy(labels.astype(np.int64))


def _mask(index: Any, num_nodes: int, name: str, split: str) -> torch.Tensor:
    # A copy: ogb's split arrays come from pandas read-only, which torch warns about.
    index = torch.from_numpy(np.array(index, dtype=np.int64)).reshape(-1)
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= num_nodes):
        raise DatasetError(f"{name}: the {split} split names nodes outside [0, {num_nodes})")
    mask = torch.zeros(num_nodes, dtype=torch.bool)
    mask[index] = True
    return mask


def _shape(a: np.ndarray | None) -> str:
    return "none" if a is None else f"shape {tuple(np.shape(a))}"
