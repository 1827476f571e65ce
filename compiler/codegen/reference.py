"""Float64 references for the generated GEMMs, and the error measure the checks use.

`xp` is the array module: NumPy on the CPU (tests, emulator), CuPy on the device (gpu_check, where
a float64 product of large shapes takes milliseconds). Inputs are the values the kernel sees
(already rounded to their storage dtype); the weight is the logical (N, K) one: for SwiGLU gate
rows then up rows, for int8 the dequantized q * scale.
"""

from __future__ import annotations

import math

import numpy as np

TOLERANCE = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-2}


def _erf(x, xp):
    if xp is np:
        return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)
    from cupyx.scipy.special import erf  # noqa: PLC0415 - device only

    return erf(x)


def activate(y, act: str, xp=np):
    if act == "relu":
        return xp.maximum(y, 0.0)
    if act == "gelu":
        return 0.5 * y * (1.0 + _erf(y / math.sqrt(2.0), xp))
    if act == "silu":
        return y / (1.0 + xp.exp(-y))
    return y


def gemm_reference(a, w_nk, *, bias=None, act: str = "none", swiglu: bool = False, residual=None,
                   xp=np):
    """epilogue(a @ w_nk^T) in float64: + bias, activation or SwiGLU (silu(gate) * up), + residual."""
    y = xp.asarray(a, dtype=xp.float64) @ xp.asarray(w_nk, dtype=xp.float64).T
    if bias is not None:
        y = y + xp.asarray(bias, dtype=xp.float64)
    if swiglu:
        h = y.shape[1] // 2
        y = activate(y[:, :h], "silu", xp) * y[:, h:]
    else:
        y = activate(y, act, xp)
    if residual is not None:
        y = y + xp.asarray(residual, dtype=xp.float64)
    return y


def relative_error(out, ref, xp=np) -> float:
    """||out - ref|| / ||ref||; inf when out has a NaN or inf (unwritten or broken elements)."""
    out = xp.asarray(out, dtype=xp.float64)
    if not bool(xp.isfinite(out).all()):
        return math.inf
    den = float(xp.linalg.norm(ref))
    return float(xp.linalg.norm(out - ref)) / (den if den > 0 else 1.0)
