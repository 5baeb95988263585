"""Typed graphs for the tests, a model over their relations, and its worker side
(imported by the pool's workers too).

:class:`RelationNet` aggregates over every relation with the IR ops a heterogeneous
layer lowers to: ``spmm`` sum / mean / max / weighted sum from the source type's rows into
the destination type's, the fused ``attention`` with source and destination scores, and
``edge_reduce_src`` back onto the sources. On N workers it runs on ``part.graph`` (a
:class:`~sarcompile.graph.hetero.HeteroShard`) exactly the code one machine runs on the whole
:class:`~sarcompile.graph.hetero.HeteroGraph`.
"""

from __future__ import annotations

import contextlib

import torch
from hypothesis import strategies as st
from torch import nn

import sarcompile as sc
from sarcompile.graph.hetero import relation_key

TYPES = ("paper", "author", "field")
REDUCES = ("sum", "mean", "max", "weighted", "attention")
HEADS, CHANNELS = 2, 3


@st.composite
def typed_graphs(draw, max_nodes: int = 12, max_edges: int = 30):
    """(HeteroGraph, seed): 1-3 node types (some may have no nodes), 1-4 relations
    (within a type or across two, some with no edges), isolated nodes, multi-edges and
    self-loops as the draws fall. The first relation joins two types whenever there are
    two, and the first two types have nodes: the cases where a source row's number in
    its own type differs from its destination's are the ones that can go wrong."""
    types = TYPES[: draw(st.integers(1, len(TYPES)))]
    counts = {t: draw(st.integers(0 if i >= 2 else 1, max_nodes)) for i, t in enumerate(types)}
    edges = {}
    for i in range(draw(st.integers(1, 4))):
        if i == 0 and len(types) > 1:
            s, d = types[1], types[0]
        else:
            s, d = draw(st.sampled_from(types)), draw(st.sampled_from(types))
        edges[(s, f"r{i}", d)] = relation_edges(draw, counts, s, d, max_edges)
    return sc.HeteroGraph.from_edges(edges, counts), draw(st.integers(0, 2**16))


def relation_edges(draw, counts: dict[str, int], s: str, d: str, max_edges: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, dst)`` of a relation from type ``s`` to type ``d`` (``counts``: nodes per type),
    drawn in a hypothesis strategy: up to ``max_edges`` edges, none where a side has no
    nodes; multi-edges and self-loops as the draws fall."""
    m = draw(st.integers(0, max_edges)) if counts[s] and counts[d] else 0
    src = draw(st.lists(st.integers(0, max(counts[s] - 1, 0)), min_size=m, max_size=m))
    dst = draw(st.lists(st.integers(0, max(counts[d] - 1, 0)), min_size=m, max_size=m))
    return torch.tensor(src, dtype=torch.long), torch.tensor(dst, dtype=torch.long)


class RelationNet(nn.Module):
    """Per destination type: its own root linear plus, per relation into it, one
    aggregation of the source type's transformed rows (see the module docstring)."""

    def __init__(self, g: sc.HeteroGraph, f_in: int = 4, hidden: int = HEADS * CHANNELS):
        super().__init__()
        self.edge_types = g.edge_types
        self.root = nn.ModuleDict({t: nn.Linear(f_in, hidden) for t in g.node_types})
        self.lin = nn.ModuleDict({relation_key(r): nn.Linear(f_in, hidden) for r in g.edge_types})
        keys = [relation_key(r) for r in g.edge_types]
        self.att_src = nn.ParameterDict({k: nn.Parameter(torch.randn(HEADS, CHANNELS)) for k in keys})
        self.att_dst = nn.ParameterDict({k: nn.Parameter(torch.randn(HEADS, CHANNELS)) for k in keys})
        self.back = nn.Linear(hidden, hidden)

    def forward(self, g, x: dict[str, torch.Tensor], edge_weight: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {t: self.root[t](x[t]) for t in x}
        for i, rel in enumerate(self.edge_types):
            s, _, d = rel
            key, rg = relation_key(rel), g[rel]
            h = self.lin[key](x[s])
            reduce = REDUCES[i % len(REDUCES)]
            if reduce == "weighted":
                agg = sc.spmm(rg, h, "sum", edge_weight=edge_weight[key])
            elif reduce == "attention":
                hh = h.reshape(-1, HEADS, CHANNELS)
                a_src = (hh * self.att_src[key]).sum(-1)
                a_dst = (self.root[d](x[d]).reshape(-1, HEADS, CHANNELS) * self.att_dst[key]).sum(-1)
                agg = sc.ops.attention(rg, hh, a_src, a_dst).reshape(-1, HEADS * CHANNELS)
            else:
                agg = sc.spmm(rg, torch.sin(h), reduce)  # sin: signs mixed, max ties rare
            out[d] = out[d] + agg
            # and back onto the sources: per-edge values reduced into their source rows
            e = sc.sddmm(rg, h, out[d], "mul")
            out[s] = out[s] + self.back(sc.ops.edge_reduce_src(rg, e, "sum"))
        return out


class TableNet(RelationNet):
    """RelationNet with the types in ``featureless`` fed by a learnable node table each
    (``nn.Embedding`` in a ``ModuleDict`` keyed by type): the first by its rows as they
    are, the others looked up by the type's own ids (a type in no relation has no ids on
    the graph: its rows as they are too)."""

    def __init__(self, g: sc.HeteroGraph, featureless: tuple[str, ...], f_in: int = 4):
        super().__init__(g, f_in)
        self.emb = nn.ModuleDict({t: nn.Embedding(g.num_nodes(t), f_in) for t in featureless})

    def forward(self, g, x: dict[str, torch.Tensor], edge_weight: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        x = dict(x)
        linked = {t for s, _, d in self.edge_types for t in (s, d)}
        for i, t in enumerate(self.emb):
            x[t] = self.emb[t].weight if i == 0 or t not in linked else self.emb[t](g.global_ids[t])
        return super().forward(g, x, edge_weight)


def inputs(g: sc.HeteroGraph, seed: int, f_in: int = 4) -> dict:
    """Features per type, a weight per edge of each relation and loss weights per type."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    return {
        "x": {t: rand(g.num_nodes(t), f_in) for t in g.node_types},
        "edge_weight": {relation_key(r): rand(rg.num_edges) for r, rg in g.items()},
        "loss": {t: rand(g.num_nodes(t), HEADS * CHANNELS) for t in g.node_types},
    }


def step(model: RelationNet, g, data: dict, ids: dict | None, around=contextlib.nullcontext) -> dict:
    """Forward (inside the context ``around(x)``, given the features), a loss weighted per
    row, backward: the rows of ``ids`` (all when None)."""
    pick = (lambda t, v: v) if ids is None else (lambda t, v: v[ids[t]])
    x = {t: pick(t, v).clone().requires_grad_() for t, v in data["x"].items()}
    if ids is None:
        weights = data["edge_weight"]
    else:  # a relation's edge tensors on a shard are in shard order: edge_ids names them
        weights = {relation_key(r): data["edge_weight"][relation_key(r)][rg.edge_ids] for r, rg in g.items()}
    with around(x):
        out = model(g, x, weights)
    loss = sum((out[t] * pick(t, data["loss"][t])).sum() for t in out)
    model.zero_grad()
    loss.backward()
    return {
        "out": {t: v.detach() for t, v in out.items()},
        "x_grad": {t: v.grad for t, v in x.items()},
        # (a parameter no row reached has no gradient: zero, as on a worker without rows)
        "param_grads": {k: sc.global_sum(torch.zeros_like(p) if p.grad is None else p.grad)
                        for k, p in model.named_parameters() if not k.startswith("emb.")},
        # a node table's rows are the worker's own: its gradient rows too
        "table_grads": {k.split(".")[1]: (torch.zeros_like(p) if p.grad is None else p.grad).clone()
                        for k, p in model.named_parameters() if k.startswith("emb.")},
    }


def counted_step(model, g, data: dict, ids: dict) -> dict:
    """:func:`step` on a worker, with what the plan predicts counted as the runtime sees it:
    bytes received per phase, bytes autograd keeps for backward in the forward pass
    (parameters, node tables and the features aside, by storage: the plan counts them as
    such) and the most remote bytes alive at once."""
    from sarcompile.dist import traffic

    traffic.stats.reset()
    traffic.live.reset_peak()
    kept: dict[int, int] = {}

    def counting(x: dict):
        features = {v.untyped_storage().data_ptr() for v in x.values()}

        def pack(t):
            # (asked each time: the first call shards the node tables, giving them new storage)
            ptr = t.untyped_storage().data_ptr()
            if ptr not in features and ptr not in {p.untyped_storage().data_ptr() for p in model.parameters()}:
                kept[ptr] = t.untyped_storage().nbytes()
            return t

        return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

    result = step(model, g, data, ids, around=counting)
    return {**result, "received": traffic.stats.as_dict()["received"], "saved_bytes": sum(kept.values()),
            "peak_block_bytes": traffic.live.peak_bytes}


def run_worker(rank: int, world_size: int, payload: dict) -> dict:
    """One worker: load its part of the typed partition and take one step (with the model
    compiled when ``payload["compiled"]``)."""
    part = sc.load_partition(payload["dir"], rank=rank, world_size=world_size)
    featureless = payload.get("featureless")
    g = payload["graph"]
    model = (RelationNet(g) if featureless is None else TableNet(g, featureless)).double()
    model.load_state_dict(payload["state"])
    if payload.get("compiled"):  # the same model, compiled: the program over its relations
        model = sc.distribute(model)
    run = counted_step if payload.get("count") else step
    result = run(model, part.graph, payload["data"], part.global_ids)
    result["ids"] = part.global_ids
    return result
