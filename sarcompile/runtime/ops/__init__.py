"""Each IR op's shard implementation, one module per family; importing this package
registers them onto the ops of :mod:`sarcompile.ir.ops`, which call them on a shard.

* :mod:`.halo` -- the exchange every halo op makes (strategies, forward's and backward's rounds);
* :mod:`.spmm` -- aggregation; :mod:`.edges` -- sddmm, gather_src, edge_reduce_src;
* :mod:`.attention` -- fused graph attention; :mod:`.message` -- user message functions;
* :mod:`.collective` -- the all-reduce ops: edge_max, node_mean, batch norm.
"""

from sarcompile.runtime.ops import attention, collective, edges, message, spmm  # noqa: F401  (registration)
