"""Running a compiled program on a worker: the exchange rounds (:mod:`.rounds`), the links
and their wire formats (:mod:`.link`), each IR op's partitioned autograd function
(:mod:`.ops`), and aggregations reused across calls (:mod:`.reuse`)."""
