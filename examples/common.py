"""What the example trainers share: one full-batch training step, and the number of
classes from labels spread over the workers."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import sarcompile as sc


def train_step(model, opt, inputs: tuple, y, mask, total, sync: bool = True) -> torch.Tensor:
    """One full-batch step of ``model(*inputs)``; returns this worker's share of the global
    mean loss (``total`` is the number of training nodes on all workers)."""
    opt.zero_grad()
    out = model(*inputs)
    loss = F.cross_entropy(out[mask], y[mask], reduction="sum") / total
    loss.backward()
    if sync:  # sum the workers' gradients: each holds its nodes' share of the global loss
        sc.sync_gradients(model)
    opt.step()
    return loss.detach()


def num_classes(y: torch.Tensor) -> int:
    """The largest label on any worker, plus one."""
    local = y.max().reshape(1) if y.numel() else y.new_full((1,), -1)
    return int(sc.global_max(local)) + 1
