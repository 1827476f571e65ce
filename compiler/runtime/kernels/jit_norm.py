"""Compiled (numba, see runtime/jit.py) row normalization: LayerNormalization,
SimplifiedLayerNormalization / RMSNormalization and ORT's SkipLayerNormalization /
SkipSimplifiedLayerNormalization, each row in one call instead of ten NumPy passes.

The arithmetic is norm._normalize_fast's, in the data's dtype (float32 statistics for float32):
mean = sum / D, then the mean of the squared deviations (or of the squares, simplified) plus eps,
inv_std = 1 / sqrt(that); y = (x - mean) * inv_std * gamma + beta. With a skip, the row is first
x + skip (+ bias), rounded as the NumPy path rounds it, and that sum is an output too.

A row's result depends on its own values and D only (reductions run along the row), so decoder
plans keep batch invariance; `normalize_rows` takes the compiled path whatever the row count.
`normalize_rows` returns None where it does not handle the case (compiled kernels off, another
dtype, parameters that broadcast otherwise) and the caller takes its NumPy path; that choice never
depends on the number of rows or on strides, so a row takes the same path alone or in a batch.
"""

from __future__ import annotations

import math

import numpy as np

from ..gemm_impls import PARALLEL_MIN_BYTES
from ..jit import jit
from .common import parallel_for

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@jit
def _normalize_rows(x, skip, bias, gamma, beta, eps, center, y, mean, inv_std, total):
    """x, y [R, D]; skip [R', D] with R a multiple of R' (row i adds skip row i % R'), or [0, D]
    for none; bias, gamma, beta [D], or [0] when absent; total [R, D] receives x + skip + bias, or
    is [0, D] when nobody takes it; mean, inv_std [R]. eps arrives as a float and is rounded to x's
    dtype, as NumPy rounds a Python float added to a float32 array.
    Every loop runs over the whole row (a loop from 1 would leave LLVM's vector body a remainder)."""
    t = x.dtype.type
    rows, d = x.shape
    skip_rows = skip.shape[0]
    has_bias, has_gamma, has_beta = bias.shape[0] > 0, gamma.shape[0] > 0, beta.shape[0] > 0
    keep_total = total.shape[0] > 0
    inv_d = t(1.0 / d)  # as NumPy multiplies a float32 row sum by the Python float 1 / D
    zero, one, eps = t(0), t(1), t(eps)
    scratch = np.empty(d, x.dtype)
    for i in range(rows):
        row = x[i]
        if skip_rows > 0:
            work = total[i] if keep_total else scratch
            skip_row = skip[i % skip_rows]
            if has_bias:
                for j in range(d):
                    work[j] = (row[j] + skip_row[j]) + bias[j]
            else:
                for j in range(d):
                    work[j] = row[j] + skip_row[j]
            row = work
        out = y[i]
        sq = zero
        if center:
            acc = zero
            for j in range(d):
                acc += row[j]
            m = acc * inv_d
            mean[i] = m
            for j in range(d):
                c = row[j] - m
                out[j] = c
                sq += c * c
        else:
            for j in range(d):
                c = row[j]
                out[j] = c
                sq += c * c
        r = one / np.sqrt(sq * inv_d + eps)
        inv_std[i] = r
        if has_gamma and has_beta:
            for j in range(d):
                out[j] = out[j] * r * gamma[j] + beta[j]
        elif has_gamma:
            for j in range(d):
                out[j] = out[j] * r * gamma[j]
        elif has_beta:
            for j in range(d):
                out[j] = out[j] * r + beta[j]
        else:
            for j in range(d):
                out[j] *= r


# stand-ins for absent operands (the kernel only reads their length): no allocation per call
_NONE_1D = {dtype: np.empty(0, dtype) for dtype in FLOATS}
_NONE_2D = {dtype: np.empty((0, 0), dtype) for dtype in FLOATS}


def _stripped(shape) -> tuple:
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def _vector(param, x: np.ndarray, tail: tuple, d: int) -> np.ndarray | None:
    """A per-feature parameter as a contiguous [D] vector of x's dtype, or None when it is not one
    value per feature of the normalized shape `tail` (NumPy path)."""
    if param.dtype != x.dtype or param.size != d:
        return None
    if param.ndim == 1 and len(tail) == 1:  # the common case, checked quickly
        return param if param.flags.c_contiguous else np.ascontiguousarray(param)
    if _stripped(param.shape) != _stripped(tail) or param.ndim > x.ndim:
        return None
    return np.ascontiguousarray(param).reshape(d)


def _skip_rows(skip, x_shape: tuple, tail: tuple, d: int) -> np.ndarray | None:
    """The skip as [R', D] rows repeating over x's rows: its shape without leading ones is a suffix
    of x's that covers the normalized shape, e.g. [B, S, D], [1, S, D] or [S, D] against [B, S, D]."""
    if skip.shape != x_shape:
        shape = _stripped(skip.shape)
        if len(shape) < len(tail) or len(shape) > len(x_shape) or tuple(x_shape[len(x_shape) - len(shape):]) != shape:
            return None
    return (skip if skip.flags.c_contiguous else np.ascontiguousarray(skip)).reshape(-1, d)


def normalize_rows(x: np.ndarray, axis: int, gamma, beta, eps: float, center: bool, skip=None, bias=None,
                   keep_total: bool = False):
    """(y [R, D], mean [R] or None, inv_std [R], total [R, D] or None) over the rows of x (the
    dimensions from `axis` on flattened to D); None when the compiled path does not take these operands."""
    kernel = _normalize_rows.get()
    dtype = x.dtype
    if kernel is None or dtype not in FLOATS or x.size == 0:
        return None
    # strided operands are copied, never declined: whether a slice of a fused projection is
    # contiguous depends on the token count, and the path taken must not (batch invariance)
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    shape = x.shape
    tail = shape[axis:]
    d = shape[-1] if len(tail) == 1 else math.prod(tail)
    absent = _NONE_1D[dtype]
    gamma_v = absent if gamma is None else _vector(gamma, x, tail, d)
    beta_v = absent if beta is None else _vector(beta, x, tail, d)
    bias_v = absent if bias is None else _vector(bias, x, tail, d)
    if gamma_v is None or beta_v is None or bias_v is None:
        return None
    rows = x.reshape(-1, d)
    if skip is None:
        skip2d, keep_total = _NONE_2D[dtype], False
    elif skip.shape == shape and skip.dtype == dtype and skip.flags.c_contiguous:  # the common case, quickly
        skip2d = skip.reshape(rows.shape)
    else:
        skip2d = _skip_rows(skip, shape, tail, d) if skip.dtype == dtype else None
        if skip2d is None:
            return None
    count = rows.shape[0]
    y = np.empty((count, d), dtype)
    mean = np.empty(count, dtype)
    inv_std = np.empty(count, dtype)
    total = np.empty((count, d), dtype) if keep_total else _NONE_2D[dtype]
    # two halves for the two cores on large inputs only (each call costs a dispatch); a skip that
    # repeats with a period of several rows would need its phase per half: one call then
    if count >= 2 and x.nbytes * 2 >= PARALLEL_MIN_BYTES and skip2d.shape[0] in (0, 1, count):
        per_row_skip = skip2d.shape[0] == count > 1

        def half(index: int) -> None:
            lo, hi = count * index // 2, count * (index + 1) // 2
            kernel(rows[lo:hi], skip2d[lo:hi] if per_row_skip else skip2d, bias_v, gamma_v, beta_v, eps, center,
                   y[lo:hi], mean[lo:hi], inv_std[lo:hi], total[lo:hi] if keep_total else total)

        parallel_for(2, half)
    else:
        kernel(rows, skip2d, bias_v, gamma_v, beta_v, eps, center, y, mean, inv_std, total)
    return y, (mean if center else None), inv_std, (total if keep_total else None)
