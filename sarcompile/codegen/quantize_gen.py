"""Triton source for compressed communication: quantize and pack rows, unpack and
dequantize them (Sylvie-style low-bit node features).

The layout is a contract shared bit for bit with :func:`sarcompile.codegen.torch_kernels.pack`
and :func:`~sarcompile.codegen.torch_kernels.unpack`, so a worker packing with one can be
read by a worker unpacking with the other:

* per row ``r`` of ``x`` (``[n, F]``): ``lo[r] = min``, ``scale[r] = (max - min) / (2**bits - 1)``,
  both float32; a constant row has ``scale 0`` and every ``q = 0``;
* ``q = clamp(floor((x - lo) / scale + 0.5), 0, 2**bits - 1)`` computed in float32 (``x`` cast
  to float32; round half up), or ``+ noise`` instead of ``+ 0.5`` for stochastic rounding;
* value ``j`` of a row goes to byte ``j // (8 // bits)`` of the row's
  ``ceil(F * bits / 8)`` bytes, at bit ``(j % (8 // bits)) * bits``, lowest bits first;
  padding bits are 0;
* ``x_hat = lo + q * scale`` evaluated in float64 (an 8-bit ``q`` times a float32 ``scale``
  is exact there, so the value does not depend on whether the compiler fuses the
  multiply-add), rounded to float32, then to the output dtype (float64 keeps it).

How the kernels stay bit-identical to torch: the division is ``tl.math.div_rn`` (IEEE
round-to-nearest, like torch; a plain ``/`` is approximate on CUDA), and the bfloat16
store rounds to nearest even by hand (the interpreter truncates on ``.to(tl.bfloat16)``).

``lo`` and ``scale`` are computed by the caller with ``torch.aminmax`` (see
:mod:`~sarcompile.codegen.triton_quantize`), not here.
"""

from __future__ import annotations

from dataclasses import dataclass

from sarcompile.codegen.kernel_cache import KernelSpec, autotune, configs_line, header
from sarcompile.codegen.spmm_gen import pow2

__all__ = ["PACK_DTYPES", "PackSpec", "UnpackSpec"]

# Float dtypes the kernels read (pack) and write (unpack); others go to the torch kernels.
PACK_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _row_bytes(width: int, bits: int) -> int:
    return -(-width * bits // 8)


def _byte_configs(row_bytes: int) -> list[tuple[dict[str, int], int]]:
    """Bytes per program x two warp counts; the first entry is the interpreter's fixed
    choice (a large block: the interpreter's cost is per program)."""
    blocks = list(dict.fromkeys(min(b, pow2(row_bytes)) for b in (256, 64, 1024)))
    return [({"BLOCK_B": b}, w) for b in blocks for w in (4, 2)]


def _check(bits: int, dtype: str) -> None:
    if bits not in (1, 2, 4, 8):
        raise ValueError(f"bits must be one of (1, 2, 4, 8), got {bits!r}")
    if dtype not in PACK_DTYPES:
        raise ValueError(f"quantize kernels take {PACK_DTYPES}, got {dtype!r}")


# The first lines of both kernels: this program's bytes b of row r and the values j they hold.
_TILE = """\
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)  # bytes of row r
    k = tl.arange(0, {per})  # slot within a byte
    j = b[:, None] * {per} + k[None, :]  # value index, [BLOCK_B, {per}]
    ok = j < {width}
"""


@dataclass(frozen=True)
class PackSpec(KernelSpec):
    """Quantize rows of ``width`` values of ``dtype`` to ``bits`` each and pack them into
    bytes, given each row's ``lo`` and ``scale``; ``stochastic`` adds the ``noise`` tensor
    instead of 0.5 before the floor."""

    family = "pack"
    bits: int
    width: int
    dtype: str
    stochastic: bool = False

    def render(self, target: str) -> str:
        _check(self.bits, self.dtype)
        bits, width, per = self.bits, self.width, 8 // self.bits
        nb = _row_bytes(width, bits)
        configs = _byte_configs(nb)
        if self.stochastic:
            rounding = f"tl.load(noise + r * {width} + j, mask=ok, other=0.0)  # stochastic rounding"
        else:
            rounding = "0.5  # round half up"
        return (
            header(
                self,
                target,
                f"Quantize to {bits} bits and pack {per} value(s) per byte, F={width} -> {nb} bytes per row, "
                f"{self.dtype}, {'stochastic rounding' if self.stochastic else 'round half up'}.",
            )
            + configs_line(configs)
            + "\n\n"
            + autotune(target, configs, ["num_rows"])
            + f'''@triton.jit
def kernel(x, noise, lo, scale, out, num_rows, BLOCK_B: tl.constexpr):
    # `noise` is only read with stochastic rounding (any pointer otherwise).
{_TILE.format(per=per, width=width)}    lo_r = tl.load(lo + r)
    scale_r = tl.load(scale + r)
    v = tl.load(x + r * {width} + j, mask=ok, other=0.0).to(tl.float32)
    # Divide by 1 in a constant row (its q is 0 anyway) to keep inf/nan out; div_rn is
    # IEEE division, as in torch.
    t = tl.math.div_rn(v - lo_r, tl.where(scale_r > 0, scale_r, 1.0))
    t = t + {rounding}
    q = tl.minimum(tl.maximum(tl.floor(t), 0.0), {2**bits - 1}.0)
    q = tl.where(scale_r > 0, q, 0.0)  # a constant row
    q = tl.where(ok, q, 0.0).to(tl.int32)  # padding values are 0
    # The shifted values occupy disjoint bits, so their sum is the byte.
    byte = tl.sum(q << (k * {bits})[None, :], axis=1)
    tl.store(out + r * {nb} + b, byte.to(tl.uint8), mask=b < {nb})
'''
        )


def _store(dtype: str) -> str:
    """The line storing float64 ``y`` as ``dtype``, rounding through float32."""
    if dtype == "float64":
        return "    tl.store(out + r * {width} + j, y, mask=ok)\n"
    if dtype == "bfloat16":
        # Round to nearest even by hand: the interpreter truncates in .to(tl.bfloat16), and
        # this matches torch (and CUDA's cvt.rn) for the finite values produced here.
        return (
            "    y32 = y.to(tl.float32).to(tl.uint32, bitcast=True)\n"
            "    y32 = y32 + 0x7FFF + ((y32 >> 16) & 1)  # round to nearest, ties to even\n"
            "    y16 = (y32 >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)\n"
            "    tl.store(out + r * {width} + j, y16, mask=ok)\n"
        )
    cast = ".to(tl.float32)" + ("" if dtype == "float32" else f".to(tl.{dtype})")
    return f"    tl.store(out + r * {{width}} + j, y{cast}, mask=ok)\n"


@dataclass(frozen=True)
class UnpackSpec(KernelSpec):
    """Unpack rows of ``width`` ``bits``-bit values and dequantize them to ``dtype``."""

    family = "unpack"
    bits: int
    width: int
    dtype: str

    def render(self, target: str) -> str:
        _check(self.bits, self.dtype)
        bits, width, per = self.bits, self.width, 8 // self.bits
        nb = _row_bytes(width, bits)
        configs = _byte_configs(nb)
        return (
            header(
                self,
                target,
                f"Unpack {per} {bits}-bit value(s) per byte and dequantize, {nb} bytes -> F={width} per row, {self.dtype}.",
            )
            + configs_line(configs)
            + "\n\n"
            + autotune(target, configs, ["num_rows"])
            + f'''@triton.jit
def kernel(data, lo, scale, out, num_rows, BLOCK_B: tl.constexpr):
{_TILE.format(per=per, width=width)}    byte = tl.load(data + r * {nb} + b, mask=b < {nb}, other=0).to(tl.int32)
    q = (byte[:, None] >> (k * {bits})[None, :]) & {2**bits - 1}
    # float64: q * scale is exact, so fusing the multiply-add cannot change y.
    lo_r = tl.load(lo + r).to(tl.float64)
    scale_r = tl.load(scale + r).to(tl.float64)
    y = lo_r + q.to(tl.float64) * scale_r
{_store(self.dtype).format(width=width)}'''
        )
