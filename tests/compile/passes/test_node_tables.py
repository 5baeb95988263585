"""The node_tables pass, on traced programs: a lookup of a table by every id of its own type,
in row order, becomes the table (one-type and typed graphs: ``global_ids``,
``src_global_ids``, ``torch.arange`` of ``num_nodes`` / ``num_src_nodes``, the constant
``0..n-1``); every other lookup is left as it is; values and gradients are unchanged; and
a tentative table is read as rows or as a constant by its use. (Tables found by use, end to
end on workers: tests/compile/test_tables.py.)"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

import sarcompile as sc
from sarcompile.compile.call_shape import CallShape
from sarcompile.compile.passes.node_tables import node_tables
from sarcompile.compile.tables import table_input
from sarcompile.compile.trace import trace
from sarcompile.errors import CompileError
from sarcompile.graph.tables import NODES
from sarcompile.ir.node_info import info, set_info
from sarcompile.ir.vocab import Residency

# These models read a sarcompile graph's sizes as attributes (g.num_nodes); with dgl imported
# (the DGL environment's run) a graph argument is traced as a DGL graph, whose num_nodes is
# a method, so they run where dgl is not.
sarcompile_graph_api = pytest.mark.skipif("dgl" in sys.modules, reason="dgl imported: graphs are traced as DGL graphs")

N = 6
W, R = ("author", "writes", "paper"), ("paper", "rev_writes", "author")
COUNTS = {"author": 5, "paper": 5}  # as many papers as authors: a lookup by the wrong type's ids runs


def _graph() -> sc.Graph:
    return sc.Graph.from_edges(torch.tensor([0, 1, 2, 3, 4, 5, 2]), torch.tensor([1, 2, 3, 4, 5, 0, 0]), N)


def _typed() -> sc.HeteroGraph:
    return sc.HeteroGraph.from_edges({W: (torch.tensor([0, 1, 2, 3, 4]), torch.tensor([1, 2, 3, 4, 0])),
                                      R: (torch.tensor([0, 0, 2]), torch.tensor([1, 3, 4]))}, COUNTS)


def _traced(model: nn.Module, args: tuple, tables: dict[str, tuple[str, int]], tentative: tuple[str, ...] = (),
            node_count: int | None = None):
    """``model`` traced as the pipeline traces it before its passes: the call's inputs, then
    the tables ``{parameter: (node type, count)}``, those in ``tentative`` found by use."""
    call = CallShape.of_call(model.forward, args, {}, 0, node_count=node_count)
    specs = {path: table_input(model.get_parameter(path), t, n) for path, (t, n) in tables.items()}
    specs = {path: replace(s, alternatives=(Residency.CONST,)) if path in tentative else s for path, s in specs.items()}
    inputs = dict(call.inputs)
    gm = trace(model, call.graph_input, {}, inputs, call.layouts, specs)
    for node in gm.graph.nodes:
        if node.op == "placeholder" and node.target in inputs:
            set_info(node, input=inputs[node.target])
    return gm, call


def _ids(ids: fx.Node) -> str:
    """What a lookup's ids are: ``g.global_ids``, ``arange(g.num_nodes)``, a constant's or a method's name."""
    if ids.target is torch.arange:
        return f"arange({_ids(ids.args[0])})"
    if ids.target is getattr:
        return f"{ids.args[0]}.{ids.args[1]}"
    return str(ids.target)


def _lookups(gm) -> list[tuple[str, str]]:
    """The F.embedding lookups in ``gm``: (their ids, see :func:`_ids`; the table)."""
    return [(_ids(n.args[0]), info(n.args[1]).table) for n in gm.graph.nodes
            if n.op == "call_function" and n.target is F.embedding]


def _run(gm, call, model, args):
    """gm's output on ``args`` (leaves as the call makes them, then each table), with the
    gradient of every table for the loss sum(out * weights)."""
    leaves = call.arguments(model.forward, args, {}, None)
    tables = [model.get_parameter(str(info(n).table)) for n in gm.graph.nodes if info(n).table is not None]
    for t in tables:
        t.grad = None
    out = gm(*leaves, *tables)
    out = out["paper"] if isinstance(out, dict) else out
    (out * torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
    return out.detach(), [t.grad.clone() for t in tables]


class OneType(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(N, 3)

    def forward(self, g, x):
        own = [
            self.emb(g.global_ids),
            self.emb(torch.arange(g.num_nodes)),
            self.emb(torch.arange(N)),  # the constant 0..n-1
            F.embedding(g.global_ids, self.emb.weight),
        ]
        other = [
            self.emb(torch.tensor([1, 0, 2, 3, 4, 5])),  # not in row order
            self.emb(torch.arange(N - 1)),  # not every row
            self.emb(g.global_ids.flip(0)),
        ]
        return sc.spmm(g, sum(own) + 2 * sum(o[:N - 1].sum(0) for o in other) + x, "sum")


@sarcompile_graph_api
def test_one_type_lookups_by_own_ids_become_the_table():
    model, g = OneType(), _graph()
    x = torch.randn(N, 3)
    gm, call = _traced(model, (g, x), {"emb.weight": (NODES, N)}, node_count=N)
    ids = ["g.global_ids", "arange(g.num_nodes)", "_tensor_constant0", "g.global_ids",
           "_tensor_constant1", "_tensor_constant2", "flip"]
    assert _lookups(gm) == [(i, "emb.weight") for i in ids]
    before = _run(gm, call, model, (g, x))
    gm = node_tables(gm)
    assert _lookups(gm) == [(i, "emb.weight") for i in ids[4:]]
    (table,) = [n for n in gm.graph.nodes if info(n).table == "emb.weight"]
    assert len(table.users) == 4 + 3  # the four rewritten lookups' uses, and the three left
    after = _run(gm, call, model, (g, x))
    torch.testing.assert_close(after[0], before[0], rtol=0, atol=0)
    torch.testing.assert_close(after[1], before[1], rtol=0, atol=0)
    # against the eager model too
    model.emb.weight.grad = None
    eager = model(g, x)
    (eager * torch.arange(eager.numel(), dtype=eager.dtype).reshape(eager.shape)).sum().backward()
    torch.testing.assert_close(after[0], eager.detach(), rtol=0, atol=1e-6)
    torch.testing.assert_close(after[1][0], model.emb.weight.grad, rtol=0, atol=1e-5)


def test_a_table_of_another_row_count_is_left():
    """``torch.arange(N)`` is all ids of a table of N rows only."""

    class Short(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(N, 3)

        def forward(self, g, x):
            return x + self.emb(torch.arange(N))

    model = Short()
    gm, _ = _traced(model, (_graph(), torch.randn(N, 3)), {"emb.weight": (NODES, N + 1)}, node_count=N)
    assert _lookups(node_tables(gm)) == [("_tensor_constant0", "emb.weight")]


@sarcompile_graph_api
def test_a_lookup_that_renormalises_rows_is_left():
    """``max_norm`` rewrites the table's rows in place as it reads them."""

    class Renormalised(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(N, 3, max_norm=1.0)

        def forward(self, g, x):
            return x + self.emb(g.global_ids) + F.embedding(torch.arange(g.num_nodes), self.emb.weight, None, 2.0)

    gm, _ = _traced(Renormalised(), (_graph(), torch.randn(N, 3)), {"emb.weight": (NODES, N)}, node_count=N)
    assert _lookups(node_tables(gm)) == [("g.global_ids", "emb.weight"), ("arange(g.num_nodes)", "emb.weight")]


class Typed(nn.Module):
    def __init__(self):
        super().__init__()
        self.author = nn.Embedding(5, 3)
        self.paper = nn.Embedding(5, 3)

    def forward(self, g, x):
        own = (self.author(g[W].src_global_ids) + self.author(g[R].global_ids)  # sources of W, destinations of R
               + self.author(torch.arange(g[W].num_src_nodes)) + self.author(torch.arange(g[R].num_nodes))
               + self.paper(g[W].global_ids) + self.paper(torch.arange(5)))
        other = self.author(g[W].global_ids) + self.paper(g[R].global_ids) + self.paper(torch.arange(g[W].num_src_nodes))
        return {"paper": own + 2 * other + x["paper"]}


@sarcompile_graph_api
def test_typed_lookups_by_their_types_ids_become_the_table():
    model, g = Typed(), _typed()
    x = {"paper": torch.randn(5, 3)}
    gm, call = _traced(model, (g, x), {"author.weight": ("author", 5), "paper.weight": ("paper", 5)})
    before = _run(gm, call, model, (g, x))
    gm = node_tables(gm)
    # papers' ids for the authors' table, authors' ids for the papers': left
    assert _lookups(gm) == [("g__author__writes__paper.global_ids", "author.weight"),
                            ("g__paper__rev_writes__author.global_ids", "paper.weight"),
                            ("arange(g__author__writes__paper.num_src_nodes)", "paper.weight")]
    after = _run(gm, call, model, (g, x))
    torch.testing.assert_close(after[0], before[0], rtol=0, atol=0)
    for a, b in zip(after[1], before[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class Tentative(nn.Module):
    """One parameter per use a table found by use may have (all of N rows)."""

    def __init__(self):
        super().__init__()
        self.rows = nn.Parameter(torch.randn(N, N))  # added to the nodes' rows: rows
        self.column = nn.Parameter(torch.randn(N, N))  # its first column, every row: rows
        self.picked = nn.Parameter(torch.randn(N, N))  # row 2: a constant
        self.looked_up = nn.Parameter(torch.randn(N, N))  # by other ids: a constant
        self.matrix = nn.Parameter(torch.randn(N, N))  # x @ matrix: only its whole tensor runs
        self.emb = nn.Embedding(N, N)  # by its own ids: the table, then rows

    def forward(self, g, x):
        h = x @ self.matrix + self.rows + self.column[:, :1] + self.picked[2] + self.emb(g.global_ids)
        return sc.spmm(g, h + F.embedding(torch.tensor([5, 4, 3, 2, 1, 0]), self.looked_up), "sum")


def test_tentative_tables_are_read_as_rows_or_constants_by_use():
    model, g = Tentative(), _graph()
    x = torch.randn(N, N)
    paths = ["rows", "column", "picked", "looked_up", "matrix", "emb.weight"]
    gm, call = _traced(model, (g, x), {p: (NODES, N) for p in paths}, tentative=tuple(paths), node_count=N)
    before = _run(gm, call, model, (g, x))
    gm = node_tables(gm)
    read = {info(n).table: info(n).input for n in gm.graph.nodes if info(n).table is not None}
    assert {p: s.residency for p, s in read.items()} == {
        "rows": Residency.NODE, "column": Residency.NODE, "picked": Residency.CONST,
        "looked_up": Residency.CONST, "matrix": Residency.CONST, "emb.weight": Residency.NODE}
    assert all(s.alternatives == () for s in read.values())
    after = _run(gm, call, model, (g, x))
    torch.testing.assert_close(after[0], before[0], rtol=0, atol=0)
    for a, b in zip(after[1], before[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_tables_found_by_name_are_not_decided_again():
    model, g = Tentative(), _graph()
    gm, _ = _traced(model, (g, torch.randn(N, N)), {"picked": (NODES, N)}, node_count=N)
    (table,) = [n for n in node_tables(gm).graph.nodes if info(n).table is not None]
    assert info(table).input.residency is Residency.NODE  # by name: rows, whatever its use


def test_an_own_id_lookup_with_a_padding_row_is_refused_naming_the_fix():
    """As the table itself its padding row would get a gradient F.embedding gives it none;
    so the compile is refused, not run wrong."""
    class Padded(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(N, 3, padding_idx=0)

        def forward(self, g, x):
            return sc.spmm(g, self.emb(g.global_ids) + x, "sum")

    model, g = Padded(), _graph()
    x = torch.randn(N, 3)
    gm, call = _traced(model, (g, x), {"emb.weight": (NODES, N)}, node_count=N)
    with pytest.raises(CompileError, match=r"'emb.weight'.*padding_idx=0.*drop padding_idx"):
        node_tables(gm)
