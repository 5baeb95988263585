"""Partitioning graphs larger than memory: edges and node data are streamed from disk in
chunks, nodes are assigned by a multilevel scheme whose working set fits a memory limit,
and the part files are written one at a time.

The parts are the same files :func:`sarcompile.partition` writes (same manifest, checksums
and validation), and :func:`sarcompile.load_partition` reads them as it reads any part.

* :mod:`.sources` -- arrays on disk (``.npy`` files, raw scratch files) read a chunk at a time;
* :mod:`.convert` -- edge CSVs and other text or container formats turned into such files;
* :mod:`.ogb` -- OGB's homogeneous datasets from their raw files (``--dataset ... --memory-limit``);
* :mod:`.budget` -- a memory limit turned into chunk, bucket and coarse-graph sizes;
* :mod:`.adjacency` -- the undirected simple graph as on-disk buckets of whole adjacency lists;
* :mod:`.multilevel` -- label-propagation coarsening, METIS on the coarse graph, projection
  and streaming refinement;
* :mod:`.writer` -- part files written one per part from per-part scratch files;
* :mod:`.partition` -- :func:`partition_files`, the whole pipeline;
* :mod:`.stats` -- what the memory estimate needs of a graph, from its edge files.
"""

from sarcompile.data.outofcore.budget import Budget, parse_size
from sarcompile.data.outofcore.partition import partition_files
from sarcompile.data.outofcore.sources import DiskArray, EdgeFiles, open_edges
from sarcompile.data.outofcore.stats import edge_stats

__all__ = ["Budget", "DiskArray", "EdgeFiles", "edge_stats", "open_edges", "parse_size", "partition_files"]
