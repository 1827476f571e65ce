"""Compiled (numba, see runtime/jit.py) DynamicQuantizeLinear: two passes (the range, then the
quantized values) where the NumPy form makes seven over the activation of every quantized GEMM of a
dynamically quantized transformer.

The same float32 arithmetic as quant.dynamic_quantize_linear (onnxruntime's): scale =
(max(x, 0) - min(x, 0)) / 255, zero point = rint(-min / scale) saturated, y = rint(x / scale) + zero
point saturated, rint rounding half to even. Data with a NaN goes back to the NumPy form.
"""

# ruff: noqa: PLR0124, PLR1730 - `v != v` is the NaN test numba compiles; min()/max() would not keep a NaN

from __future__ import annotations

import numpy as np

from ..jit import jit


@jit
def _range(xs):
    """(min(x, 0), max(x, 0), whether x holds a NaN)."""
    low = np.float32(0.0)
    high = np.float32(0.0)
    for i in range(xs.shape[0]):
        v = xs[i]
        if v != v:
            return low, high, True
        if v < low:
            low = v
        if v > high:
            high = v
    return low, high, False


@jit
def _quantize(xs, scale, zero, ys):
    for i in range(xs.shape[0]):
        v = np.rint(xs[i] / scale) + zero
        if v < 0.0:
            v = 0.0
        elif v > 255.0:
            v = 255.0
        ys[i] = np.uint8(v)


def dynamic_quantize(x: np.ndarray) -> list | None:
    """[y uint8, scale, zero point] for float32 x, or None where the NumPy form must run."""
    ranged, quantized = _range.get(), _quantize.get()
    if ranged is None or quantized is None or x.dtype != np.float32 or x.size == 0:
        return None
    flat = np.ascontiguousarray(x).reshape(-1)
    low, high, has_nan = ranged(flat)
    if has_nan:
        return None
    scale = np.float32((np.float32(high) - np.float32(low)) / np.float32(255))
    if not scale:
        return None
    zero = np.uint8(np.clip(np.rint(-np.float32(low) / scale), 0, 255))
    y = np.empty(x.shape, np.uint8)
    quantized(flat, scale, np.float32(zero), y.reshape(-1))
    return [y, np.array(scale, dtype=np.float32), np.array(zero, dtype=np.uint8)]
