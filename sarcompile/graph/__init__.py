"""Graphs, the bottom layer: the whole graph (:mod:`.graph`), a worker's shard of it
(:mod:`.shard`), typed graphs (:mod:`.hetero`), per-node and per-edge frames as DGL keeps them
(:mod:`.frames`), which rows of a node table a worker holds (:mod:`.tables`), and the degree
statistics the memory estimate reads (:mod:`.stats`)."""
