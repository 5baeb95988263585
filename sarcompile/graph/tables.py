"""Node tables: learnable parameters with one row per node of a type (featureless types).

ogbn-mag's authors, institutions and fields of study have no features, so models give each
such type a learnable table -- ``nn.Embedding(num_authors, 128)``, or an ``nn.Parameter`` of
that shape -- and use its rows as the type's features (``x_dict["author"] =
self.author_emb.weight``, or the lookup ``emb(g.global_ids["author"])`` /
``emb(torch.arange(num_authors))``). Such a table is *node-resident*: on N workers each holds,
updates and computes gradients for its own rows only, and it is never all-reduced.

A parameter is a node table of type ``t`` when it is a matrix (or more) with one row per
node of ``t`` in the whole graph, and either

* it is named by ``t`` -- the weight of an ``nn.Embedding`` whose own name is ``t``
  (``emb.t.weight``), or a parameter whose own name is ``t`` (``embeds.t`` in a
  ``ParameterDict``) -- or
* its rows are used as the rows of ``t``, whatever its name (``self.field_emb``, a bare
  ``nn.Parameter``, a ``ParameterDict`` under another key): where the program is refused
  with the tables found by name, it is compiled again with every other parameter whose
  first size is a type's node count (of more than one row: per-type ``[1, d]`` vectors are
  too common) as a tentative table of that type (:func:`sarcompile.compile.tables.compile_with_tables`), and the
  ``node_tables`` pass decides by use (:mod:`sarcompile.compile.passes.node_tables`): one read by
  position (``w[i]``) is a constant, the others are rows unless the example run only gets
  through with one read as its whole tensor (an ``[n, n]`` weight in a matmul, an attention
  vector broadcast over rows). A tentative table read as rows whose program is then
  refused is tried as a constant too (``bias.sum(0)`` runs either way), and what compiles
  is kept. ``SARCOMPILE_LOGS=plan`` says which parameters were found so, and the plan
  lists every table.

On a one-type graph the same is done with the graph as the single node type :data:`NODES`
(whose per-node inputs, as every per-node value there, have no type: ``Input.of`` None):
a parameter with one row per node of the whole graph whose rows are used as the nodes'
rows (DGL's RGCN entity example's ``x = self.emb.weight``) is the graph's node table, found
by use only (there is no type to name it).

The name rule asks for all of it so that a per-type ``Linear`` (``loop.t.weight``) whose
width happens to equal a type's count, or a per-type scalar (PyG HGTConv's ``skip.t``, shape
``[1]``) of a type with one node, is never mistaken for one.
The tracer gives each table a program input of its own (:func:`sarcompile.compile.tables.table_input`); in a worker
:func:`shard_tables` keeps only the worker's rows, in its row order, and marks the
parameter (:func:`table_type`, :func:`table_rows`), so gradient sync skips it and
checkpoints know the global ids of its rows (:mod:`sarcompile.data.checkpoint`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from sarcompile.errors import CompileError

__all__ = ["NODES", "find_node_tables", "follow_rows", "mark_sharded", "shard_rows", "shard_tables", "table_rows",
           "table_type"]

# The node type of a one-type graph, as the tables of its nodes name it (no name: the types
# of typed graphs have one).
NODES = ""

_MARK = "_sarcompile_node_table"  # set on a sharded table: its node type
_ROWS = "_sarcompile_node_rows"  # and the global ids of its rows, and its type's node count
_FOLLOW = "_sarcompile_on_shard"  # set on a whole table: what else to shard with it (see follow_rows)


def table_type(p: torch.Tensor) -> str | None:
    """The node type whose local rows ``p`` holds, if it is a sharded node table."""
    return getattr(p, _MARK, None)


def table_rows(p: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """``(global ids of its rows, node count of its type)`` of a sharded node table."""
    return getattr(p, _ROWS, None)


def mark_sharded(p: torch.Tensor, ntype: str, ids: torch.Tensor, count: int) -> None:
    """Mark ``p`` as a worker's rows of a node table of ``ntype`` (``count`` nodes in the
    whole graph), row ``i`` being node ``ids[i]``: gradient sync skips it, checkpoints write
    its rows with their ids, and the compiler takes it as its type's node rows."""
    setattr(p, _MARK, ntype)
    setattr(p, _ROWS, (ids.cpu(), count))


def find_node_tables(model: nn.Module, counts: dict[str, int]) -> dict[str, str]:
    """``{parameter name: node type}`` for the node tables of ``model`` on a graph whose
    types have ``counts`` nodes (see the module docstring); a table already sharded keeps
    its type."""
    out = {}
    for path, p in model.named_parameters():
        marked = table_type(p)
        if marked is not None:
            out[path] = marked
            continue
        if p.dim() < 2:
            continue
        name = _table_name(model, path)
        if name in counts and p.shape[0] == counts[name]:
            out[path] = name
    return out


def _table_name(model: nn.Module, path: str) -> str:
    """The name a parameter is known by as a table: its embedding's name for an
    ``nn.Embedding``'s weight, its own name otherwise."""
    owner_path, _, leaf = path.rpartition(".")
    owner = model.get_submodule(owner_path) if owner_path else model
    if isinstance(owner, nn.Embedding) and leaf == "weight":
        return owner_path.rpartition(".")[2]
    return leaf


def follow_rows(p: torch.Tensor, shard: Callable[[torch.Tensor], None]) -> None:
    """Call ``shard(global ids of the kept rows)`` when :func:`shard_tables` shards the
    whole table ``p``: per-row state loaded whole beside it (a resumed optimizer's) then
    keeps the same rows."""
    setattr(p, _FOLLOW, shard)


def shard_rows(graph: Any) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """``(global ids of its rows, node count of the whole graph)`` per node type of a
    worker's shard (``part.graph``: typed, or one-type as the single type :data:`NODES`),
    as :func:`shard_tables` takes them."""
    if isinstance(graph.global_ids, dict):
        return graph.global_ids, graph.num_global_nodes
    return {NODES: graph.global_ids}, {NODES: graph.num_global_nodes}


def shard_tables(model: nn.Module, tables: dict[str, str], global_ids: dict[str, torch.Tensor],
                 num_global_nodes: dict[str, int]) -> None:
    """Keep only a worker's rows of each node table (``global_ids[t]`` names them, in the
    worker's row order), once: the parameter object stays the same, so optimizers and the
    compiled program keep referring to it. Every worker initialised the whole table with
    the same seed, so its rows are the ones one machine starts from. (A
    :class:`sarcompile.nn.NodeTable` made with the worker's rows is never whole: it is
    marked sharded from the start, and left as it is here.)"""
    for path, ntype in tables.items():
        p = model.get_parameter(path)
        ids = global_ids[ntype]
        if table_type(p) == ntype:
            if p.shape[0] != ids.numel():
                raise CompileError(
                    f"node table {path!r} holds {p.shape[0]} rows of {ntype!r}, but this worker owns {ids.numel()}: "
                    "it was sharded for another partition; load the checkpoint into a fresh model"
                )
            continue
        if p.shape[0] != num_global_nodes[ntype]:
            raise CompileError(f"node table {path!r} has {p.shape[0]} rows; node type {ntype!r} has "
                               f"{num_global_nodes[ntype]} nodes")
        with torch.no_grad():
            p.data = p.data[ids.to(p.device)].clone()
        if p.grad is not None:
            p.grad = None
        mark_sharded(p, ntype, ids, num_global_nodes[ntype])
        follow = getattr(p, _FOLLOW, None)
        if follow is not None:
            delattr(p, _FOLLOW)
            follow(ids)

