"""float32 <-> float16 / bfloat16 conversions and rounding, compiled (numba, see runtime/jit.py).

NumPy converts float32 to float16 in software, one value at a time: 10 ns a value here (23 us for a
16-token BERT activation), and float16 to float32 at 3 ns. A reduced-precision CPU plan rounds every
op's result to the low type (compiler/build_precision.py), and a float16 model widens each operand
(kernels/half.py), so those conversions were half of an fp16 plan's time. These loops do them on the
bits, round to nearest even as IEEE 754 and NumPy / ml_dtypes do: overflow to inf, subnormals, NaN
kept a NaN (its payload bits may differ from NumPy's).

float16 from float32 bits (a = the bits without the sign):
- a >= 0x7F800000: inf stays inf, NaN stays NaN;
- a >= 0x477FF000 (65520.0, the midpoint above 65504): inf;
- a < 0x38800000 (2^-14, the smallest normal float16): a multiple of 2^-24, found by adding 0.5 in
  float32 (whose step in [0.5, 1) is 2^-24, so the addition rounds to nearest even) and subtracting
  it again. This needs strict float32 arithmetic: the kernels are built without fastmath;
- otherwise: the 13 low mantissa bits rounded away on the integer bits (adding 0xFFF plus the kept
  part's lowest bit carries into the exponent when it must).
bfloat16 keeps the top 16 bits, rounded the same way (0x7FFF plus the kept part's lowest bit).
"""

# ruff: noqa: PLR2004 - the bit patterns are the spec

from __future__ import annotations

import functools

import numpy as np

from ..jit import jit
from .common import np_dtype

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
MIN_COMPILED = 64  # fewer values: NumPy's call costs less than the dispatch


@jit(fastmath=set())
def _round_f16(xs, bits_in, bits_out):
    """bits_out = the float32 bits of xs rounded to the nearest float16 value (may be bits_in).
    Every case is computed and one selected: no branch for the data to mispredict."""
    half = np.float32(0.5)
    for i in range(xs.shape[0]):
        u = bits_in[i]
        a = u & 0x7FFFFFFF
        sign = u & 0x80000000
        tiny = np.float32((abs(xs[i]) + half) - half).view(np.uint32) | sign
        result = (u + 0xFFF + ((u >> 13) & 1)) & 0xFFFFE000
        result = tiny if a < 0x38800000 else result
        result = (sign | 0x7F800000) if a >= 0x477FF000 else result
        bits_out[i] = u if a >= 0x7F800000 else result


@jit(fastmath=set())
def _to_f16_bits(xs, bits_in, out):
    """out = the float16 bits of xs (uint16)."""
    half = np.float32(0.5)
    for i in range(xs.shape[0]):
        u = bits_in[i]
        sign = (u >> 16) & 0x8000
        a = u & 0x7FFFFFFF
        # below 2^-14: the count of 2^-24 steps, the float32 sum's low mantissa bits (0.5 is 0x3F000000)
        tiny = np.float32(abs(xs[i]) + half).view(np.uint32) - 0x3F000000
        result = (a + 0xFFF + ((a >> 13) & 1) - 0x38000000) >> 13
        result = tiny if a < 0x38800000 else result
        result = 0x7C00 if a >= 0x477FF000 else result
        result = (0x7E00 | ((a >> 13) & 0x3FF)) if a > 0x7F800000 else result
        out[i] = sign | result


@jit(fastmath=set())
def _from_table(codes, table, out):
    """out = table[codes]: float16 bits to float32 bits through the 65,536-entry table."""
    for i in range(codes.shape[0]):
        out[i] = table[codes[i]]


@jit(fastmath=set())
def _round_bf16(bits_in, bits_out):
    for i in range(bits_in.shape[0]):
        u = bits_in[i]
        if (u & 0x7FFFFFFF) > 0x7F800000:
            bits_out[i] = u
        else:
            bits_out[i] = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000


@functools.cache
def _f16_table() -> np.ndarray:
    """float32 bits of every float16 bit pattern (NumPy's own conversion, done once: 256 KB)."""
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32).view(np.uint32)


def _flat(x: np.ndarray) -> np.ndarray | None:
    """x as one contiguous row (a copy of a strided view: still far cheaper than NumPy's conversion),
    or None below the size the compiled loops pay off at."""
    if x.size < MIN_COMPILED:
        return None
    return x.reshape(-1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(-1)


def round_to_low(x: np.ndarray, low: str, out: np.ndarray | None = None) -> np.ndarray:
    """float32 `x` with every value rounded to the nearest `low` ("float16" / "bfloat16") value, still
    float32: what Cast(Cast(x, low), float32) gives. Into `out` when given (it may be `x`)."""
    flat = _flat(x)
    kernel = (_round_f16 if low == "float16" else _round_bf16).get()
    if out is None or out.shape != x.shape or out.dtype != F32 or not out.flags.c_contiguous:
        out = np.empty(x.shape, F32)
    if flat is None or kernel is None or x.dtype != F32:
        np.copyto(out, np.asarray(x).astype(np_dtype(low)).astype(F32))
        return out
    target = out.reshape(-1)
    if low == "float16":
        kernel(flat, flat.view(np.uint32), target.view(np.uint32))
    else:
        kernel(flat.view(np.uint32), target.view(np.uint32))
    return out


def float32_to_float16(x: np.ndarray) -> np.ndarray:
    """x.astype(float16) for float32 `x`, compiled where it can be."""
    compiled = _to_float16(x)
    if compiled is not None:
        return compiled
    return x.astype(F16)  # too large becomes inf: ONNX's Cast semantics (the warning is filtered)


def float16_to_float32(x: np.ndarray) -> np.ndarray:
    """x.astype(float32) for float16 `x`, compiled where it can be."""
    compiled = _from_float16(x)
    return x.astype(F32) if compiled is None else compiled


def _to_float16(x: np.ndarray) -> np.ndarray | None:
    """float32 -> float16 compiled, or None (the caller converts with NumPy)."""
    flat = _flat(x)
    kernel = _to_f16_bits.get() if x.dtype == F32 else None
    if flat is None or kernel is None:
        return None
    out = np.empty(x.shape, np.uint16)
    kernel(flat, flat.view(np.uint32), out.reshape(-1))
    return out.view(F16)


def _from_float16(x: np.ndarray) -> np.ndarray | None:
    """float16 -> float32 compiled, or None (the caller converts with NumPy)."""
    flat = _flat(x)
    kernel = _from_table.get() if x.dtype == F16 else None
    if flat is None or kernel is None:
        return None
    out = np.empty(x.shape, F32)
    kernel(flat.view(np.uint16), _f16_table(), out.reshape(-1).view(np.uint32))
    return out
