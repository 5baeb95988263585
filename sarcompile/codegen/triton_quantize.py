"""Compressed communication through generated Triton kernels: :func:`pack` and
:func:`unpack` with the contract (and the bit layout) of
:func:`sarcompile.codegen.torch_kernels.pack` / :func:`~sarcompile.codegen.torch_kernels.unpack`,
returning the same :class:`~sarcompile.codegen.torch_kernels.Packed`, so either side of a
transfer may use either module. Dtypes the kernels are not generated for go to torch.
"""

from __future__ import annotations

import torch

from sarcompile.codegen import torch_kernels as T
from sarcompile.codegen.kernel_cache import load
from sarcompile.codegen.quantize_gen import PACK_DTYPES, PackSpec, UnpackSpec
from sarcompile.codegen.triton_kernels import dtype_name, launch

__all__ = ["pack", "unpack"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pack(
    x: torch.Tensor, bits: int, noise: torch.Tensor | None = None, lo_scale: tuple[torch.Tensor, torch.Tensor] | None = None
) -> T.Packed:
    """Quantize and pack the rows of ``x`` (``[n, F]``, or ``[n, ...]`` flattened) to ``bits``
    per value; ``noise`` (uniforms in [0, 1) of ``x``'s size) rounds stochastically;
    ``lo_scale`` as for the torch pack."""
    # lo/scale come from torch.aminmax, a single bandwidth-bound pass: computing them in the
    # kernel would need a whole row per program before any byte is written (or a second
    # kernel), and sharing torch's code makes them bit-identical to the torch pack.
    x2, noise, lo, scale = T.pack_prepare(x, bits, noise, lo_scale)
    if dtype_name(x2) not in PACK_DTYPES:
        return T.pack(x, bits, noise, lo_scale)
    n, width = x2.shape
    nb = T.packed_row_bytes(width, bits)
    out = torch.empty((n, nb), dtype=torch.uint8, device=x.device)
    if n and width:
        x2 = x2.contiguous()
        spec = PackSpec(bits, width, dtype_name(x2), stochastic=noise is not None)
        noise_arg = x2 if noise is None else noise.to(x2.device).contiguous()  # any pointer when unused
        launch(load(spec), lambda m: (n, _cdiv(nb, m["BLOCK_B"])), x2, noise_arg, lo, scale, out, n)
    return T.Packed(out, lo, scale, bits, width)


def unpack(p: T.Packed, dtype: torch.dtype) -> torch.Tensor:
    """The rows of ``p`` as ``[n, width]`` of ``dtype``, bit-identical to the torch unpack."""
    name = str(dtype).removeprefix("torch.")
    if name not in PACK_DTYPES:
        return T.unpack(p, dtype)
    n, nb = p.data.shape
    out = torch.empty((n, p.width), dtype=dtype, device=p.data.device)
    if n and p.width:
        spec = UnpackSpec(p.bits, p.width, name)
        data = p.data.contiguous()
        lo, scale = (t.to(data.device).contiguous() for t in (p.lo, p.scale))
        launch(load(spec), lambda m: (n, _cdiv(nb, m["BLOCK_B"])), data, lo, scale, out, n)
    return out
