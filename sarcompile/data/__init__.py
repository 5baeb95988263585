"""What is read and written on disk: :mod:`.datasets` (OGB's formats) and the synthetic
graphs; partitioning -- :mod:`.assign` (which part every node goes to),
:mod:`.partitioning` (cut and write), :mod:`.typed_partition` (typed graphs),
:mod:`.outofcore` (graphs larger than memory) and :mod:`.dgl_import` (DGL's partitions);
the partition directory -- :mod:`.manifest` (its record), :mod:`.part_files` (part files
written and checked) and :mod:`.loading` (a worker's part loaded); :mod:`.validate` (node
data checked where it enters), :mod:`.rundir` (directory locks, atomic writes) and
:mod:`.checkpoint` (checksummed training state)."""
