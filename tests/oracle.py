"""The eager model as the passes' oracle: a rewritten program must give its values and
every gradient (of the input and of each parameter) for a fixed, position-weighted loss.
And the SAGE stack the pass tests rewrite."""

from __future__ import annotations

import torch
from torch import nn

import sarcompile as sc


def check_same(model: torch.nn.Module, fn, g, x: torch.Tensor) -> None:
    """``fn(g, x)`` (a rewritten program of ``model``) against ``model(g, x)``."""

    def run(f):
        xg = x.clone().requires_grad_()
        out = f(g, xg)
        (out * torch.cos(torch.arange(out.numel(), dtype=out.dtype)).reshape(out.shape)).sum().backward()
        grads = [xg.grad] + [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        return out.detach(), grads

    (want, want_grads), (got, got_grads) = run(model), run(fn)
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b)


class Sage(nn.Module):
    """SAGE layers ``lin_l(agg(x)) + lin_r(x)`` with an activation between them."""

    def __init__(self, dims: list[int], reduce: str = "mean", bias: bool = True, act=torch.relu):
        super().__init__()
        self.reduce, self.act = reduce, act
        self.lin_l = nn.ModuleList(nn.Linear(a, b, bias=bias) for a, b in zip(dims, dims[1:]))
        self.lin_r = nn.ModuleList(nn.Linear(a, b, bias=False) for a, b in zip(dims, dims[1:]))

    def forward(self, g, x):
        for i, (l, r) in enumerate(zip(self.lin_l, self.lin_r)):
            x = l(sc.ops.spmm(g, x, self.reduce)) + r(x)
            x = self.act(x) if i < len(self.lin_l) - 1 else x
        return x
