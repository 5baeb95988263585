"""The eager model as the passes' oracle: a rewritten program must give its values and
every gradient (of the input and of each parameter) for a fixed, position-weighted loss."""

from __future__ import annotations

import torch


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
