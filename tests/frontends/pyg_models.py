"""Plain PyG models and the PyG distributed cases: the parent's side (:func:`check_distributed`,
against eager PyG on the whole graph) and the workers' (:func:`run_worker`; imported by the
workers too, so it lives at a module path they can import)."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
import torch_geometric.nn as gnn
from hypothesis import assume
from hypothesis import strategies as st
from torch import nn
from torch_geometric.utils import add_self_loops, degree, dropout_edge, scatter

import sarcompile as sc
from sarcompile.graph.shard import PartData, ShardGraph, split_graph
from plain_models import PlainMean, PlainScatter
from strategies import graphs

DT = torch.float64
TOL = 1e-9  # float64: the only differences are summation order


def sage_bn_gcn(f_in: int = 6, hidden: int = 8, f_out: int = 3) -> nn.Module:
    """Three layers built with torch_geometric.nn.Sequential: SAGE (mean) + BatchNorm,
    GCN + BatchNorm (no affine), SAGE (max), SAGE (min), PyG's Linear at the end."""
    return gnn.Sequential("x, edge_index", [
        (gnn.SAGEConv(f_in, hidden), "x, edge_index -> x"),
        gnn.BatchNorm(hidden),
        nn.ReLU(),
        (gnn.GCNConv(hidden, hidden), "x, edge_index -> x"),
        gnn.BatchNorm(hidden, affine=False, momentum=None),
        nn.Tanh(),
        (gnn.SAGEConv(hidden, hidden, aggr="max"), "x, edge_index -> x"),
        nn.Tanh(),
        (gnn.SAGEConv(hidden, hidden, aggr="min"), "x, edge_index -> x"),
        gnn.Linear(hidden, f_out),
    ])


class AttentionMix(nn.Module):
    """GAT (heads concatenated, residual) -> GATv2 (shared weights, heads averaged) ->
    GraphConv (mean) + GIN, with a skip connection."""

    def __init__(self, f_in: int = 6, f_out: int = 3):
        super().__init__()
        self.gat = gnn.GATConv(f_in, 4, heads=2, residual=True)
        self.gatv2 = gnn.GATv2Conv(8, 5, heads=3, concat=False, share_weights=True, negative_slope=0.1)
        self.graph_conv = gnn.GraphConv(5, f_out, aggr="mean")
        self.gin = gnn.GINConv(nn.Sequential(nn.Linear(8, f_out), nn.ReLU()), eps=0.5, train_eps=True)

    def forward(self, x, edge_index):
        h = F.elu(self.gat(x, edge_index))
        return self.graph_conv(F.elu(self.gatv2(h, edge_index)), edge_index) + self.gin(h, edge_index)


class DropAttention(nn.Module):
    """GAT and GATv2 with attention dropout (sarcompile's edge-keyed masks)."""

    def __init__(self, f_in: int = 6, f_out: int = 3):
        super().__init__()
        self.gat = gnn.GATConv(f_in, 4, heads=2, dropout=0.4)
        self.gatv2 = gnn.GATv2Conv(8, f_out, heads=2, concat=False, dropout=0.3)

    def forward(self, x, edge_index):
        return self.gatv2(F.elu(self.gat(x, edge_index)), edge_index)


class DropEverywhere(nn.Module):
    """Dropout as PyG's examples write it: ``F.dropout`` on the input, ``nn.Dropout`` between
    layers, ``dropout_edge`` on the graph, attention dropout, and a PyG ``MLP``'s own."""

    def __init__(self, f_in: int = 6, f_out: int = 3):
        super().__init__()
        self.conv1 = gnn.GCNConv(f_in, 8)
        self.drop = nn.Dropout(0.3)
        self.gat = gnn.GATConv(8, 4, heads=2, dropout=0.2)
        self.mlp = gnn.MLP([8, 8, f_out], dropout=0.4)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.5, training=self.training)
        kept, _ = dropout_edge(edge_index, p=0.3, training=self.training)
        h = self.drop(F.relu(self.conv1(x, kept)))
        return self.mlp(F.elu(self.gat(h, edge_index)))


class Weighted(nn.Module):
    """Edge weights through GCN (improved, with self-loops), GCN without self-loops and
    GraphConv (mean): ``forward(x, edge_index, edge_weight)``."""

    def __init__(self, f_in: int = 6, f_out: int = 3):
        super().__init__()
        self.gcn = gnn.GCNConv(f_in, 8, improved=True)
        self.gcn_no_loops = gnn.GCNConv(8, 8, add_self_loops=False)
        self.graph_conv = gnn.GraphConv(8, f_out, aggr="mean")

    def forward(self, x, edge_index, edge_weight):
        h = torch.tanh(self.gcn(x, edge_index, edge_weight))
        h = torch.tanh(self.gcn_no_loops(h, edge_index, edge_weight))
        return self.graph_conv(h, edge_index, edge_weight)


class EdgeMLPConv(gnn.MessagePassing):
    """A user's own MessagePassing layer, EdgeConv-style with edge features:
    ``message = mlp(x_i, x_j - x_i, edge_attr)``, then a root term."""

    def __init__(self, f_in: int, f_edge: int, f_out: int, aggr: str = "max"):
        super().__init__(aggr=aggr)
        self.mlp = nn.Sequential(nn.Linear(2 * f_in + f_edge, 7), nn.Tanh(), nn.Linear(7, f_out))
        self.root = nn.Linear(f_in, f_out)

    def forward(self, x, edge_index, edge_attr):
        return self.propagate(edge_index, x=x, edge_attr=edge_attr) + self.root(x)

    def message(self, x_i, x_j, edge_attr):
        return self.mlp(torch.cat([x_i, x_j - x_i, edge_attr], dim=-1))


class EdgeFeatures(nn.Module):
    """Generic MessagePassing layers (a user's EdgeMLPConv, PyG's GINEConv and EdgeConv)
    with edge features: ``forward(x, edge_index, edge_attr)``, ``edge_attr [E, 3]``."""

    def __init__(self, f_in: int = 6, f_out: int = 3):
        super().__init__()
        self.conv1 = EdgeMLPConv(f_in, 3, 8, "max")
        self.conv2 = gnn.GINEConv(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)), edge_dim=3)
        self.conv3 = EdgeMLPConv(8, 3, 8, "mean")
        self.conv4 = gnn.EdgeConv(nn.Linear(16, f_out), aggr="add")

    def forward(self, x, edge_index, edge_attr):
        h = torch.sin(self.conv1(x, edge_index, edge_attr))
        h = torch.tanh(self.conv2(h, edge_index, edge_attr))
        h = torch.tanh(self.conv3(h, edge_index, edge_attr))
        return self.conv4(h, edge_index)


class EdgeAttention(nn.Module):
    """GATConv and GATv2Conv with edge features ``edge_attr [E, 3]``: the new self-loops'
    features filled by 'mean', 'max' and a float; one layer without self-loops (its edge
    features as given). Attention dropout > 0: compared in eval mode (see ``EVAL``)."""

    def __init__(self, f_in: int = 6, f_out: int = 3):
        super().__init__()
        self.gat = gnn.GATConv(f_in, 4, heads=2, edge_dim=3, dropout=0.3, residual=True)
        self.gatv2 = gnn.GATv2Conv(8, 4, heads=2, edge_dim=3, fill_value="max", dropout=0.2)
        self.gat_no_loops = gnn.GATConv(8, 5, heads=2, concat=False, edge_dim=3, add_self_loops=False)
        self.gatv2_float = gnn.GATv2Conv(5, f_out, edge_dim=3, fill_value=0.5, share_weights=True)

    def forward(self, x, edge_index, edge_attr):
        h = F.elu(self.gat(x, edge_index, edge_attr))
        h = F.elu(self.gatv2(h, edge_index, edge_attr))
        h = F.elu(self.gat_no_loops(h, edge_index, edge_attr))
        return self.gatv2_float(h, edge_index, edge_attr)


class TutorialGCNConv(gnn.MessagePassing):
    """PyG's "Creating message passing networks" tutorial layer, in our words: ``deg^-1/2`` with
    the infinite entries (nodes without in-edges, ``loops=False``) zeroed by a masked assignment,
    ``deg_inv_sqrt[deg_inv_sqrt == float('inf')] = 0``."""

    def __init__(self, f_in: int, f_out: int, loops: bool = True):
        super().__init__(aggr="add")
        self.lin = nn.Linear(f_in, f_out, bias=False)
        self.bias = nn.Parameter(torch.randn(f_out) / 10)
        self.loops = loops

    def forward(self, x, edge_index):
        if self.loops:
            edge_index, _ = add_self_loops(edge_index, num_nodes=x.size(0))
        x = self.lin(x)
        row, col = edge_index
        deg = degree(col, x.size(0), dtype=x.dtype)
        deg_inv_sqrt = deg.pow(-0.5)
        deg_inv_sqrt[deg_inv_sqrt == float("inf")] = 0
        norm = deg_inv_sqrt[row] * deg_inv_sqrt[col]
        return self.propagate(edge_index, x=x, norm=norm) + self.bias

    def message(self, x_j, norm):
        return norm.view(-1, 1) * x_j


class MaskedUpdates(gnn.MessagePassing):
    """``t[mask] = value`` in the forms sarcompile rewrites: a parameter vector on the masked
    rows, ``t[mask] += 1``, ``t[mask] = y[mask] * 2`` (the mask computed twice), a number on
    per-edge values by a per-edge mask."""

    def __init__(self, f_in: int, f_out: int):
        super().__init__(aggr="add")
        self.lin = nn.Linear(f_in, f_out)
        self.fill = nn.Parameter(torch.randn(f_out))

    def forward(self, x, edge_index):
        row, col = edge_index
        h = self.lin(x)
        h[h[:, 0] > 0] = self.fill
        h[h < -0.5] += 1.0
        y = torch.tanh(x[:, : self.lin.out_features])
        h[h[:, 1] > 0.2] = y[h[:, 1] > 0.2] * 2
        w = (h[row] * h[col]).sum(-1)
        w[w < 0] = 0.25
        return self.propagate(edge_index, x=h, w=w)

    def message(self, x_j, w):
        return x_j * w.unsqueeze(-1)


class MaskedAssignments(nn.Module):
    """The tutorial's layer with and without self-loops, then :class:`MaskedUpdates`."""

    def __init__(self, f_in: int = 6, f_out: int = 3):
        super().__init__()
        self.conv1 = TutorialGCNConv(f_in, 8)
        self.conv2 = TutorialGCNConv(8, 8, loops=False)
        self.conv3 = MaskedUpdates(8, f_out)

    def forward(self, x, edge_index):
        h = torch.tanh(self.conv1(x, edge_index))
        return self.conv3(torch.tanh(self.conv2(h, edge_index)), edge_index)


class FeaturelessRGCN(nn.Module):
    """PyG's examples/rgcn.py model: ``RGCNConv(num_nodes, ...)`` called with ``x=None`` (each
    node's own row of the weight), a ``FastRGCNConv`` the same way, then an ``RGCNConv`` on
    features; ``forward(edge_index, edge_type)``."""

    def __init__(self, num_nodes: int, relations: int, num_bases: int | None = None, f_out: int = 3):
        super().__init__()
        self.conv1 = gnn.RGCNConv(num_nodes, 6, relations, num_bases=num_bases)
        self.conv2 = gnn.FastRGCNConv(num_nodes, 6, relations, num_bases=num_bases, aggr="add")
        self.conv3 = gnn.RGCNConv(6, f_out, relations, num_bases=2)

    def forward(self, edge_index, edge_type):
        h = F.relu(self.conv1(None, edge_index, edge_type) + self.conv2(None, edge_index, edge_type))
        return self.conv3(h, edge_index, edge_type)


def run_relational_worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """:class:`FeaturelessRGCN` on this shard, ``edge_type`` in shard order: output rows and
    all-reduced parameter gradients of ``sum(out * w)``."""
    part: PartData = payload["part"]
    shard = ShardGraph.from_part(part, rank, world_size, payload["num_nodes"], payload["num_edges"])
    model = FeaturelessRGCN(payload["num_nodes"], payload["relations"], payload["num_bases"]).double()
    model.load_state_dict(payload["state"])
    out = sc.distribute(model)(shard, payload["edge_type"][shard.edge_ids])
    (out * part.node_data["w"]).sum().backward()
    sc.sync_gradients(model)
    return {"out": out.detach(), "grads": {k: p.grad.clone() for k, p in model.named_parameters()}}


class PlainReductions(nn.Module):
    """Every reduction of ``scatter_reduce`` (without and with the tensor's own entries),
    ``index_reduce``, PyG's ``scatter`` (max) and a GCN normalisation from ``degree``, in
    a model's own forward."""

    REDUCES = ("sum", "mean", "amax", "amin", "prod")

    def __init__(self, f_in: int = 6, hidden: int = 4, f_out: int = 3):
        super().__init__()
        self.lin, self.out = nn.Linear(f_in, hidden), nn.Linear((len(self.REDUCES) + 4) * hidden, f_out)

    def forward(self, x, edge_index):
        src, dst = edge_index
        h = torch.tanh(self.lin(x))
        msg = h[src] * h[dst] + h[src]
        index = dst.view(-1, 1).expand(-1, h.size(1))
        parts = [h.scatter_reduce(0, index, msg, r, include_self=False) for r in self.REDUCES]
        parts += [h.scatter_reduce(0, index, msg, "mean"), h.scatter_reduce(0, index, msg, "sum"),
                  h.index_reduce(0, dst, msg, "amin", include_self=False)]
        deg = degree(dst, x.size(0), dtype=x.dtype)
        inv = deg.pow(-0.5).masked_fill(deg == 0, 0.0)
        parts.append(scatter(msg * (inv[src] * inv[dst]).unsqueeze(-1), dst, dim=0, dim_size=x.size(0), reduce="max"))
        return self.out(torch.cat(parts, dim=-1))


MODELS = {"sage_bn_gcn": sage_bn_gcn, "attention_mix": AttentionMix, "drop_attention": DropAttention,
          "drop_everywhere": DropEverywhere,
          "weighted": Weighted, "edge_features": EdgeFeatures, "edge_attention": EdgeAttention,
          "masked_assignments": MaskedAssignments, "plain_mean": PlainMean, "plain_scatter": PlainScatter,
          "plain_reductions": PlainReductions}
PLAIN = ("plain_mean", "plain_scatter", "plain_reductions")  # message passing in plain torch
WEIGHTED = {"weighted", "edge_features", "edge_attention"}  # models that take a per-edge tensor
EDGE_DIMS = {"edge_features": 3, "edge_attention": 3}  # its width, for those that take features rather than weights
EVAL = {"edge_attention"}  # compared in eval mode (attention dropout is then off, in PyG too)


def make_model(name: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[name]().double().train(name not in EVAL)


def run_worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """Build the model, load the parent's weights, run the compiled model on this shard:
    output rows, input-gradient rows, all-reduced parameter gradients, buffers."""
    part: PartData = payload["part"]
    shard = ShardGraph.from_part(part, rank, world_size, payload["num_nodes"], payload["num_edges"])
    model = make_model(payload["model"], payload["seed"])
    model.load_state_dict(payload["state"])
    torch.manual_seed(payload["seed"])  # attention dropout streams are seeded at compile time
    dm = sc.distribute(model, mode=payload["mode"])
    x = part.node_data["x"].clone().requires_grad_(True)
    args = [x, shard]
    edge_weight = None
    if payload["model"] in WEIGHTED:  # the original edges' weights, in shard order
        edge_weight = payload["edge_weight"][shard.edge_ids].clone().requires_grad_(True)
        args.append(edge_weight)
    out = dm(*args)
    (out * part.node_data["w"]).sum().backward()
    sc.sync_gradients(model)
    return {
        "out": out.detach(),
        "x_grad": x.grad,
        "edge_ids": shard.edge_ids,
        "edge_weight_grad": None if edge_weight is None else edge_weight.grad,
        "grads": {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None},
        "buffers": {k: b.clone() for k, b in model.named_buffers()},
    }


# --- the parent's side ------------------------------------------------------------------------
def assert_close(got, want, what):
    scale = max(1.0, float(want.detach().abs().max())) if want.numel() else 1.0
    torch.testing.assert_close(got, want, atol=TOL * scale, rtol=0, equal_nan=True, msg=lambda m: f"{what}: {m}")


@st.composite
def dist_cases(draw, models):
    """(world size, model name, mode, src, dst, n, seed, assignment): a random graph split
    at random or in ranges (some workers may get no node) over 1-3 workers."""
    world_size = draw(st.sampled_from([1, 2, 3]))
    src, dst, n, seed = draw(graphs(max_nodes=20, max_edges=60))
    assume(n > 1)  # batch norm in training needs two rows
    if draw(st.booleans()):
        assignment = torch.tensor(draw(st.lists(st.integers(0, world_size - 1), min_size=n, max_size=n)))
    else:
        assignment = torch.arange(n) * world_size // n
    mode = draw(st.sampled_from(["sar", "stash", "oneshot"]))
    return world_size, draw(st.sampled_from(models)), mode, src, dst, n, seed % 2**16, assignment


def check_distributed(pool, case, oracle: str = "eager"):
    """The model ``case`` names on its graph split over its workers (see :func:`dist_cases`):
    outputs, input, edge-weight and parameter gradients and buffers against eager PyG on the
    whole graph (``oracle="eager"``) or the compiled model on one machine."""
    world_size, name, mode, src, dst, n, seed, assignment = case
    g = sc.Graph.from_edges(src, dst, n)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=gen, dtype=DT)
    w = torch.randn(n, 1, generator=gen, dtype=DT)
    model = make_model(name, seed)
    state = copy.deepcopy(model.state_dict())
    xr = x.clone().requires_grad_(True)
    extra, edge_weight = [], None
    if name in EDGE_DIMS:  # edge features
        edge_weight = torch.randn(g.num_edges, EDGE_DIMS[name], generator=gen, dtype=DT)
    elif name in WEIGHTED:  # positive, some zero
        edge_weight = torch.rand(g.num_edges, generator=gen, dtype=DT) * torch.randint(0, 3, (g.num_edges,), generator=gen)
    if edge_weight is not None:
        extra = [edge_weight.clone().requires_grad_(True)]
    if oracle == "eager":  # plain PyG on edge_index
        out = model(xr, torch.stack([src, dst]), *extra)
    else:  # the compiled model on one machine (attention dropout: sarcompile's masks)
        torch.manual_seed(seed)
        out = sc.distribute(model)(xr, g, *extra)
    (out * w).sum().backward()
    parts = split_graph(g, assignment, world_size, {"x": x, "w": w})
    payloads = [{"part": p, "model": name, "seed": seed, "state": state, "mode": mode, "num_nodes": n,
                 "num_edges": g.num_edges, "edge_weight": edge_weight} for p in parts]
    results = pool(world_size).run(run_worker, payloads)
    got_out = torch.zeros_like(out)
    got_grad = torch.zeros_like(x)
    for p, r in zip(parts, results):
        got_out[p.global_ids] = r["out"]
        got_grad[p.global_ids] = r["x_grad"]
    assert_close(got_out, out.detach(), "output")
    assert_close(got_grad, xr.grad, "x grad")
    if extra:  # every edge lives on exactly one worker: its weight's gradient too
        got_ew_grad = torch.full_like(edge_weight, float("nan"))
        for r in results:
            got_ew_grad[r["edge_ids"]] = r["edge_weight_grad"]
        assert_close(got_ew_grad, extra[0].grad, "edge weight grad")
    for r in results:
        # (a parameter that met no edge -- a graph without any -- has no gradient in eager PyG
        # and an all-zero one here)
        for k, p in model.named_parameters():
            got = r["grads"].get(k)
            want = torch.zeros_like(p) if p.grad is None else p.grad
            assert_close(torch.zeros_like(p) if got is None else got, want, f"grad of {k}")
        for k, b in model.named_buffers():
            assert_close(r["buffers"][k], b, f"buffer {k}")
