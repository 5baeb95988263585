"""Node tables: learnable parameters with one row per node of a type (featureless types).

ogbn-mag's authors, institutions and fields of study have no features, so models give each
such type a learnable table: ``nn.Embedding(num_authors, 128)`` in a ``ModuleDict`` keyed by
type, or an ``nn.Parameter`` in a ``ParameterDict`` keyed by type (DGL's RGCN example), and
use its rows as the type's features (``emb["author"].weight``, or the lookup
``emb["author"](g.global_ids["author"])``). Such a table is *node-resident*: on N workers
each holds, updates and computes gradients for its own rows only, and it is never
all-reduced.

A parameter is a node table of type ``t`` when it is named by ``t`` -- the weight of an
``nn.Embedding`` whose own name is ``t`` (``emb.t.weight``), or a parameter whose own name
is ``t`` (``embeds.t`` in a ``ParameterDict``) -- and it is a matrix (or more) with one row
per node of ``t`` in the whole graph. The rule asks for all of it so that a per-type
``Linear`` (``loop.t.weight``) whose width happens to equal a type's count, or a per-type
scalar (PyG HGTConv's ``skip.t``, shape ``[1]``) of a type with one node, is never
mistaken for one.
The tracer gives each table a program input of its own (:func:`table_input`); in a worker
:func:`shard_tables` keeps only the worker's rows, in its row order, and marks the
parameter (:func:`table_type`), so gradient sync skips it and checkpoints know how to put
its rows back in global order (:func:`sarcompile.data.checkpoint.global_state`).
"""

from __future__ import annotations

import torch
from torch import nn

from .errors import CompileError
from .ir.probe import Input
from .ir.vocab import Residency

__all__ = ["find_node_tables", "table_type", "shard_tables", "table_input"]

_MARK = "_sarcompile_node_table"  # set on a sharded table: its node type


def table_type(p: torch.Tensor) -> str | None:
    """The node type whose local rows ``p`` holds, if it is a sharded node table."""
    return getattr(p, _MARK, None)


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


def table_input(p: torch.Tensor, ntype: str) -> Input:
    """The program input a table of ``ntype`` becomes: per-node rows of its type."""
    return Input(Residency.NODE, tuple(p.shape), p.dtype, of=ntype)


def shard_tables(model: nn.Module, tables: dict[str, str], global_ids: dict[str, torch.Tensor],
                 num_global_nodes: dict[str, int]) -> None:
    """Keep only a worker's rows of each node table (``global_ids[t]`` names them, in the
    worker's row order), once: the parameter object stays the same, so optimizers and the
    compiled program keep referring to it. Every worker initialised the whole table with
    the same seed, so its rows are the ones one machine starts from."""
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
        setattr(p, _MARK, ntype)

