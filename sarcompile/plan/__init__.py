"""What a compiled model will do on N workers, before it runs: the :class:`~.plan.Plan`
(per-op strategy, traffic, memory and kernels), built by running the program once on an
example shard (:mod:`.build`, :mod:`.probe`) and scaling its sizes to each worker's
(:mod:`.sizes`)."""
