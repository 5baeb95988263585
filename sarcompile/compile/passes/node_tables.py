"""Pass ``node_tables``: how each node table is read, and a table looked up by its own type's
ids is the table itself.

Contract. Expects a traced GraphModule whose node tables are placeholders
(``info(node).table``, see :mod:`sarcompile.graph.tables`, their ``info(node).input`` giving their type
and its node count in the whole graph) and whose typed graph inputs name their relation
(``info(node).input.of``). Rewrites ``F.embedding(ids, table)`` where ``ids`` is a relation's
``global_ids`` (its destination type) or ``src_global_ids`` (its source type), or
``torch.arange`` of its ``num_nodes`` / ``num_src_nodes`` (all ids of the type:
``torch.arange(g.num_nodes(ntype))`` in DGL code), or the constant ``0, 1, ..., n - 1`` with
``n`` the type's node count (``emb(torch.arange(num_authors))``), and the table is that
type's, with no ``max_norm`` (on a one-type graph: its ``global_ids`` or ``torch.arange`` of
its ``num_nodes``, and a table of its nodes, ``info(node).input.of`` None for both): every
node's own row, in row order -- which on a worker holding only its rows of the table is
the table, and on one machine equals the lookup. Any
other lookup of a table's rows is left for the ``residency`` pass to refuse (it reads rows
by position). Values are unchanged.

A table found by use is tentative (``info(node).input.alternatives`` holds ``const``, see
:func:`sarcompile.compile.tables.compile_with_tables`): its own-id lookups are rewritten as a table's,
then how it is read is decided by its use. One whose rows are read by position (``t[i]``,
``F.embedding`` by other ids) is a constant; the others start as their types' rows, and
while the example run (on the first of :data:`~sarcompile.ir.probe.PROBES`) fails, the
tentative table nearest the failing value (by its inputs) whose reading as a constant --
its whole tensor -- lets the run get past that value is read so (a ``[2, 3]`` attention
vector broadcast over rows, an ``[n, n]`` matrix in a matmul). Each ends as rows or as a
constant, with no alternatives left for the residency pass. (A program with a tentative
table read as a constant is compiled again without it: its rewritten lookups are right on
one machine only.)
"""

from __future__ import annotations

import functools
import operator
from dataclasses import replace

import torch
import torch.fx as fx
import torch.nn.functional as F

from sarcompile.errors import CompileError
from sarcompile.ir.node_info import info, set_info
from sarcompile.ir.probe import PROBES, example
from sarcompile.ir.vocab import Residency
from sarcompile.compile.example_run import run_example
from sarcompile.compile.passes.context import CompileOptions
from sarcompile.compile.source_lines import source_line

__all__ = ["node_tables"]


def _all_ids(gm: fx.GraphModule, ids: object, count: int) -> bool:
    """Whether ``ids`` is a constant of the program holding ``0, 1, ..., count - 1``."""
    if not (isinstance(ids, fx.Node) and ids.op == "get_attr"):
        return False
    value = functools.reduce(getattr, str(ids.target).split("."), gm)
    return isinstance(value, torch.Tensor) and torch.equal(value, torch.arange(count, device=value.device))


def _own_ids_types(ids: object) -> list[str | None]:
    """The node type whose every node ``ids`` names in row order, as ``[type]`` (``[None]``:
    a one-type graph's nodes), if it is a graph's ``global_ids`` / ``src_global_ids``, or
    ``torch.arange`` of its ``num_nodes`` / ``num_src_nodes`` (all ids of the type, as one
    machine numbers them); else ``[]``."""
    if isinstance(ids, fx.Node) and ids.op == "call_function" and ids.target is torch.arange and len(ids.args) == 1 \
            and not ids.kwargs:
        return _graph_end(ids.args[0], {"num_nodes": 2, "num_src_nodes": 0})
    return _graph_end(ids, {"global_ids": 2, "src_global_ids": 0})


def _graph_end(node: object, attrs: dict[str, int]) -> list[str | None]:
    """``[the node type at end attrs[attr]]`` of the relation ``node`` reads ``attr`` of
    (``[None]`` for a one-type graph's destinations: its nodes, whose count its tables'
    rows have, as every per-node value's there); ``[]`` if ``node`` reads no such attribute
    of a graph input."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is getattr):
        return []
    graph, attr = node.args
    spec = info(graph).input if isinstance(graph, fx.Node) and graph.op == "placeholder" else None
    if spec is None or spec.residency is not Residency.GRAPH or attr not in attrs:
        return []
    if spec.of is None:
        return [None] if attrs[attr] == 2 else []
    return [spec.of[attrs[attr]]]


def node_tables(gm: fx.GraphModule, ctx: CompileOptions | None = None) -> fx.GraphModule:
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not F.embedding:
            continue
        ids = node.args[0] if node.args else node.kwargs.get("input")
        table = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
        if not (isinstance(table, fx.Node) and info(table).table is not None):
            continue
        rest = {**dict(zip(("padding_idx", "max_norm"), node.args[2:4])), **node.kwargs}
        if rest.get("max_norm") is not None:
            continue  # renormalises rows in place: left for the residency pass
        spec = info(table).input
        if spec.of in _own_ids_types(ids) or _all_ids(gm, ids, spec.shape[0]):
            if rest.get("padding_idx") is not None:
                # As the table itself its padding row would be trained; as a lookup on a worker
                # the ids would index the worker's rows, not the table's: neither is exact.
                line = source_line(node)
                raise CompileError(
                    f"{line + ': ' if line else ''}node table {info(table).table!r} is looked up by its own nodes' ids "
                    f"with padding_idx={rest['padding_idx']}; a node table has a row for every node and none for "
                    "padding, so drop padding_idx (nn.Embedding(num_nodes, dim) without it)"
                )
            node.replace_all_uses_with(table)
            gm.graph.erase_node(node)
            if not ids.users:
                gm.graph.erase_node(ids)
    _read_tentative_tables(gm)
    gm.recompile()
    return gm


def _read_tentative_tables(gm: fx.GraphModule) -> None:
    """Decide how each tentative table is read (see the module docstring)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    tentative = [n for n in placeholders if info(n).table is not None and info(n).input.alternatives]
    if not tentative:
        return
    # a tentative table read by position (an index, a lookup by other ids) is a constant
    constant = {n for n in tentative if any(_by_position(user, n) for user in n.users)}
    if all(info(n).input is not None for n in placeholders):  # (else no example run: rows)
        nodes = list(gm.graph.nodes)
        failed = _failure(gm, placeholders, constant)
        while 0 <= failed < len(nodes):
            later = ((s, _failure(gm, placeholders, constant | {s})) for s in _nearest(nodes[failed], tentative))
            s, after = next(((s, after) for s, after in later if after > failed), (None, failed))
            if s is None:
                break
            constant.add(s)
            failed = after
    for n in tentative:
        set_info(n, input=replace(info(n).input, residency=Residency.CONST if n in constant else Residency.NODE,
                                  alternatives=()))


def _failure(gm: fx.GraphModule, placeholders: list[fx.Node], constant: set[fx.Node]) -> int:
    """The position in ``gm`` of the first value the example run fails to compute, with the
    tentative tables of ``constant`` read as constants: the number of nodes where it runs
    through, -1 where a front-end refuses the call so made."""
    specs = [info(n).input for n in placeholders]
    inputs = [example(replace(s, residency=Residency.CONST) if n in constant else s, PROBES[0], _device(gm))
              for n, s in zip(placeholders, specs)]
    try:
        rec, why = run_example(gm, inputs, gm)
    except CompileError:
        return -1
    nodes = list(gm.graph.nodes)
    return next((i for i, n in enumerate(nodes) if n not in rec.shapes), len(nodes)) if why else len(nodes)


def _by_position(user: fx.Node, table: fx.Node) -> bool:
    """Whether ``user`` reads rows of ``table`` by position: ``F.embedding`` with it as the
    weight (what looks every row up by its own id is gone), or an index that does not keep
    every row (``table[i]``, ``table[:2]``; not ``table[:, 0]`` or ``table[..., 0]``)."""
    if user.op != "call_function":
        return False
    if user.target is F.embedding:
        return table in user.args[1:2] or user.kwargs.get("weight") is table
    if user.target is not operator.getitem or user.args[0] is not table:
        return False
    index = user.args[1]
    first = index[0] if isinstance(index, tuple) and index else index
    return not (first is Ellipsis or isinstance(first, slice) and first == slice(None))


def _nearest(node: fx.Node, tentative: list[fx.Node]) -> list[fx.Node]:
    """The tentative tables ``node`` is computed from, nearest first (by its inputs)."""
    seen, queue, found = {node}, [node], []
    for n in queue:
        if n in tentative:
            found.append(n)
        for a in n.all_input_nodes:
            if a not in seen:
                seen.add(a)
                queue.append(a)
    return found


def _device(gm: fx.GraphModule) -> torch.device:
    tensor = next(iter(gm.parameters()), None)
    return tensor.device if tensor is not None else torch.device("cpu")
