"""Compiling a model with its node tables (:mod:`sarcompile.graph.tables` says what they
are): the tables found by name first, then, where the program is refused, every tentative
table decided by use (the ``node_tables`` pass). Each table is a program input of its own
(:func:`table_input`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, TypeVar

import torch
import torch.fx as fx
from torch import nn

from sarcompile import logs
from sarcompile.errors import CompileError
from sarcompile.graph.tables import NODES, find_node_tables
from sarcompile.ir.node_info import info
from sarcompile.ir.probe import Input
from sarcompile.ir.vocab import Residency

__all__ = ["compile_with_tables", "input_type", "table_input"]

P = TypeVar("P")
# run(tables, traced): a program compiled with node tables ``tables`` (parameter name -> its
# input), which puts the module it traced into ``traced`` (whatever the passes then do).
Run = Callable[[dict[str, Input], list[fx.GraphModule]], P]


def table_input(p: torch.Tensor, ntype: str, count: int) -> Input:
    """The program input a table of ``ntype`` becomes: per-node rows of its type, which has
    ``count`` nodes in the whole graph (a worker's table holds only its own); of no type on
    a one-type graph (:data:`NODES`), as its other per-node inputs."""
    return Input(Residency.NODE, (count, *p.shape[1:]), p.dtype, of=None if ntype == NODES else ntype)


def input_type(spec: Input) -> str:
    """The node type of a table's program input ``spec`` (see :func:`table_input`)."""
    return NODES if spec.of is None else spec.of


def compile_with_tables(model: nn.Module, counts: dict[str, int], run: Run[P]) -> P:
    """The program of ``model`` over a graph whose types have ``counts`` nodes (a one-type
    graph: ``{NODES: its node count}``), with its node tables (``run``: see :data:`Run`):
    those found by name; where that program is refused, those found by use (see the module
    docstring)."""
    compiles = _Compiles(model, counts, find_node_tables(model, counts), run)
    try:
        return compiles.attempt({})[0]
    except CompileError as refused:
        guesses = _guesses(model, counts, compiles.named)
        if not guesses:
            raise
        return _by_use(compiles, guesses, refused)


def _guesses(model: nn.Module, counts: dict[str, int], named: dict[str, str]) -> dict[str, list[str]]:
    """``{parameter name: the node types whose count is its first size}`` for the
    parameters that are not tables by name but could be by use: matrices (or more) of more
    than one row. A type the name contains comes first (``author_emb`` and the authors)."""
    guesses = {}
    for path, p in model.named_parameters():
        types = [t for t, n in counts.items() if n == p.shape[0]] if p.dim() >= 2 and p.shape[0] > 1 else []
        if types and path not in named:
            guesses[path] = sorted(types, key=lambda t: t not in path)
    return guesses


def _by_use(compiles: "_Compiles", guesses: dict[str, list[str]], refused: CompileError) -> Any:
    """The program with the node tables found by name and, of ``guesses``, those whose rows
    the program uses as their type's rows. Each round compiles with every guess still open
    as a table of its first open type, which the node_tables pass reads as rows or as a
    constant by its use (:meth:`_Compiles.attempt`); a guess read as a constant is ruled
    out for that type, and the rounds go on until every guess left is read as rows (the
    program then has no tentative table whose rows it does not use as rows: the
    node_tables pass replaced their lookups of every row by the table, which only a
    table's rows make right). A program refused with guesses read as rows is tried without
    each of them in turn (such a guess's use was ambiguous: the example ran either way).
    Refused for good: ``refused`` (the program with the tables found by name) unless some
    guess was read as rows (then what refused that program: a refusal past the tables)."""
    open_types = {path: list(types) for path, types in guesses.items()}
    while open_types:
        choice = {path: types[0] for path, types in open_types.items()}
        program, rows, constants, error = compiles.attempt(choice)
        dropped = set()
        if error is not None and rows:  # read as rows, then refused: one may be a constant after all
            for path in sorted(rows, key=lambda p: (choice[p] in p, p)):  # (those named by no type first)
                program, rows, constants, again = compiles.attempt({p: t for p, t in choice.items() if p != path})
                if again is None:
                    error, dropped = None, {path}
                    break
            if error is not None:
                raise error
        if error is not None:
            raise refused
        if not constants:
            logs.log("plan", f"{type(compiles.model).__name__}: node tables found by use: "
                             f"{', '.join(f'{p!r} (rows of {_words(choice[p])})' for p in sorted(rows))}")
            return program
        open_types = {path: types[1:] if path in constants | dropped else types
                      for path, types in open_types.items() if path not in constants | dropped or len(types) > 1}
    raise refused


def _words(ntype: str) -> str:
    return "the nodes" if ntype == NODES else repr(ntype)


@dataclass
class _Compiles:
    """Compiles ``model`` (:data:`Run`) over a typed graph whose types have ``counts``
    nodes, with the node tables ``named`` and tentative ones."""

    model: nn.Module
    counts: dict[str, int]
    named: dict[str, str]
    run: Run

    def attempt(self, choice: dict[str, str]) -> tuple[Any, set[str], set[str], CompileError | None]:
        """``(program or None, the parameters of choice read as rows, those read as
        constants, the refusal or None)`` compiled with the tables found by name and,
        tentatively, ``choice``: each an input of its type's rows that the node_tables pass
        may read as a constant instead (a parameter the program never reads is neither).
        Without ``choice``, a refusal is raised."""
        def spec(path: str, t: str) -> Input:
            return table_input(self.model.get_parameter(path), t, self.counts[t])

        tables = {path: spec(path, t) for path, t in self.named.items()}
        tables |= {path: replace(spec(path, t), alternatives=(Residency.CONST,)) for path, t in choice.items()}
        traced: list[fx.GraphModule] = []
        if not choice:
            return self.run(tables, traced), set(), set(), None
        try:
            program, error = self.run(tables, traced), None
        except CompileError as e:
            program, error = None, e
        # how the node_tables pass read each, where it ran (it leaves no alternatives)
        read = {info(node).table: info(node).input.residency for node in (traced[0].graph.nodes if traced else ())
                if node.op == "placeholder" and info(node).table in choice
                and not info(node).input.alternatives}
        rows = {path for path, res in read.items() if res is Residency.NODE}
        return program, rows, set(read) - rows, error
