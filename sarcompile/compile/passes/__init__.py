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

from sarcompile.compile.passes.accumulate import accumulate
from sarcompile.compile.passes.communication import communication
from sarcompile.compile.passes.context import PassContext
from sarcompile.compile.passes.dropout import dropout
from sarcompile.compile.passes.fuse import fuse
from sarcompile.compile.passes.head_dot import head_dot
from sarcompile.compile.passes.inplace import inplace
from sarcompile.compile.passes.kernels import kernels
from sarcompile.compile.passes.linear_first import linear_first
from sarcompile.compile.passes.linear_groups import linear_groups
from sarcompile.compile.passes.lower import lower
from sarcompile.compile.passes.node_tables import node_tables
from sarcompile.compile.passes.sar import sar
from sarcompile.compile.passes.residency import listing, residency
from sarcompile.compile.passes.reuse import reuse
from sarcompile.compile.passes.row_reductions import row_reductions
from sarcompile.compile.passes.strategy import strategy

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
    Pass("node_tables", node_tables, When.TABLES, True),  # how each table is read; a lookup by its own ids -> the table
    Pass("lower", lower, When.ALWAYS, True),  # graph layers -> IR ops (spmm, sddmm, edge_softmax, ...)
    Pass("fuse", fuse, When.ALWAYS, True),  # attention chains -> one fused attention op
    Pass("linear_first", linear_first, When.ALWAYS, False),  # transform before aggregating, where that narrows the rows
    Pass("residency", residency, When.ALWAYS, True, listing),  # node/edge/graph/param per value; refuses row mixing
    Pass("row_reductions", row_reductions, When.ALWAYS, True),  # a mean over every node -> node_mean (a collective)
    Pass("dropout", dropout, When.ALWAYS, True),  # dropout of rows -> masks keyed by node / edge id
    Pass("sar", sar, When.WORKERS, True),  # ops that read remote rows -> sequential aggregation
    Pass("strategy", strategy, When.WORKERS, True),  # direct / remat / stash / oneshot per op
    Pass("communication", communication, When.WORKERS, True),  # opt-in stale / compressed exchange per op
    Pass("kernels", kernels, When.ALWAYS, True),  # executor per op: generated Triton or torch kernels
    Pass("reuse", reuse, When.ALWAYS, False),  # an aggregation of the call's own input kept across calls
    Pass("inplace", inplace, When.ALWAYS, False),  # sums and activations written into a temporary nobody keeps
    Pass("linear_groups", linear_groups, When.ALWAYS, False),  # the linears reading one value, and its activation, as one op
    Pass("accumulate", accumulate, When.ALWAYS, False),  # an aggregation added to a value nobody keeps sums into it
    Pass("head_dot", head_dot, When.ALWAYS, False),  # attention's per-head scores without [n, H, C] products
)
