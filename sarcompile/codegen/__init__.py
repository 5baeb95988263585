"""Kernels: generated Triton code (CUDA, or CPU under ``TRITON_INTERPRET=1``) and torch
code (CPU), behind one API (:mod:`.torch_kernels` documents it).

:func:`kernels_for` picks the module an op runs with. The generated kernels an op needs
for given inputs -- what ``plan.kernels`` shows -- are registered here onto the op's
definition (:meth:`sarcompile.ir.opdef.OpDef.register_kernels`); ops that run torch code
only (sddmm, edge_softmax, message_passing, batch_norm) register none.
"""

from __future__ import annotations

import importlib.util
import warnings
from types import ModuleType
from typing import Any

import torch

from sarcompile import logs
from sarcompile.graph import graph
from sarcompile.ir import ops
from sarcompile.errors import KernelError
from sarcompile.ir.vocab import Executor
from sarcompile.codegen import cpu_spmm, torch_kernels
from sarcompile.codegen.kernel_cache import KernelSpec, current_target

__all__ = ["kernels_for", "triton_available"]

graph.whole_product_kernel = cpu_spmm.enabled  # what tile_count asks (see there)


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


_warned_no_triton = False


def kernels_for(executor: str, device: torch.device, op: str = "") -> ModuleType:
    """The kernel module for ``executor`` on tensors on ``device``; ``op`` names the op
    asking, for ``SARCOMPILE_LOGS=kernels``.

    ``auto``: Triton on CUDA tensors (torch if triton is not installed, with one warning),
    torch on CPU tensors. ``triton``: generated kernels always -- on CPU tensors only under
    ``TRITON_INTERPRET=1`` (to check them without a GPU). ``torch``: torch kernels.
    """
    module, why = _choose(executor, device)
    if "kernels" in logs.ON and (op, executor, device.type) not in _logged:
        _logged.add((op, executor, device.type))  # once per op, executor and device, not every call
        logs.log("kernels", f"{op or 'an op'} on {device.type}: {module.__name__.rsplit('.', 1)[-1]} ({why})")
    return module


_logged: set[tuple[str, str, str]] = set()


def _choose(executor: str, device: torch.device) -> tuple[ModuleType, str]:
    """The kernel module and why it was chosen."""
    global _warned_no_triton
    if executor not in Executor.values():
        raise KernelError(f"executor must be one of {Executor.values()}, got {executor!r}")
    if executor == Executor.TORCH:
        return torch_kernels, "executor='torch'"
    if executor == Executor.AUTO and device.type != "cuda":
        return torch_kernels, f"executor='auto' on {device.type} tensors: generated Triton kernels run on CUDA"
    if not triton_available():
        if executor == Executor.TRITON:
            raise KernelError("executor='triton' needs the triton package: pip install 'sarcompile[triton]'")
        if not _warned_no_triton:
            warnings.warn("triton is not installed: CUDA tensors use the torch kernels", stacklevel=3)
            _warned_no_triton = True
        return torch_kernels, "triton is not installed"
    if device.type != "cuda" and current_target() != "interpreter":
        raise KernelError(
            f"executor='triton' got tensors on {device.type}; Triton kernels run on CUDA tensors, or on "
            "CPU tensors when TRITON_INTERPRET=1 is set before triton is imported (slow; for checking). "
            "Use executor='auto' to run torch kernels on the CPU"
        )
    from sarcompile.codegen import triton_kernels

    where = "CUDA" if device.type == "cuda" else "the Triton interpreter (TRITON_INTERPRET=1)"
    return triton_kernels, f"executor={str(executor)!r}: generated Triton kernels on {where}"


@ops.spmm.definition.register_kernels
def _spmm_kernels(args: dict[str, Any]) -> list[tuple[str, KernelSpec]]:
    """The generated kernels spmm runs for its bound arguments (as recorded by the plan's
    probe), as (role, spec) pairs; none for inputs no kernel is specialised for (those
    run the torch kernel)."""
    from sarcompile.codegen.spmm_gen import EdgeDotSpec, MaxGradSpec, MaxSpec, SpmmSpec
    from sarcompile.codegen.triton_kernels import dtype_name, weight_cols

    x, w = args["x"], args["edge_weight"]
    width, dtype = x[0].numel() if x.dim() > 1 else 1, dtype_name(x)
    if args["reduce"] in ("max", "min"):  # min runs the max kernels on -x
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


@ops.attention.definition.register_kernels
def _attention_kernels(args: dict[str, Any]) -> list[tuple[str, KernelSpec]]:
    """The fused attention's forward and backward kernels (none where it is not fused:
    it then runs as spmm with weights)."""
    from sarcompile.codegen.attention_gen import AttentionBackwardSpec, AttentionForwardSpec
    from sarcompile.codegen.triton_kernels import dtype_name

    h, a_edge = args["h"], args["a_edge"]
    if h.dim() != args["a_src"].dim() + 1 or (a_edge is not None and a_edge.shape[1:] != args["a_src"].shape[1:]):
        return []
    heads, channels = (h.shape[1], h.shape[2]) if h.dim() == 3 else (1, h.shape[1])
    dropout, edge_score = bool(args["dropout"]), a_edge is not None
    return [
        ("forward", AttentionForwardSpec(heads, channels, dropout, dtype_name(h), edge_score)),
        ("backward", AttentionBackwardSpec(heads, channels, dropout, dtype_name(h), edge_score)),
    ]
