"""Where the generated-kernel tests put the Triton side's tensors.

Compiled kernels (target ``cuda``: a GPU and no ``TRITON_INTERPRET``) get CUDA tensors;
in Triton's interpreter they get CPU tensors. The torch kernels, the oracle, always run on
CPU tensors, and results are moved back to the CPU before they are compared.

Imported by this folder's conftest after it has set ``TRITON_INTERPRET``, so ``DEVICE``
sees the final target.
"""

from __future__ import annotations

import os

import torch

from sarcompile.codegen.kernel_cache import current_target

__all__ = ["DEVICE", "back", "to_dev"]

if not torch.cuda.is_available():  # as the conftest does (it imports this module after)
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = torch.device("cuda") if torch.cuda.is_available() and current_target() == "cuda" else torch.device("cpu")


def to_dev(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` on :data:`DEVICE` (None stays None)."""
    return None if t is None else t.to(DEVICE)


def back(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` on the CPU, to compare with the torch kernels' results (None stays None)."""
    return None if t is None else t.cpu()
