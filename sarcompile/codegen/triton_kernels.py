"""Per-block kernels through generated Triton code, with the API of
:mod:`~sarcompile.codegen.torch_kernels` so the runtime can use either module.

Each function derives its kernel's spec from its inputs, loads the generated module
(:func:`~sarcompile.codegen.kernel_cache.load`) and launches it. Inputs the kernels are not
specialised for (an edge weight that broadcasts in another way than one value per edge or
per head) go to the torch kernel; :func:`sarcompile.codegen.kernel_specs` says which.
"""

from __future__ import annotations

import functools
import math

import torch

from sarcompile.graph.graph import Block, Tiles
from sarcompile.codegen import torch_kernels as T
from sarcompile.codegen.attention_gen import AttentionBackwardSpec, AttentionForwardSpec
from sarcompile.codegen.kernel_cache import current_target, load
from sarcompile.codegen.spmm_gen import EdgeDotSpec, MaxGradSpec, MaxSpec, SpmmSpec

__all__ = [
    "AttentionState",
    "MaxState",
    "attention_grads",
    "dst_weights",
    "dtype_name",
    "edge_dot",
    "max_grad",
    "prepare_transpose",
    "spmm",
    "spmm_t",
    "weight_cols",
]

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


def launch(module, grid, *args, kernel: str = "kernel") -> None:
    """Run ``module.kernel`` (or another kernel of the module, e.g. ``kernel_dst``, whose
    configurations are then ``CONFIGS_DST``); the interpreter gets the module's fixed
    configuration, CUDA its autotuner's choice."""
    fn = getattr(module, kernel)
    if current_target() == "interpreter":
        meta = getattr(module, "CONFIGS" + kernel.removeprefix("kernel").upper())[0]
        fn[grid(meta)](*args, **meta)
    else:
        fn[grid](*args)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], math.prod(t.shape[1:])).contiguous()


def _aggregate(indptr, col, perm, weight, cols: int, x: torch.Tensor, num_rows: int, permuted: bool,
               out: torch.Tensor | None = None) -> torch.Tensor:
    x2 = _flat(x)
    width = x2.shape[1]
    out = x2.new_empty((num_rows, width)) if out is None else out.view(num_rows, width)
    if num_rows and width:
        spec = SpmmSpec(width, cols, dtype_name(x2), permuted and cols > 0)
        w = x2 if weight is None else weight.contiguous()  # any pointer where there is no weight
        launch(load(spec), lambda m: (num_rows, _cdiv(width, m["BLOCK_F"])), indptr, col, perm, w, x2, out, num_rows)
    return out.reshape(num_rows, *x.shape[1:])


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def spmm(block: Block, x: torch.Tensor, weight: torch.Tensor | None, into: torch.Tensor | None = None,
         ordered: bool = False) -> torch.Tensor:
    """As torch_kernels.spmm; ``into`` gets the block's sums added (from a buffer of
    their own: the kernel writes its rows, it does not read them). The kernel takes
    weights in CSR order: ``ordered`` ones (:func:`dst_weights`) are in it."""
    cols = weight_cols(x.shape, None if weight is None else tuple(weight.shape))
    if cols is None:  # (not one weight per edge, so not an ordered one)
        return T.spmm(block, x, weight, into)
    b = block.on(x.device)
    out = _aggregate(b.indptr, b.col, b.col, weight, cols, x, block.num_dst, permuted=False)
    return out if into is None else into.add_(out)


def spmm_t(block: Block, g: torch.Tensor, weight: torch.Tensor | None, out: torch.Tensor | None = None,
           ordered: bool = False) -> torch.Tensor:
    """The transpose as the same kernel over the CSC view: race-free, no atomics.
    ``out``: a contiguous ``[num_src, ...]`` buffer to write into. ``ordered``: a weight
    per edge in the block's CSC order already (:func:`dst_weights`)."""
    cols = weight_cols(g.shape, None if weight is None else tuple(weight.shape))
    if cols is None:  # (not one weight per edge, so not an ordered one)
        return T.spmm_t(block, g, weight, out)
    t = _csc(block.on(g.device))
    return _aggregate(t.indptr[0], t.col, t.order, weight, cols, g, block.num_src, permuted=not ordered, out=out)


def _csc(block: Block) -> Tiles:
    """The CSC view the kernels read: the transpose as one tile, with its order (the CSR
    position of each entry), made once per block and kept."""
    return block.tiles(transposed=True, split=False, with_order=True)


def prepare_transpose(block: Block, weighted: bool) -> None:
    """As torch_kernels.prepare_transpose, for the CSC view the kernels read (with its
    order whether weighted or not)."""
    _csc(block)


def dst_weights(block: Block, values: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """``values[v]`` for every edge u->v, in CSR order (``transposed``: CSC order), the
    orders :func:`spmm` and :func:`spmm_t` take with ``ordered``."""
    b = block.on(values.device)
    w = b.per_edge(values)
    return w.index_select(0, _csc(b).order) if transposed else w


def edge_dot(block: Block, g: torch.Tensor, x: torch.Tensor, weight_shape: torch.Size) -> torch.Tensor:
    cols = weight_cols(g.shape, tuple(weight_shape))
    if cols is None:
        return T.edge_dot(block, g, x, weight_shape)
    g2, x2 = _flat(g), _flat(x)
    out = g2.new_empty((block.num_edges, cols))
    if block.num_edges:
        b = block.on(g.device)
        spec = EdgeDotSpec(g2.shape[1], cols, dtype_name(g2))
        grid = lambda m: (_cdiv(block.num_edges, m["BLOCK_E"]), cols)
        launch(load(spec), grid, b.row, b.col, g2, x2, out, block.num_edges)
    return out.reshape(block.num_edges, *weight_shape[1:])


class MaxState(T.MaxState):
    """:class:`torch_kernels.MaxState` whose per-block max and winner come from a kernel."""

    def block_max(self, block: Block, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x2 = _flat(x)
        width = x2.shape[1]
        best = x2.new_empty((block.num_dst, width))
        row = torch.empty((block.num_dst, width), dtype=torch.long, device=x.device)
        if block.num_dst and width:
            b = block.on(x.device)
            grid = lambda m: (block.num_dst, _cdiv(width, m["BLOCK_F"]))
            launch(load(MaxSpec(width, dtype_name(x2))), grid, b.indptr, b.col, x2, best, row, block.num_dst)
        return best, row


def max_grad(pos: torch.Tensor, g: torch.Tensor, offset: int, num_src: int) -> torch.Tensor:
    g2 = _flat(g)
    rows, width = g2.shape
    out = torch.zeros((num_src, width), dtype=torch.float64 if g.dtype == torch.float64 else torch.float32, device=g.device)
    if rows and width and num_src:
        grid = lambda m: (rows, _cdiv(width, m["BLOCK_F"]))
        launch(load(MaxGradSpec(width, dtype_name(g2))), grid, pos.to(g.device).contiguous(), g2, out, offset, num_src, rows)
    return out.to(g.dtype).reshape(num_src, *g.shape[1:])


class AttentionState(T.AttentionState):
    """:class:`torch_kernels.AttentionState` whose blocks are folded in by a generated
    kernel updating the same state (``m``, ``l``, ``acc``) in place, one program per
    destination row; :meth:`result` is the torch one."""

    def update(
        self,
        block: Block,
        h: torch.Tensor,
        a_src: torch.Tensor,
        a_dst: torch.Tensor,
        negative_slope: float,
        keep: torch.Tensor | None,
        a_edge: torch.Tensor | None = None,
    ) -> None:
        if block.num_edges == 0 or block.num_dst == 0:
            return
        heads, channels = h.shape[1], h.shape[2]
        h, a_src, a_dst = h.contiguous(), a_src.contiguous(), a_dst.contiguous()
        b = block.on(h.device)
        spec = AttentionForwardSpec(heads, channels, keep is not None, dtype_name(h), a_edge is not None)
        args = (b.indptr, b.col, *_optional(h, keep, a_edge), h, a_src, a_dst, self.m, self.l, self.acc,
                float(negative_slope), block.num_dst)
        launch(load(spec), lambda meta: (block.num_dst,), *args)


def attention_grads(
    block: Block,
    h: torch.Tensor,
    a_src: torch.Tensor,
    a_dst: torch.Tensor,
    negative_slope: float,
    keep: torch.Tensor | None,
    lse: torch.Tensor,
    d_out: torch.Tensor,
    delta: torch.Tensor,
    a_edge: torch.Tensor | None = None,
    into: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`torch_kernels.attention_grads` by two generated passes: over the CSR for the
    destination scores (and the edge terms), over the CSC view for the source features
    and scores (each output row owned by one program: no atomics). ``into`` gets the
    source gradients copied in (the kernels write contiguous buffers), once the kernels
    are done: it may be the block's own payload."""
    d_h, d_src, d_dst, d_edge = _attention_grads(block, h, a_src, a_dst, negative_slope, keep, lse, d_out, delta, a_edge)
    if into is None:
        return d_h, d_src, d_dst, d_edge
    width = d_h.shape[1] * d_h.shape[2]
    into[:, :width].copy_(d_h.reshape(d_h.shape[0], width))
    into[:, width:].copy_(d_src)
    return into[:, :width].view(d_h.shape), into[:, width:], d_dst, d_edge


def _attention_grads(block, h, a_src, a_dst, negative_slope, keep, lse, d_out, delta, a_edge):
    heads, channels = h.shape[1], h.shape[2]
    parts = (a_src, a_dst) if a_edge is None else (a_src, a_dst, a_edge)
    score_dtype = functools.reduce(torch.promote_types, (t.dtype for t in parts))
    d_h = d_out.new_zeros((block.num_src, heads, channels))
    d_src = torch.zeros((block.num_src, heads), dtype=score_dtype, device=h.device)
    d_dst = torch.zeros((block.num_dst, heads), dtype=score_dtype, device=h.device)
    d_edge = None if a_edge is None else torch.zeros((block.num_edges, heads), dtype=score_dtype, device=h.device)
    if block.num_edges == 0:
        return d_h, d_src, d_dst, d_edge
    h, a_src, a_dst = h.contiguous(), a_src.contiguous(), a_dst.contiguous()
    lse, d_out, delta = lse.contiguous(), d_out.contiguous(), delta.contiguous()
    b = block.on(h.device)
    module = load(AttentionBackwardSpec(heads, channels, keep is not None, dtype_name(h), a_edge is not None))
    slope = float(negative_slope)
    data = (*_optional(h, keep, a_edge), h, a_src, a_dst, lse, d_out, delta)
    d_edge_arg = h if d_edge is None else d_edge
    launch(module, lambda meta: (block.num_dst,), b.indptr, b.col, *data, d_dst, d_edge_arg, slope, block.num_dst,
           kernel="kernel_dst")
    t = _csc(b)
    launch(module, lambda meta: (block.num_src,), t.indptr[0], t.col, t.order, *data, d_h, d_src, slope, block.num_src,
           kernel="kernel_src")
    return d_h, d_src, d_dst, d_edge


def _optional(placeholder: torch.Tensor, *tensors: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """The attention kernels' optional inputs (dropout multipliers, edge scores),
    contiguous; ``placeholder`` -- any pointer -- where one is absent (its kernel does not
    read it)."""
    return tuple(placeholder if t is None else t.contiguous() for t in tensors)
