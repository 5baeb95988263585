"""Models and the worker side of distributed exactness cases (imported by the workers too).

A case: a graph cut into parts, a model given by factory name and state, inputs, and
per-node loss weights. The parent computes the single-machine answer; each worker runs
its shard and returns its output rows, its input-gradient rows and the all-reduced
parameter gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import sarcompile as sc
from sarcompile.dist import traffic
from sarcompile.graph.shard import PartData, ShardGraph, split_graph


class MixModel(nn.Module):
    """SAGE (mean, sum, max), GCN, GIN, a residual, a concatenation and a layer norm."""

    def __init__(self, f_in: int = 6, hidden: int = 8, f_out: int = 3):
        super().__init__()
        self.sage_mean = sc.nn.SAGEConv(f_in, hidden, "mean")
        self.sage_sum = sc.nn.SAGEConv(hidden, hidden, "sum")
        self.sage_max = sc.nn.SAGEConv(hidden, hidden, "max")
        self.gcn = sc.nn.GCNConv(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        mlp = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, f_out))
        self.gin = sc.nn.GINConv(mlp, eps=0.1, train_eps=True)

    def forward(self, g, x):
        h = torch.relu(self.sage_mean(g, x))
        h = h + torch.tanh(self.sage_sum(g, h))  # residual
        m = self.sage_max(g, torch.sin(h))  # sin keeps signs mixed, so max ties are rare but possible
        h2 = self.norm(self.gcn(g, m)) + h
        return self.gin(g, torch.cat([h, h2], dim=-1))


class EdgeModel(nn.Module):
    """Raw IR ops: learned edge scores (sddmm dot and add), edge softmax, weighted spmm."""

    def __init__(self, f_in: int = 6, hidden: int = 5):
        super().__init__()
        self.q = nn.Linear(f_in, hidden)
        self.k = nn.Linear(f_in, hidden)
        self.v = nn.Linear(f_in, hidden)
        self.a = nn.Linear(f_in, 1)

    def forward(self, g, x):
        score = sc.sddmm(g, self.k(x), self.q(x), "dot") + sc.sddmm(g, self.a(x), self.a(x), "add").squeeze(-1)
        att = sc.edge_softmax(g, score)
        out = sc.spmm(g, self.v(x), "sum", edge_weight=att)
        gate = torch.sigmoid(sc.sddmm(g, x, x, "mul").sum(-1))
        return out + sc.spmm(g, x, "mean", edge_weight=gate)[:, :5]


class DropModel(nn.Module):
    """Node-seeded dropout between two layers."""

    def __init__(self, f_in: int = 6, hidden: int = 8):
        super().__init__()
        self.c1 = sc.nn.SAGEConv(f_in, hidden, "mean")
        self.drop = sc.nn.NodeDropout(0.5, seed=1234)
        self.c2 = sc.nn.SAGEConv(hidden, 2, "sum")

    def forward(self, g, x):
        return self.c2(g, self.drop(g, torch.relu(self.c1(g, x))))


class TorchDropModel(nn.Module):
    """Dropout as models write it: ``F.dropout`` and ``nn.Dropout`` on node rows, ``F.dropout``
    on edge weights and on a parameter (the compiler gives the rows' masks keyed by id)."""

    def __init__(self, f_in: int = 6, hidden: int = 8):
        super().__init__()
        self.c1 = sc.nn.SAGEConv(f_in, hidden, "mean")
        self.drop = nn.Dropout(0.3)
        self.att = nn.Linear(f_in, 1)
        self.c2 = sc.nn.SAGEConv(hidden, 2, "sum")
        self.scale = nn.Parameter(torch.ones(2))

    def forward(self, g, x):
        h = F.dropout(x, p=0.4, training=self.training)
        h = self.drop(torch.relu(self.c1(g, h)))
        weight = F.dropout(torch.sigmoid(sc.sddmm(g, self.att(x), self.att(x), "add")), 0.5, self.training)
        h = sc.spmm(g, h, "mean", edge_weight=weight.squeeze(-1)) + h
        return self.c2(g, h) * F.dropout(self.scale, 0.2, self.training)


class MeanOverNodes(nn.Module):
    """HAN's semantic attention: per-node scores averaged over every node weigh the paths."""

    def __init__(self, f_in: int = 6, hidden: int = 4):
        super().__init__()
        self.c1, self.c2 = sc.nn.SAGEConv(f_in, hidden, "mean"), sc.nn.GCNConv(f_in, hidden)
        self.project = nn.Sequential(nn.Linear(hidden, 8), nn.Tanh(), nn.Linear(8, 1, bias=False))

    def forward(self, g, x):
        z = torch.stack([self.c1(g, x), self.c2(g, x)], dim=1)  # [n, paths, hidden]
        beta = torch.softmax(self.project(z).mean(0), dim=0)  # [paths, 1]: over every node
        return (beta * z).sum(1) + torch.mean(x, dim=0, keepdim=True)[:, :1]


class GAT2(nn.Module):
    """Two GAT layers with ELU: heads concatenated, then averaged."""

    def __init__(self, f_in: int = 6):
        super().__init__()
        self.g1 = sc.nn.GATConv(f_in, 4, heads=2)
        self.g2 = sc.nn.GATConv(8, 3, heads=2, concat=False)

    def forward(self, g, x):
        return self.g2(g, F.elu(self.g1(g, x)))


class GAT3(nn.Module):
    """Three GAT layers, attention dropout, a residual, a SAGE layer mixed in."""

    def __init__(self, f_in: int = 6):
        super().__init__()
        self.g1 = sc.nn.GATConv(f_in, 4, heads=3, residual=True)
        self.sage = sc.nn.SAGEConv(12, 12, "mean")
        self.g2 = sc.nn.GATConv(12, 4, heads=2, dropout=0.3, negative_slope=0.1, seed=99)
        self.g3 = sc.nn.GATConv(8, 2, heads=1)

    def forward(self, g, x):
        h = F.elu(self.g1(g, x))
        h = h + torch.relu(self.sage(g, h))
        return self.g3(g, F.elu(self.g2(g, h)))


class NormModel(nn.Module):
    """Batch norm over all workers' nodes: affine, then without affine and momentum=None."""

    def __init__(self, f_in: int = 6, hidden: int = 8):
        super().__init__()
        self.c1 = sc.nn.SAGEConv(f_in, hidden, "mean")
        self.bn1 = sc.nn.BatchNorm(hidden)
        self.drop = sc.nn.NodeDropout(0.3, seed=7)
        self.c2 = sc.nn.GCNConv(hidden, 3)
        self.bn2 = sc.nn.BatchNorm(3, affine=False, momentum=None)

    def forward(self, g, x):
        h = self.drop(g, torch.relu(self.bn1(self.c1(g, x))))
        return self.bn2(self.c2(g, h))


class EdgeConvMessage(nn.Module):
    """EdgeConv's message with edge features: an MLP on (x_i, x_j - x_i, e_ij)."""

    def __init__(self, f_in: int, f_edge: int, f_out: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(2 * f_in + f_edge, 8), nn.Tanh(), nn.Linear(8, f_out))

    def forward(self, x_j, x_i, e):
        return self.mlp(torch.cat([x_i, x_j - x_i, e], dim=-1))


class MessageModel(nn.Module):
    """General message passing: EdgeConv-style messages with learned edge features, reduced
    by max, then sum and mean."""

    def __init__(self, f_in: int = 6):
        super().__init__()
        self.edge_lin = nn.Linear(f_in, 2)
        self.m1 = EdgeConvMessage(f_in, 2, 5)
        self.m2 = EdgeConvMessage(5, 2, 3)

    def forward(self, g, x):
        e = sc.sddmm(g, self.edge_lin(x), self.edge_lin(x), "mul")  # per-edge features [E, 2]
        h = torch.sin(sc.ops.message_passing(g, self.m1, x, e, "max"))
        return sc.ops.message_passing(g, self.m2, h, e, "sum") + sc.ops.message_passing(g, self.m2, h, e, "mean")


class ScaleMessage(nn.Module):
    """An elementwise message, ``tanh(w * x_j + x_i)``: computed bit-for-bit the same in any
    batch (unlike a matmul, whose last bit can depend on the batch shape), so equal inputs
    give exactly tied messages on any partition."""

    def __init__(self, f: int):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, f))

    def forward(self, x_j, x_i, e):
        return torch.tanh(self.w * x_j + x_i)


class MaxMessageModel(nn.Module):
    def __init__(self, f_in: int = 6):
        super().__init__()
        self.msg = ScaleMessage(f_in)

    def forward(self, g, x):
        return sc.ops.message_passing(g, self.msg, x, None, "max")


class GatherModel(nn.Module):
    """Node rows onto edges and back: gather_src / gather_dst, a per-edge computation mixing
    both ends, edge softmax and every edge_reduce."""

    def __init__(self, f_in: int = 6, hidden: int = 4):
        super().__init__()
        self.q, self.k = nn.Linear(f_in, hidden), nn.Linear(f_in, hidden)

    def forward(self, g, x):
        k_j, q_i = sc.ops.gather_src(g, self.k(x)), sc.ops.gather_dst(g, self.q(x))
        score = sc.edge_softmax(g, (k_j * q_i).sum(-1, keepdim=True))
        e = torch.tanh(k_j + q_i) * score
        outs = [sc.ops.edge_reduce(g, e, r) for r in ("sum", "mean", "max", "min", "mul")]
        return torch.cat(outs + [sc.ops.edge_reduce(g, torch.sin(k_j), "mean", dim=-2)], dim=-1)


class RowlessModel(nn.Module):
    """Values without rows that every worker's rows reach and feed: the largest edge score
    (``edge_max``) and the mean of every node's row (``node_mean``), each in every node's
    output, so their gradients gather every worker's loss."""

    def __init__(self, f_in: int = 6, hidden: int = 3):
        super().__init__()
        self.lin = nn.Linear(f_in, hidden)

    def forward(self, g, x):
        h = self.lin(x)
        top = sc.ops.edge_max(g, sc.sddmm(g, h, h, "dot"))
        return torch.tanh(h * top) + sc.ops.node_mean(h)


MODELS = {
    "mix": MixModel,
    "rowless": RowlessModel,
    "gathers": GatherModel,
    "edge": EdgeModel,
    "drop": DropModel,
    "torchdrop": TorchDropModel,
    "nodemean": MeanOverNodes,
    "gat2": GAT2,
    "gat3": GAT3,
    "norm": NormModel,
    "msg": MessageModel,
    "msgmax": MaxMessageModel,
}


def case_on_edges(src, dst, n: int, model: str, seed: int, gen: torch.Generator, **fields: Any) -> Case:
    """A case on the graph ``src -> dst`` of ``n`` nodes, alternately on 2 workers unless
    ``fields`` give an ``assignment``, with float64 inputs (6 features) and per-node loss
    weights drawn from ``gen``."""
    fields.setdefault("assignment", torch.arange(n) % 2)
    return Case(
        graph=sc.Graph.from_edges(src, dst, n),
        model=model,
        seed=seed,
        x=torch.randn(n, 6, generator=gen, dtype=torch.float64),
        loss_weight=torch.randn(n, 1, generator=gen, dtype=torch.float64),
        **fields,
    )


def make_model(name: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[name]().double()


@dataclass
class Case:
    graph: sc.Graph
    assignment: torch.Tensor
    model: str
    seed: int
    x: torch.Tensor
    loss_weight: torch.Tensor
    mode: str = "sar"
    train: bool = True
    executor: str = "auto"
    blocks_in_flight: int = 1


@dataclass
class Result:
    out: torch.Tensor
    x_grad: torch.Tensor
    param_grads: dict[str, torch.Tensor]
    stats: dict = field(default_factory=dict)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)  # after the step (running statistics)


def single_machine(case: Case, device: str | torch.device = "cpu") -> Result:
    """The oracle: the compiled model on one machine, the whole graph. With ``device``,
    the model and features go there and the graph stays where users build it (the CPU);
    the results come back to the CPU."""
    model = make_model(case.model, case.seed).to(device)
    dm = sc.distribute(model, executor=case.executor)
    dm.train(case.train)
    x = case.x.to(device, copy=True).requires_grad_(True)  # a copy: the case's own x stays a plain input
    out = dm(case.graph, x)
    (out * case.loss_weight.to(device)).sum().backward()
    grads = {k: p.grad.cpu() for k, p in model.named_parameters() if p.grad is not None}
    return Result(out.detach().cpu(), x.grad.cpu(), grads, buffers={k: b.cpu() for k, b in model.named_buffers()})


def payloads(case: Case, world_size: int) -> list[dict[str, Any]]:
    parts = split_graph(case.graph, case.assignment, world_size, {"x": case.x, "w": case.loss_weight})
    return [
        {"part": p, "model": case.model, "seed": case.seed, "mode": case.mode, "train": case.train,
         "executor": case.executor, "blocks_in_flight": case.blocks_in_flight, "num_nodes": case.graph.num_nodes,
         "num_edges": case.graph.num_edges}
        for p in parts
    ]


def run_worker(rank: int, world_size: int, payload: dict[str, Any]) -> Result:
    part: PartData = payload["part"]
    shard = ShardGraph.from_part(part, rank, world_size, payload["num_nodes"], payload["num_edges"])
    model = make_model(payload["model"], payload["seed"])
    dm = sc.distribute(model, mode=payload["mode"], executor=payload.get("executor", "auto"),
                       blocks_in_flight=payload.get("blocks_in_flight", 1))
    dm.train(payload["train"])
    x = part.node_data["x"].clone().requires_grad_(True)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    out, stats = _step(dm, shard, x, part.node_data["w"], params)
    sc.sync_gradients(model)
    stats.update(edges_with_loops=shard.with_self_loops().num_edges, edges=shard.num_edges)
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return Result(out.detach(), x.grad, grads, stats, {k: b.clone() for k, b in model.named_buffers()})


def _step(dm, shard: ShardGraph, x: torch.Tensor, w: torch.Tensor, params: set[int]) -> tuple[torch.Tensor, dict]:
    """One forward and backward; the output and what the exchange did."""
    traffic.stats.reset()
    traffic.live.reset_peak()
    saved: list[tuple[int, ...]] = []  # shapes of everything autograd keeps for backward
    saved_storage: dict[int, int] = {}  # bytes kept for backward, per storage, parameters and x aside
    elsewhere = params | {x.untyped_storage().data_ptr()}  # (the plan counts them as such)

    def pack(t):
        saved.append(tuple(t.shape))
        if t.untyped_storage().data_ptr() not in elsewhere:
            saved_storage[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = dm(shard, x)
    forward_peak = traffic.live.peak
    (out * w).sum().backward()
    return out, {
        **traffic.stats.as_dict(),
        "forward_peak_blocks": forward_peak,
        "peak_blocks": traffic.live.peak,
        "saved_shapes": saved,
        "saved_bytes": sum(saved_storage.values()),
        "peak_block_bytes": traffic.live.peak_bytes,
    }


def assert_workers_match(case: Case, world_size: int, results: list[Result], want: Result, **tol: Any) -> None:
    """The workers' output and input-gradient rows, put back in place, and every rank's
    parameter gradients, against ``want`` (the one-machine result)."""
    torch.testing.assert_close(gather_rows(case, world_size, results, "out"), want.out, **tol)
    torch.testing.assert_close(gather_rows(case, world_size, results, "x_grad"), want.x_grad, **tol)
    for r in results:
        for k, g in want.param_grads.items():
            torch.testing.assert_close(r.param_grads[k], g, **tol, msg=k)


def gather_rows(case: Case, world_size: int, results: list[Result], attr: str) -> torch.Tensor:
    """Put each worker's local rows back at their global positions."""
    parts = split_graph(case.graph, case.assignment, world_size)
    first = getattr(results[0], attr)
    full = torch.zeros((case.graph.num_nodes, *first.shape[1:]), dtype=first.dtype)
    for p, r in zip(parts, results):
        full[p.global_ids] = getattr(r, attr)
    return full


class OneSage(nn.Module):
    """One SAGE (sum) layer on a linear input map: remote rows matter directly. It widens
    the rows, so the aggregation reads (and sends) x itself, not its projection
    (passes/linear_first)."""

    def __init__(self, f_in: int = 6):
        super().__init__()
        self.c = sc.nn.SAGEConv(f_in, 8, "sum")

    def forward(self, g, x):
        return self.c(g, x)


MODELS["one_sage"] = OneSage


class WidthBranch(nn.Module):
    """Python that branches on shapes known when compiling, as PyG's GatedGraphConv and
    DNAConv do (the number of dims, the feature width), pads the features with
    ``x.new_zeros(x.size(0), k)``, runs a ``GRUCell`` over the rows, and reshapes with the
    row count (``h.size(0)``, ``h.shape[0]``), which differs between workers."""

    def __init__(self, f_in: int = 6, width: int = 8):
        super().__init__()
        self.width = width
        self.conv = sc.nn.SAGEConv(width, width, "mean")
        self.cell = nn.GRUCell(width, width)

    def forward(self, g, x):
        if x.dim() != 2:
            raise ValueError("x must be [nodes, features]")
        if x.size(-1) > self.width:
            raise ValueError("more features than the layer's width")
        if x.shape[-1] < self.width:
            x = torch.cat([x, x.new_zeros(x.size(0), self.width - x.size(-1))], dim=1)
        h = self.cell(self.conv(g, x), x)
        h = h.reshape(h.size(0), 2, len(h.size()) * 2).transpose(1, 2)  # [rows, 4, 2]
        return h.reshape(h.shape[0], -1) if h.ndim == 3 else h


MODELS["width"] = WidthBranch


class ReusedInputs(nn.Module):
    """Every aggregation reads the input features as given (mean, sum and max, widened by
    the linear layers after them, so that ``linear_first`` leaves them): with ``x``
    needing no grad, the pass ``reuse`` keeps all three, and nothing else exchanges."""

    def __init__(self, f_in: int = 6, f_out: int = 8):
        super().__init__()
        self.mean, self.sum, self.max, self.root = (nn.Linear(f_in, f_out) for _ in range(4))

    def forward(self, g, x):
        return (self.mean(sc.ops.spmm(g, x, "mean")) + self.sum(sc.ops.spmm(g, x, "sum"))
                + torch.tanh(self.max(sc.ops.spmm(g, x, "max"))) + self.root(x))


MODELS["reused"] = ReusedInputs


class ParamLoop(nn.Module):
    """DGL's rgcn-hetero example's per-relation weights: Python loops over a parameter's rows
    (``enumerate(torch.split(weight, 1))`` of a weight computed from parameters, ``for w in
    param``, ``len(param)``) and over a per-node value's feature dim (``h.t()``, ``h.unbind(1)``)."""

    def __init__(self, f_in: int = 6, hidden: int = 4):
        super().__init__()
        self.basis = nn.Parameter(torch.randn(3, f_in, hidden))
        self.comp = nn.Parameter(torch.randn(2, 3))

    def forward(self, g, x):
        weight = torch.einsum("rb,bio->rio", self.comp, self.basis)
        outs = {i: sc.ops.spmm(g, x @ w.squeeze(0), "sum") for i, w in enumerate(torch.split(weight, 1, dim=0))}
        h = sum(outs.values()) + sum(x @ w for w in self.basis) / len(self.basis)
        cols = [c for c in h.t()]
        h = torch.stack(cols[::-1], dim=1) + torch.stack([c * (i + 1) for i, c in enumerate(h.unbind(1))], 1)
        return h * len(torch.chunk(self.comp, 2)) + len(weight)


MODELS["paramloop"] = ParamLoop


class MaskedAssignment(nn.Module):
    """Assignments into part of a per-node tensor, as models write them eagerly: by a mask of
    its rows or of its shape (a number, a parameter row, ``other[mask]``) and by position
    along the feature dim (``h[:, k]``, ``h[..., a:b]``), after a view of it that is not read
    again."""

    def __init__(self, f_in: int = 6, hidden: int = 4):
        super().__init__()
        self.lin = nn.Linear(f_in, hidden)
        self.fill = nn.Parameter(torch.randn(hidden))

    def forward(self, g, x):
        h = self.lin(x)
        h[h < 0] = 0
        mask = h[:, 0] > 0.1  # (a view of h, not read after the assignment)
        h[mask] = 0.5
        out = sc.ops.spmm(g, h, "sum")
        out[x[:, 1] > 0] = self.fill
        out[mask] = torch.tanh(h)[mask]
        out[:, 1] = x[:, 2]
        out[..., 2:4] = out[:, :2] * 2
        return out


MODELS["maskset"] = MaskedAssignment


def run_reused_steps(rank: int, world_size: int, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Training steps on one input tensor that needs no grad, changed between steps as
    ``payload["changes"]`` says: "same" (left alone), "double" (the rows of
    ``payload["changed"]``, global ids, doubled in place -- on the workers that own any),
    "new" (replaced by a copy); under ``payload["options"]`` for distribute(). Per step:
    the output rows, the parameter gradients (all-reduced) and the bytes exchanged by phase."""
    part: PartData = payload["part"]
    shard = ShardGraph.from_part(part, rank, world_size, payload["num_nodes"], payload["num_edges"])
    model = make_model(payload["model"], payload["seed"])
    dm = sc.distribute(model, **payload.get("options", {}))
    x = part.node_data["x"].clone()
    changed = torch.isin(part.global_ids, payload["changed"])
    steps = []
    for change in payload["changes"]:
        if change == "double" and bool(changed.any()):
            x[changed] *= 2
        elif change == "new":
            x = x.clone()
        traffic.stats.reset()
        model.zero_grad(set_to_none=True)
        out = dm(shard, x)
        (out * part.node_data["w"]).sum().backward()
        sc.sync_gradients(model)
        grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        steps.append({"out": out.detach().clone(), "grads": grads, "bytes": traffic.stats.as_dict()})
    return steps


def run_iterations(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """``payload["steps"]`` training forwards + backwards with fixed parameters and input
    ``x * (t + 1)`` at step t, under ``payload["options"]`` for distribute(); per step:
    outputs, input gradients and bytes by phase; and every site's link record."""
    part: PartData = payload["part"]
    shard = ShardGraph.from_part(part, rank, world_size, payload["num_nodes"], payload["num_edges"])
    model = make_model(payload["model"], payload["seed"])
    dm = sc.distribute(model, **payload["options"])
    steps = []
    for t in range(payload["steps"]):
        traffic.stats.reset()
        x = (part.node_data["x"] * (t + 1)).requires_grad_(True)
        out = dm(shard, x)
        (out * part.node_data["w"]).sum().backward()
        steps.append({"out": out.detach(), "x_grad": x.grad, "bytes": traffic.stats.as_dict()})
    links = {}
    for s in [shard, *shard._derived.values()]:
        for site, state in s.links.items():
            links[site] = {"ages": list(state.ages), "exchanges": list(state.exchanges), "name": state.policy.name}
    return {"steps": steps, "links": links}
