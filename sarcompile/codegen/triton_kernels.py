"""Per-block kernels through generated Triton code, with the API of
:mod:`~sarcompile.codegen.torch_kernels` so the runtime can use either module.

Each function derives its kernel's spec from its inputs, loads the generated module
(:func:`~sarcompile.codegen.kernel_cache.load`) and launches it. Inputs the kernels are not
specialised for (an edge weight that broadcasts in another way than one value per edge or
per head) go to the torch kernel; :func:`sarcompile.codegen.kernel_specs` says which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..graph import Block
from . import torch_kernels as T
from .kernel_cache import current_target, load
from .spmm_gen import EdgeDotSpec, MaxGradSpec, MaxSpec, SpmmSpec

__all__ = ["MaxState", "dtype_name", "edge_dot", "max_grad", "spmm", "spmm_t", "weight_cols"]

# Everything that is not a graph kernel is shared with the torch module.
sddmm, sddmm_grads = T.sddmm, T.sddmm_grads


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def weight_cols(x_shape: tuple[int, ...], weight_shape: tuple[int, ...] | None) -> int | None:
    """Columns ``W`` of an edge weight the kernels take (0: no weight), or None when the
    weight broadcasts in a way they are not specialised for: it must be ``[E]`` or
    ``[E, *lead]`` with ``lead`` the leading feature dims (``[E, H]`` against ``[n, H, C]``)."""
    if weight_shape is None:
        return 0
    lead = tuple(weight_shape[1:])
    if tuple(x_shape[1 : 1 + len(lead)]) != lead:
        return None
    return math.prod(lead)


@dataclass
class _Indices:
    """A block's index arrays on the device the features are on (moved once, then cached)."""

    indptr: torch.Tensor
    col: torch.Tensor
    row: torch.Tensor
    t_indptr: torch.Tensor  # CSC view
    t_row: torch.Tensor  # destination of each edge in CSC order
    t_perm: torch.Tensor  # CSR position of each edge in CSC order


def indices(block: Block, device: torch.device) -> _Indices:
    key = ("indices", str(device))
    cached = block._cache.get(key)
    if cached is None:
        perm = block.transpose_perm
        cached = _Indices(
            *(t.to(device) for t in (block.indptr, block.col, block.row, block.transpose_indptr, block.row[perm], perm))
        )
        block._cache[key] = cached
    return cached


def launch(module, grid, *args) -> None:
    """Run ``module.kernel``; the interpreter gets the module's fixed configuration, CUDA
    its autotuner's choice."""
    if current_target() == "interpreter":
        meta = module.CONFIGS[0]
        module.kernel[grid(meta)](*args, **meta)
    else:
        module.kernel[grid](*args)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], math.prod(t.shape[1:])).contiguous()


def _aggregate(indptr, col, perm, weight, x: torch.Tensor, num_rows: int, permuted: bool) -> torch.Tensor:
    x2 = _flat(x)
    width = x2.shape[1]
    out = x2.new_empty((num_rows, width))
    cols = 0 if weight is None else weight_cols(x.shape, tuple(weight.shape))
    if num_rows and width:
        spec = SpmmSpec(width, cols, dtype_name(x2), permuted and cols > 0)
        w = x2 if weight is None else weight.contiguous()  # any pointer where there is no weight
        launch(load(spec), lambda m: (num_rows, _cdiv(width, m["BLOCK_F"])), indptr, col, perm, w, x2, out, num_rows)
    return out.reshape(num_rows, *x.shape[1:])


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def spmm(block: Block, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    if weight is not None and weight_cols(x.shape, tuple(weight.shape)) is None:
        return T.spmm(block, x, weight)
    ix = indices(block, x.device)
    return _aggregate(ix.indptr, ix.col, ix.col, weight, x, block.num_dst, permuted=False)


def spmm_t(block: Block, g: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """The transpose as the same kernel over the CSC view: race-free, no atomics."""
    if weight is not None and weight_cols(g.shape, tuple(weight.shape)) is None:
        return T.spmm_t(block, g, weight)
    ix = indices(block, g.device)
    return _aggregate(ix.t_indptr, ix.t_row, ix.t_perm, weight, g, block.num_src, permuted=True)


def edge_dot(block: Block, g: torch.Tensor, x: torch.Tensor, weight_shape: torch.Size) -> torch.Tensor:
    cols = weight_cols(g.shape, tuple(weight_shape))
    if cols is None:
        return T.edge_dot(block, g, x, weight_shape)
    g2, x2 = _flat(g), _flat(x)
    out = g2.new_empty((block.num_edges, cols))
    if block.num_edges:
        ix = indices(block, g.device)
        spec = EdgeDotSpec(g2.shape[1], cols, dtype_name(g2))
        grid = lambda m: (_cdiv(block.num_edges, m["BLOCK_E"]), cols)
        launch(load(spec), grid, ix.row, ix.col, g2, x2, out, block.num_edges)
    return out.reshape(block.num_edges, *weight_shape[1:])


class MaxState(T.MaxState):
    """:class:`torch_kernels.MaxState` whose per-block max and winner come from a kernel."""

    def block_max(self, block: Block, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x2 = _flat(x)
        width = x2.shape[1]
        best = x2.new_empty((block.num_dst, width))
        row = torch.empty((block.num_dst, width), dtype=torch.long, device=x.device)
        if block.num_dst and width:
            ix = indices(block, x.device)
            grid = lambda m: (block.num_dst, _cdiv(width, m["BLOCK_F"]))
            launch(load(MaxSpec(width, dtype_name(x2))), grid, ix.indptr, ix.col, x2, best, row, block.num_dst)
        return best, row


def max_grad(pos: torch.Tensor, g: torch.Tensor, offset: int, num_src: int) -> torch.Tensor:
    g2 = _flat(g)
    rows, width = g2.shape
    out = torch.zeros((num_src, width), dtype=torch.float64 if g.dtype == torch.float64 else torch.float32, device=g.device)
    if rows and width and num_src:
        grid = lambda m: (rows, _cdiv(width, m["BLOCK_F"]))
        launch(load(MaxGradSpec(width, dtype_name(g2))), grid, pos.contiguous(), g2, out, offset, num_src, rows)
    return out.to(g.dtype).reshape(num_src, *g.shape[1:])
