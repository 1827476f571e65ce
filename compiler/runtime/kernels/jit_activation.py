"""Compiled (numba, see runtime/jit.py) GELU family for float32: Gelu (erf or tanh form), ORT's
BiasGelu, FastGelu (optional bias) and QuickGelu, the bias add and the activation in one pass.

Same formulas and operation order as the NumPy paths in activation.py:
- erf form:  x * (0.5 + 0.5 * erf(x / sqrt(2))), erf by elementwise.erf_f32's rational fit;
- tanh form: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)));
- QuickGelu: x * sigmoid(alpha * x), sigmoid(u) = 0.5 * tanh(0.5 u) + 0.5 (the NumPy path's form).
tanh is a rational fit on [-9, 9] (Eigen's and MLAS's float32 tanh: 3.4e-7 absolute error at
most, exactly +-1 beyond, where float32 tanh rounds to +-1 anyway): a libm call per element would
not vectorize. Clamps compare with `<` / `>`, so NaN passes through as in NumPy.

Float32 only: the fits are float32-accurate, so float64 keeps its NumPy path. Every element's result
depends on that element alone, whatever the tensor's size (batch invariance for decoder plans).
`gelu` returns None where it does not handle the case and the caller takes its NumPy path.
"""

# ruff: noqa: PLR1730 - min()/max() would not keep a NaN (the compares do)

from __future__ import annotations

import math

import numpy as np

from ..gemm_impls import PARALLEL_MIN_BYTES
from ..jit import jit
from .common import parallel_for
from .elementwise import ERF_P, ERF_Q

ERF_FORM, TANH_FORM, QUICK_FORM = range(3)  # the kernel's `form`

# tanh(u) ~ u * P(u^2) / Q(u^2) on [-9, 9]
_TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
           1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)
_TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@jit
def _gelu_rows(x, bias, form, alpha, y):
    """y [R, D] = the activation `form` of x [R, D] (+ bias [D] unless bias is empty); alpha is
    QuickGelu's. Horner steps spelled out: the kernel cannot call a helper it does not compile."""
    t = x.dtype.type
    rows, d = x.shape
    has_bias = bias.shape[0] > 0
    half, one = t(0.5), t(1)
    erf_clamp, tanh_clamp = t(4), t(9)
    x_scale = t(1 / math.sqrt(2.0)) if form == ERF_FORM else t(0.5) * alpha
    cube, linear = t(0.044715 * _SQRT_2_OVER_PI), t(_SQRT_2_OVER_PI)
    p0, p1, p2, p3, p4, p5, p6 = (t(ERF_P[0]), t(ERF_P[1]), t(ERF_P[2]), t(ERF_P[3]), t(ERF_P[4]), t(ERF_P[5]),
                                  t(ERF_P[6]))
    q0, q1, q2, q3, q4 = t(ERF_Q[0]), t(ERF_Q[1]), t(ERF_Q[2]), t(ERF_Q[3]), t(ERF_Q[4])
    a0, a1, a2, a3, a4, a5, a6 = (t(_TANH_P[0]), t(_TANH_P[1]), t(_TANH_P[2]), t(_TANH_P[3]), t(_TANH_P[4]),
                                  t(_TANH_P[5]), t(_TANH_P[6]))
    b0, b1, b2, b3 = t(_TANH_Q[0]), t(_TANH_Q[1]), t(_TANH_Q[2]), t(_TANH_Q[3])
    for i in range(rows):
        row, out = x[i], y[i]
        if has_bias:
            for j in range(d):
                out[j] = row[j] + bias[j]
        else:
            for j in range(d):
                out[j] = row[j]
        if form == ERF_FORM:
            for j in range(d):
                v = out[j]
                z = v * x_scale
                if z < -erf_clamp:
                    z = -erf_clamp
                if z > erf_clamp:
                    z = erf_clamp
                z2 = z * z
                p = ((((((z2 * p0 + p1) * z2 + p2) * z2 + p3) * z2 + p4) * z2 + p5) * z2 + p6) * z
                q = (((z2 * q0 + q1) * z2 + q2) * z2 + q3) * z2 + q4
                out[j] = v * (p / q * half + half)
        else:
            for j in range(d):
                v = out[j]
                if form == TANH_FORM:
                    u = (v * v * cube + linear) * v
                else:
                    u = v * x_scale
                if u < -tanh_clamp:
                    u = -tanh_clamp
                if u > tanh_clamp:
                    u = tanh_clamp
                u2 = u * u
                p = ((((((u2 * a0 + a1) * u2 + a2) * u2 + a3) * u2 + a4) * u2 + a5) * u2 + a6) * u
                q = ((u2 * b0 + b1) * u2 + b2) * u2 + b3
                th = p / q
                if form == TANH_FORM:
                    out[j] = (th + one) * v * half
                else:
                    out[j] = v * (th * half + half)


@jit(calls=(_gelu_rows,))
def _gated_rows(gate, up, form, alpha, y):
    """y [R, D] = the activation `form` of gate [R, D], times up [R, D] (views of one packed array):
    the activation is _gelu_rows's, then one product, so the bits are those of the two steps."""
    _gelu_rows(gate, np.empty(0, y.dtype), form, alpha, y)
    for i in range(y.shape[0]):
        out, other = y[i], up[i]
        for j in range(y.shape[1]):
            out[j] *= other[j]


def gated(packed: np.ndarray, gate_first: bool, form: int, alpha: float = 1.0) -> np.ndarray | None:
    """activation(gate) * up where packed [..., 2D] holds gate and up side by side (a SwiGLU / GeGLU
    projection's output), as a new float32 [..., D] array; None where the compiled path does not
    take it (the caller then runs the two steps' NumPy paths)."""
    kernel = _gated_rows.get()
    if kernel is None or packed.dtype != np.float32 or packed.ndim == 0 or packed.size == 0 or packed.shape[-1] % 2:
        return None
    d = packed.shape[-1] // 2
    rows = (packed if packed.flags.c_contiguous else np.ascontiguousarray(packed)).reshape(-1, 2 * d)
    gate, up = (rows[:, :d], rows[:, d:]) if gate_first else (rows[:, d:], rows[:, :d])
    y = np.empty((*packed.shape[:-1], d), np.float32)
    out = y.reshape(-1, d)
    alpha_t = np.float32(alpha)
    _in_row_halves(rows.shape[0], packed.nbytes,
                   lambda lo, hi: kernel(gate[lo:hi], up[lo:hi], form, alpha_t, out[lo:hi]))
    return y


def _in_row_halves(count: int, nbytes: int, run) -> None:
    """run(lo, hi) over rows [0, count): in two halves shared with the helper thread when the data is
    large enough to pay for the hand-off, else at once."""
    if count >= 2 and nbytes >= PARALLEL_MIN_BYTES:
        parallel_for(2, lambda index: run(count * index // 2, count * (index + 1) // 2))
    else:
        run(0, count)


def gelu(x: np.ndarray, bias, form: int, alpha: float = 1.0) -> np.ndarray | None:
    """The activation of x (+ bias over the last axis) as a new float32 array, or None when the
    compiled path does not take these operands."""
    kernel = _gelu_rows.get()
    if kernel is None or x.dtype != np.float32 or x.ndim == 0 or x.size == 0:
        return None
    d = x.shape[-1]
    if bias is None:
        bias_v = _NO_BIAS
    elif bias.dtype == np.float32 and bias.size == d and bias.ndim <= x.ndim and bias.shape[-1] == d:
        bias_v = bias.reshape(d) if bias.flags.c_contiguous else np.ascontiguousarray(bias).reshape(d)
    else:
        return None
    # a strided input (a slice of a fused projection) is copied: the compiled loop vectorizes on
    # contiguous rows only, and one layout means one compiled signature
    rows = (x if x.flags.c_contiguous else np.ascontiguousarray(x)).reshape(-1, d)
    y = np.empty(x.shape, np.float32)
    out = y.reshape(-1, d)
    alpha_t = np.float32(alpha)
    _in_row_halves(rows.shape[0], x.nbytes * 2, lambda lo, hi: kernel(rows[lo:hi], bias_v, form, alpha_t, out[lo:hi]))
    return y


_NO_BIAS = np.empty(0, np.float32)
