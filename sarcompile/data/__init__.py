"""What is read and written on disk, and what a worker holds: :mod:`.datasets` (OGB's
formats), :mod:`.partitioning` (METIS parts, the manifest, loading one part), :mod:`.shard`
(a worker's share of the graph, in blocks by source partition), :mod:`.validate` (node data
checked where it is loaded), :mod:`.rundir` (directory locks, atomic writes) and
:mod:`.checkpoint` (checksummed training state)."""
