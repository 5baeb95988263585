"""Models that pass messages in plain torch over ``edge_index`` (no GNN library), and the
check that compiles them in a program that never imports one: :func:`check_without_gnn_library`
(run by test_plain.py in a fresh interpreter; :func:`run_worker` is imported by its workers).
PyG's tests use the models too (pyg_models.py)."""

from __future__ import annotations

import copy
import sys
from typing import Any

import torch
from torch import nn

import sarcompile as sc
from sarcompile.graph.shard import PartData, ShardGraph, split_graph

DT = torch.float64


class PlainMean(nn.Module):
    """Message passing in plain torch, in a helper method: the neighbours' mean by an
    out-of-place ``index_add`` (``alpha``) into ``new_zeros``, counted in place into
    ``torch.zeros(n)`` with ``torch.full_like(dst, ...)``; the ends as ``.long()`` / ``.to``."""

    def __init__(self, f_in: int = 6, f_out: int = 3):
        super().__init__()
        self.lin = nn.Linear(2 * f_in, f_out)

    def mean(self, x, edge_index):
        src, dst = edge_index[0].long(), edge_index[1].to(torch.long)
        total = x.new_zeros(x.shape).index_add(0, dst, x.index_select(0, src) * 2.0, alpha=0.5)
        count = torch.zeros(x.size(0), dtype=x.dtype)
        count.index_add_(0, dst, torch.full_like(dst, 3.0, dtype=x.dtype))
        return total / (count / 3).clamp(min=1).unsqueeze(-1)

    def forward(self, x, edge_index):
        return self.lin(torch.cat([x, self.mean(x, edge_index)], dim=-1))


class PlainScatter(nn.Module):
    """Gated messages gathered with ``index_select`` / ``torch.index_select``, summed with
    ``scatter_add_`` (an expanded index) in place into ``new_zeros``, and a difference
    pushed onto the sources with ``torch.index_add``."""

    def __init__(self, f_in: int = 6, hidden: int = 5, f_out: int = 3):
        super().__init__()
        self.lin, self.gate, self.out = nn.Linear(f_in, hidden), nn.Linear(2 * hidden, 1), nn.Linear(3 * hidden, f_out)

    def forward(self, x, edge_index):
        row, col = edge_index[0], edge_index[1]
        h = self.lin(x)
        h_j, h_i = h.index_select(0, row), torch.index_select(h, 0, col)
        msg = h_j * torch.sigmoid(self.gate(torch.cat([h_i, h_j], dim=-1)))
        agg = h.new_zeros(h.size(0), h.size(1))
        agg.scatter_add_(0, col.unsqueeze(-1).expand_as(msg), msg)
        pushed = torch.index_add(torch.zeros_like(h), 0, row, h_i - h_j, alpha=0.5)
        return self.out(torch.cat([agg, pushed, h], dim=-1))


class PlainStack(nn.Module):
    """Two layers written inline in the model's forward: ``src, dst = edge_index``,
    ``x[src]``, the mean by ``index_add_`` over ``torch.ones_like(dst)``, then a sum by
    ``scatter_add_`` -- the way a user without a GNN library writes it."""

    def __init__(self, f_in: int = 6, hidden: int = 5, f_out: int = 3):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(2 * f_in, hidden), nn.Linear(2 * hidden, f_out)

    def forward(self, x, edge_index):
        src, dst = edge_index
        deg = torch.zeros(x.size(0), dtype=x.dtype).index_add_(0, dst, torch.ones_like(dst, dtype=x.dtype))
        mean = torch.zeros_like(x).index_add_(0, dst, x[src]) / deg.clamp(min=1).unsqueeze(-1)
        h = torch.relu(self.lin1(torch.cat([x, mean], dim=-1)))
        total = torch.zeros_like(h).scatter_add_(0, dst.unsqueeze(-1).expand_as(h[src]), h[src])
        return self.lin2(torch.cat([h, total], dim=-1))


MODELS = {"plain_mean": PlainMean, "plain_scatter": PlainScatter, "plain_stack": PlainStack}


def make_model(name: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[name]().double()


def run_worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """The compiled model on this worker's shard: output rows, input-gradient rows and the
    all-reduced parameter gradients of ``sum(out * w)``, and whether a GNN library was imported here."""
    part: PartData = payload["part"]
    shard = ShardGraph.from_part(part, rank, world_size, payload["num_nodes"], payload["num_edges"])
    model = make_model(payload["model"], 0)
    model.load_state_dict(payload["state"])
    x = part.node_data["x"].clone().requires_grad_(True)
    out = sc.distribute(model)(x, shard)
    (out * part.node_data["w"]).sum().backward()
    sc.sync_gradients(model)
    return {"out": out.detach(), "x_grad": x.grad, "grads": {k: p.grad.clone() for k, p in model.named_parameters()},
            "gnn": "torch_geometric" in sys.modules or "dgl" in sys.modules}


def _graph(seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A random graph of 13 nodes: a hub, self-loops, multi-edges, the last two isolated."""
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, 11, (40,), generator=gen), torch.randint(0, 11, (40,), generator=gen)
    src, dst = torch.cat([src, torch.arange(10), src[:3], torch.tensor([4, 7])]), \
        torch.cat([dst, torch.zeros(10, dtype=torch.long), dst[:3], torch.tensor([4, 7])])
    return src, dst, 13


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0, msg=lambda m: f"{what}: {m}")


def check_without_gnn_library(world_size: int = 3) -> None:
    """Each model compiled on one machine and on ``world_size`` gloo workers (a random
    split; every other model's leaves the last worker without nodes) against eager torch on
    the real ``edge_index``:
    outputs, input and parameter gradients. Fails if PyG or DGL got imported, here or in a worker."""
    from workers import WorkerPool  # (tests/: the gloo pool)

    pool = WorkerPool(world_size)  # (one pool: each worker process costs seconds to start)
    try:
        for seed, name in enumerate(MODELS):
            src, dst, n = _graph(seed)
            gen = torch.Generator().manual_seed(seed)
            x, w = torch.randn(n, 6, generator=gen, dtype=DT), torch.randn(n, 3, generator=gen, dtype=DT)
            model = make_model(name, 0)
            state = copy.deepcopy(model.state_dict())
            xr = x.clone().requires_grad_(True)
            want = model(xr, torch.stack([src, dst]))
            (want * w).sum().backward()
            g = sc.Graph.from_edges(src, dst, n)
            one = make_model(name, 0)
            xo = x.clone().requires_grad_(True)
            got = sc.distribute(one)(xo, g)
            (got * w).sum().backward()
            _close(got, want, f"{name} on one machine: output")
            _close(xo.grad, xr.grad, f"{name} on one machine: x grad")
            for (k, p), q in zip(model.named_parameters(), one.parameters()):
                _close(q.grad, p.grad, f"{name} on one machine: grad of {k}")
            assignment = torch.randint(0, world_size - seed % 2, (n,), generator=gen)
            parts = split_graph(g, assignment, world_size, {"x": x, "w": w})
            results = pool.run(run_worker, [{"part": p, "model": name, "state": state, "num_nodes": n,
                                             "num_edges": g.num_edges} for p in parts])
            out, x_grad = torch.zeros_like(want), torch.zeros_like(x)
            for p, r in zip(parts, results):
                out[p.global_ids], x_grad[p.global_ids] = r["out"], r["x_grad"]
                assert not r["gnn"], "a worker imported a GNN library"
                for k, q in model.named_parameters():
                    _close(r["grads"][k], q.grad, f"{name} on {world_size} workers: grad of {k}")
            _close(out, want.detach(), f"{name} on {world_size} workers: output")
            _close(x_grad, xr.grad, f"{name} on {world_size} workers: x grad")
    finally:
        pool.close()
    imported = [lib for lib in ("torch_geometric", "dgl") if lib in sys.modules]
    assert not imported, f"compiling plain torch imported {imported}"
