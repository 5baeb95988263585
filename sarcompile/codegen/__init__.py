"""Kernels: generated Triton code (CUDA, or CPU under ``TRITON_INTERPRET=1``) and torch
code (CPU), behind one API (:mod:`.torch_kernels` documents it).

:func:`kernels_for` picks the module an op runs with; :func:`kernel_specs` says which
generated kernels an op needs for given inputs -- what ``plan.kernels`` shows.
"""

from __future__ import annotations

import importlib.util
import warnings
from types import ModuleType
from typing import Any

import torch

from ..errors import KernelError
from . import torch_kernels
from .kernel_cache import KernelSpec, current_target

__all__ = ["EXECUTORS", "kernel_specs", "kernels_for", "triton_available"]

EXECUTORS = ("auto", "torch", "triton")


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


_warned_no_triton = False


def kernels_for(executor: str, device: torch.device) -> ModuleType:
    """The kernel module for ``executor`` on tensors on ``device``.

    ``auto``: Triton on CUDA tensors (torch if triton is not installed, with one warning),
    torch on CPU tensors. ``triton``: generated kernels always -- on CPU tensors only under
    ``TRITON_INTERPRET=1`` (to check them without a GPU). ``torch``: torch kernels.
    """
    global _warned_no_triton
    if executor == "torch" or (executor == "auto" and device.type != "cuda"):
        return torch_kernels
    if executor not in EXECUTORS:
        raise KernelError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    if not triton_available():
        if executor == "triton":
            raise KernelError("executor='triton' needs the triton package: pip install 'sarcompile[triton]'")
        if not _warned_no_triton:
            warnings.warn("triton is not installed: CUDA tensors use the torch kernels", stacklevel=2)
            _warned_no_triton = True
        return torch_kernels
    if device.type != "cuda" and current_target() != "interpreter":
        raise KernelError(
            f"executor='triton' got tensors on {device.type}; Triton kernels run on CUDA tensors, or on "
            "CPU tensors when TRITON_INTERPRET=1 is set before triton is imported (slow; for checking). "
            "Use executor='auto' to run torch kernels on the CPU"
        )
    from . import triton_kernels

    return triton_kernels


def kernel_specs(op: str, args: dict[str, Any]) -> list[tuple[str, KernelSpec]]:
    """The generated kernels an IR op runs for the bound arguments ``args`` (as recorded
    by the plan's probe), as (role, spec) pairs; empty for ops that run torch code only
    (sddmm, edge_softmax, message_passing, batch_norm) or inputs no kernel is specialised
    for (those run the torch kernel)."""
    from .attention_gen import AttentionBackwardSpec, AttentionForwardSpec
    from .spmm_gen import EdgeDotSpec, MaxGradSpec, MaxSpec, SpmmSpec
    from .triton_kernels import dtype_name, weight_cols

    if op == "spmm":
        x, w = args["x"], args["edge_weight"]
        width, dtype = x[0].numel() if x.dim() > 1 else 1, dtype_name(x)
        if args["reduce"] == "max":
            grad = [("backward x", MaxGradSpec(width, dtype))] if x.requires_grad else []
            return [("forward", MaxSpec(width, dtype)), *grad]
        cols = weight_cols(tuple(x.shape), None if w is None else tuple(w.shape))
        if cols is None:
            return []
        specs: list[tuple[str, KernelSpec]] = [("forward", SpmmSpec(width, cols, dtype))]
        if x.requires_grad:
            specs.append(("backward x", SpmmSpec(width, cols, dtype, permuted=cols > 0)))
        if w is not None and w.requires_grad:
            specs.append(("backward edge_weight", EdgeDotSpec(width, cols, dtype)))
        return specs
    if op == "attention":
        h = args["h"]
        if h.dim() != args["a_src"].dim() + 1:  # not fused: runs as spmm with weights
            return []
        heads, channels = (h.shape[1], h.shape[2]) if h.dim() == 3 else (1, h.shape[1])
        dropout = bool(args["dropout"])
        return [
            ("forward", AttentionForwardSpec(heads, channels, dropout, dtype_name(h))),
            ("backward", AttentionBackwardSpec(heads, channels, dropout, dtype_name(h))),
        ]
    return []
