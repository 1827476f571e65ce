"""Elementwise ops with NumPy broadcasting: arithmetic, math functions, comparisons, logic, bits, Where.

Binary ops keep the input dtype (ONNX requires both sides to match); exotic float dtypes
(bfloat16, float8) are computed in float32 and cast back.
"""

from __future__ import annotations

import math

import numpy as np

from ..jit import jit
from .common import broadcast_shape, is_exotic, to_compute


def _binary(ufunc):
    is_ufunc = isinstance(ufunc, np.ufunc)

    def kernel(inputs, attrs, ctx):
        a, b = inputs
        if a.dtype.kind == "V":
            return [ufunc(to_compute(a), to_compute(b)).astype(a.dtype)]
        out = ctx.out[0] if is_ufunc and ctx is not None and ctx.out else None
        if out is not None and out.dtype == a.dtype == b.dtype and out.shape == broadcast_shape(a.shape, b.shape):
            return [ufunc(a, b, out=out)]  # a buffer the executor donated (or preallocated)
        return [ufunc(a, b)]
    kernel.accepts_out = is_ufunc
    return kernel


def _unary(fn):
    is_ufunc = isinstance(fn, np.ufunc)

    def kernel(inputs, attrs, ctx):
        x = inputs[0]
        if x.dtype.kind == "V":
            return [fn(to_compute(x)).astype(x.dtype)]
        out = ctx.out[0] if is_ufunc and ctx is not None and ctx.out else None
        if out is not None and x.dtype.kind == "f" and out.dtype == x.dtype and out.shape == x.shape:
            return [fn(x, out=out)]
        result = fn(x)
        return [result if result.dtype == x.dtype else result.astype(x.dtype)]
    kernel.accepts_out = is_ufunc
    return kernel


def _predicate(fn):
    return lambda inputs, attrs, ctx: [np.asarray(fn(*(to_compute(x) for x in inputs)), dtype=bool)]


def _div(a, b):
    if a.dtype.kind == "f":
        return np.divide(a, b)
    quotient = np.floor_divide(a, b)
    if a.dtype.kind == "i":  # ONNX integer division truncates toward zero
        quotient = quotient + (((a % b) != 0) & ((a < 0) ^ (b < 0))).astype(a.dtype)
    return quotient


def mod(inputs, attrs, ctx):
    a, b = (to_compute(x) for x in inputs)
    result = np.fmod(a, b) if attrs.get("fmod", 0) else np.mod(a, b)
    return [result.astype(inputs[0].dtype, copy=False)]


def power(inputs, attrs, ctx):
    x, y = inputs
    dtype = x.dtype
    base, exponent = to_compute(x), to_compute(y)
    if base.dtype.kind == "f":
        result = np.power(base, exponent.astype(base.dtype, copy=False))
    elif exponent.dtype.kind == "f":
        result = np.power(base.astype(np.float64), exponent)
    else:
        result = np.power(base, exponent.astype(base.dtype, copy=False))
    return [result.astype(dtype, copy=False)]


def _variadic(ufunc, mean=False):
    def kernel(inputs, attrs, ctx):
        arrays = [to_compute(x) for x in inputs if x is not None]
        result = arrays[0]
        for other in arrays[1:]:
            result = ufunc(result, other)
        if mean:
            result = result / np.asarray(len(arrays), dtype=result.dtype)
        return [np.asarray(result).astype(inputs[0].dtype, copy=len(arrays) == 1)]
    return kernel


# erf to float32 accuracy: Taylor series near zero, a Chebyshev fit of erfc elsewhere (1.2e-7 relative).
_ERFC = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398, 1.48851587,
         -0.82215223, 0.17087277)
_TAYLOR = tuple((-1) ** n / (math_factorial * (2 * n + 1)) for n, math_factorial in
                enumerate([1, 1, 2, 6, 24, 120, 720, 5040, 40320, 362880, 3628800]))


# float32 erf: a rational fit x * P(x^2) / Q(x^2) on [-4, 4] (erf is +-1 in float32 beyond), as in
# Eigen / XLA: 4.5e-7 absolute error at most, in ~25 NumPy passes instead of ~50 (the compiled
# GELU in jit_activation.py evaluates the same fit).
ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
         -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
         -1.42647390514189e-02)


def erf_f32(x: np.ndarray, scale: float = 1.0, x_scale: float = 1.0) -> np.ndarray:
    """scale * erf(x_scale * x) for float32 data, as a new array."""
    z = np.multiply(x, x_scale) if x_scale != 1.0 else np.copy(x)
    np.maximum(z, -4.0, out=z)  # NaN stays NaN
    np.minimum(z, 4.0, out=z)
    z2 = np.square(z)
    p = np.multiply(z2, ERF_P[0] * scale)
    p += ERF_P[1] * scale
    for c in ERF_P[2:]:
        p *= z2
        p += c * scale
    p *= z
    q = np.multiply(z2, ERF_Q[0], out=z)  # z is spent
    q += ERF_Q[1]
    for c in ERF_Q[2:]:
        q *= z2
        q += c
    p /= q
    return p


@jit
def _erf_loop(x, out):
    for i in range(x.size):
        out[i] = math.erf(x[i])


def erf_f64(x: np.ndarray) -> np.ndarray:
    """erf of float64 data to float64 accuracy (libm's): the fits above stop near float32's."""
    flat = np.ascontiguousarray(x).reshape(-1)
    compiled = _erf_loop.get()
    if compiled is None:
        return np.frompyfunc(math.erf, 1, 1)(flat).astype(np.float64).reshape(x.shape)
    out = np.empty_like(flat)
    compiled(flat, out)
    return out.reshape(x.shape)


def erf(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.float32:
        return erf_f32(x)
    if x.dtype == np.float64:
        return erf_f64(x)
    if x.dtype == np.float16:
        return erf_f32(x.astype(np.float32)).astype(np.float16)
    dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float32)
    work = x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)
    z = np.abs(work)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = np.full_like(t, _ERFC[-1])
    for c in _ERFC[-2::-1]:
        poly *= t
        poly += c
    far = 1.0 - t * np.exp(poly - z * z)
    z2 = work * work
    near = np.full_like(work, _TAYLOR[-1])
    for c in _TAYLOR[-2::-1]:
        near *= z2
        near += c
    near *= work * (2.0 / np.sqrt(np.pi))
    return np.where(z < 0.5, near, np.copysign(far, work)).astype(dtype, copy=False)


def is_inf(inputs, attrs, ctx):
    x = to_compute(inputs[0])
    pos, neg = attrs.get("detect_positive", 1), attrs.get("detect_negative", 1)
    return [np.isinf(x) & ((x > 0) if pos and not neg else (x < 0) if neg and not pos else bool(pos or neg))]


def bit_shift(inputs, attrs, ctx):
    a, b = np.broadcast_arrays(*inputs)
    bits = a.dtype.itemsize * 8
    outside = (b < 0) | (b >= bits)
    shift = np.where(outside, 0, b).astype(a.dtype)
    if attrs["direction"] == "RIGHT":
        result = np.right_shift(a, shift)
        fill = np.where(a < 0, -1, 0).astype(a.dtype) if a.dtype.kind == "i" else 0
    else:
        unsigned = np.dtype(f"u{a.dtype.itemsize}")
        result = np.left_shift(a.view(unsigned), shift.view(unsigned)).view(a.dtype)
        fill = 0
    return [np.where(outside, fill, result).astype(a.dtype, copy=False)]


def where(inputs, attrs, ctx):
    cond, x, y = inputs
    if is_exotic(x.dtype):
        return [np.where(cond, to_compute(x), to_compute(y)).astype(x.dtype)]
    return [np.where(cond, x, y)]


def identity(inputs, attrs, ctx):
    return [inputs[0]]


def _reciprocal(x):
    return np.reciprocal(x) if x.dtype.kind == "f" else 1 / x


def _round(x):
    return np.round(x) if x.dtype.kind == "f" else x


UNARY = {
    "Abs": np.abs, "Neg": np.negative, "Exp": np.exp, "Log": np.log, "Sqrt": np.sqrt, "Reciprocal": _reciprocal,
    "Ceil": np.ceil, "Floor": np.floor, "Round": _round, "Sign": np.sign, "Sin": np.sin, "Cos": np.cos,
    "Tan": np.tan, "Asin": np.arcsin, "Acos": np.arccos, "Atan": np.arctan, "Sinh": np.sinh, "Cosh": np.cosh,
    "Asinh": np.arcsinh, "Acosh": np.arccosh, "Atanh": np.arctanh, "Erf": erf, "Not": np.logical_not,
    "BitwiseNot": np.invert,
}
BINARY = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _div, "BitwiseAnd": np.bitwise_and,
    "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor,
}
PREDICATES = {
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
    "IsNaN": np.isnan,
}

KERNELS = {
    **{("", name): _unary(fn) for name, fn in UNARY.items()},
    **{("", name): _binary(fn) for name, fn in BINARY.items()},
    **{("", name): _predicate(fn) for name, fn in PREDICATES.items()},
    ("", "Pow"): power,
    ("", "Mod"): mod,
    ("", "Max"): _variadic(np.maximum),
    ("", "Min"): _variadic(np.minimum),
    ("", "Sum"): _variadic(np.add),
    ("", "Mean"): _variadic(np.add, mean=True),
    ("", "IsInf"): is_inf,
    ("", "BitShift"): bit_shift,
    ("", "Where"): where,
    ("", "Identity"): identity,
}
