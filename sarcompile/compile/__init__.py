"""Compiling a model: ``sc.distribute`` (:mod:`.distribute`), how a call is shaped
(:mod:`.call_shape`, :mod:`.call_graphs`), tracing (:mod:`.trace`), the residency checker,
and the pipeline (:mod:`.pipeline`) of passes listed in :data:`.passes.PIPELINE`."""
