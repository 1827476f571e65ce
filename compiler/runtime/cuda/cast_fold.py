"""The device's RoundTo (runtime/cast_fold.py folds Cast pairs through the low type into it): one
launch, fp32 in, fp32 out, every value rounded to the nearest low-type value with the GPU's own
conversions. Which steps become RoundTo, and which roundings are dropped as repeated, is decided
on the program by runtime/cast_fold.py for both backends.
"""

from __future__ import annotations

import functools

import numpy as np

from ..cast_fold import LOW_CODES, LOW_TYPES
from ..cast_fold import elide_repeated_rounding as program_elide
from ..cast_fold import fold_cast_pairs as program_fold
from ..kernels.common import np_dtype

ROUND_OP = ("infc.cuda", "RoundTo")

# bf16 round-to-nearest-even on the fp32 bits: add 0x7FFF plus the kept half's lowest bit, drop the
# low 16 bits. NaN is kept as is (the carry could turn a NaN with only low payload bits into inf).
_BF16_CUDA = ("unsigned int u = __float_as_uint(x);"
              "y = isnan(x) ? x : __uint_as_float((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u)")
# The GPU's own conversions, round to nearest even both ways (subnormals, inf and NaN as the hardware
# does). CuPy's `float16` type is not usable here: with CUDA 13 NVRTC rejected it as an incomplete type
# (H200, 2026-11-30), so the body names no CuPy type at all.
_F16_CUDA = ('unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));'
             'asm("cvt.f32.f16 %0, %1;" : "=f"(y) : "h"(h))')
BODIES = {"float16": _F16_CUDA, "bfloat16": _BF16_CUDA}


def fold_cast_pairs(placed: list[tuple[int, dict]], host_values: set[str], keep: set[str]) -> list[tuple[int, dict]]:
    """runtime/cast_fold.fold_cast_pairs into the device's RoundTo."""
    return program_fold(placed, host_values, keep, ROUND_OP)


def elide_repeated_rounding(placed: list[tuple[int, dict]], rounded: dict[str, int],
                            keep: set[str]) -> list[tuple[int, dict]]:
    """runtime/cast_fold.elide_repeated_rounding of the device's RoundTo."""
    return program_elide(placed, rounded, keep, ROUND_OP)


def round_to(inputs, attrs, ctx):
    """The device op: fp32 -> fp32 rounded to the low type."""
    x = inputs[0]
    to = int(attrs["to"])
    if ctx.xp is np or x.dtype != np.float32:  # the stand-in device, or a value that is not fp32 after all
        return [x.astype(np_dtype(to)).astype(np.float32)]  # the pair's second Cast is to float32, whatever x was
    return [_cupy_kernel(to)(x)]


def round_in_place(x, low: str) -> None:
    """Rounds an fp32 device array to the low type's values where it lies (a 16-bit GEMM site's output)."""
    if isinstance(x, np.ndarray):  # the stand-in device
        x[...] = x.astype(np_dtype(LOW_CODES[low])).astype(np.float32)
    else:
        _cupy_kernel(LOW_CODES[low])(x, x)


@functools.cache
def _cupy_kernel(to: int):
    import cupy  # noqa: PLC0415 - GPU machines only

    return cupy.ElementwiseKernel("float32 x", "float32 y", BODIES[LOW_TYPES[to]], f"infc_round_to_{LOW_TYPES[to]}")


def round_bf16_bits(x: np.ndarray) -> np.ndarray:
    """_BF16_CUDA's arithmetic in NumPy (tests compare it with ml_dtypes' rounding)."""
    u = x.astype(np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(x), x, rounded)


ROUNDING = {ROUND_OP: round_to}
