"""The compile pipeline: every pass, in the order it runs (:data:`PIPELINE`).

A pass is a plain function ``(GraphModule, PassContext) -> GraphModule`` in a module of its
own, whose docstring states its contract. The tracer (:mod:`sarcompile.compile.trace`)
makes the GraphModule the first pass reads; :func:`sarcompile.compile.pipeline.compile_program`
runs the passes below whose ``when`` holds.

``exact``: whether the program needs the pass to compute the single-machine result on N
workers. The others are CPU and memory peepholes: dropped, the program gives the same
results (to float rounding) with more time or memory (tests/compile/test_pipeline.py runs
the models without them).

The passes, as :data:`PIPELINE` lists them:

node_tables, lower, fuse, linear_first, residency, row_reductions, dropout, sar,
strategy, communication, kernels, reuse, inplace, linear_groups, accumulate, head_dot
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

import torch.fx as fx

# The modules, not their functions: a function bound here under its module's name would hide
# the module (``from sarcompile.compile.passes import fuse`` must give the module).
from sarcompile.compile.passes import (
    accumulate,
    communication,
    dropout,
    fuse,
    head_dot,
    inplace,
    kernels,
    linear_first,
    linear_groups,
    lower,
    node_tables,
    residency,
    reuse,
    row_reductions,
    sar,
    strategy,
)
from sarcompile.compile.passes.context import PassContext

__all__ = ["PIPELINE", "Pass", "PassContext", "When"]


class When(enum.Enum):
    """Which programs a pass runs on."""

    ALWAYS = "always"
    TABLES = "tables"  # only a program with node tables (so that one-type plans read as before)
    WORKERS = "workers"  # only a program for N workers, not the single machine's


@dataclass(frozen=True)
class Pass:
    name: str  # as SARCOMPILE_LOGS=passes, plan stages and `sarcompile plan --stage` name it
    run: Callable[[fx.GraphModule, PassContext], fx.GraphModule]
    when: When
    exact: bool  # whether exactness needs it (False: a CPU or memory peephole)
    show: Callable[[fx.GraphModule], str] | None = None  # its stage as read (default: the code)


PIPELINE: tuple[Pass, ...] = (
    # how each table is read; a lookup by its own ids -> the table
    Pass("node_tables", node_tables.node_tables, When.TABLES, exact=True),
    # graph layers -> IR ops (spmm, sddmm, edge_softmax, ...)
    Pass("lower", lower.lower, When.ALWAYS, exact=True),
    # attention chains -> one fused attention op
    Pass("fuse", fuse.fuse, When.ALWAYS, exact=True),
    # transform before aggregating, where that narrows the rows
    Pass("linear_first", linear_first.linear_first, When.ALWAYS, exact=False),
    # node/edge/graph/param per value; refuses row mixing
    Pass("residency", residency.residency, When.ALWAYS, exact=True, show=residency.listing),
    # a mean over every node -> node_mean (a collective)
    Pass("row_reductions", row_reductions.row_reductions, When.ALWAYS, exact=True),
    # dropout of rows -> masks keyed by node / edge id
    Pass("dropout", dropout.dropout, When.ALWAYS, exact=True),
    # ops that read remote rows -> sequential aggregation
    Pass("sar", sar.sar, When.WORKERS, exact=True),
    # direct / remat / stash / oneshot per op
    Pass("strategy", strategy.strategy, When.WORKERS, exact=True),
    # opt-in stale / compressed exchange per op
    Pass("communication", communication.communication, When.WORKERS, exact=True),
    # executor per op: generated Triton or torch kernels
    Pass("kernels", kernels.kernels, When.ALWAYS, exact=True),
    # an aggregation of the call's own input kept across calls
    Pass("reuse", reuse.reuse, When.ALWAYS, exact=False),
    # sums and activations written into a temporary nobody keeps
    Pass("inplace", inplace.inplace, When.ALWAYS, exact=False),
    # the linears reading one value, and its activation, as one op
    Pass("linear_groups", linear_groups.linear_groups, When.ALWAYS, exact=False),
    # an aggregation added to a value nobody keeps sums into it
    Pass("accumulate", accumulate.accumulate, When.ALWAYS, exact=False),
    # attention's per-head scores without [n, H, C] products
    Pass("head_dot", head_dot.head_dot, When.ALWAYS, exact=False),
)
