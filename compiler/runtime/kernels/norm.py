"""Normalizations: BatchNormalization, InstanceNormalization, GroupNormalization, LayerNormalization,
SimplifiedLayerNormalization / RMSNormalization, ORT's SkipLayerNormalization and
SkipSimplifiedLayerNormalization, LRN, LpNormalization, MeanVarianceNormalization.

Statistics are float32 for float32 data (mean, then the mean of squared deviations). Float32/float64
rows go through one compiled call when numba is there (jit_norm.py, same arithmetic); this NumPy
code is the path without it and for every other case."""

from __future__ import annotations

import math

import numpy as np

from .common import arg, norm_axis, to_compute
from .jit_norm import normalize_rows


def _channel(v: np.ndarray, rank: int) -> np.ndarray:
    return v.reshape((-1,) + (1,) * (rank - 2))


def batch_norm(inputs, attrs, ctx):
    x, scale, bias, mean, var = (to_compute(v) for v in inputs[:5])
    eps = attrs.get("epsilon", 1e-5)
    if attrs.get("training_mode", 0):
        axes = (0,) + tuple(range(2, x.ndim))
        batch_mean, batch_var = x.mean(axis=axes), x.var(axis=axes)
        momentum = attrs.get("momentum", 0.9)
        y = _affine(x, scale, bias, batch_mean, batch_var, eps)
        running = [mean * momentum + batch_mean * (1 - momentum), var * momentum + batch_var * (1 - momentum)]
        return [y.astype(inputs[0].dtype, copy=False)] + [r.astype(inputs[0].dtype, copy=False) for r in running]
    return [_affine(x, scale, bias, mean, var, eps).astype(inputs[0].dtype, copy=False)]


def _affine(x, scale, bias, mean, var, eps):
    factor = scale / np.sqrt(var + np.asarray(eps, dtype=var.dtype))
    shift = bias - mean * factor
    y = x * _channel(factor, x.ndim)
    y += _channel(shift, x.ndim)
    return y


def _normalize(x2d: np.ndarray, eps: float, center: bool = True):
    """Rows of a 2-D array to zero mean (if `center`) and unit variance; also the row stats."""
    return _normalize_fast(x2d, eps, center)


def _normalize_fast(x2d: np.ndarray, eps: float, center: bool, fresh: bool = False):
    """Row normalization in few NumPy passes; `fresh`: x2d may be overwritten. Row sums go through einsum: faster than np.add.reduce on short rows and, unlike a
    BLAS product with a ones vector, a row's result never depends on how many rows there are
    (decoder plans rely on batch invariance)."""
    scale = 1.0 / x2d.shape[1]
    if center:
        mean = np.einsum("ij->i", x2d).reshape(-1, 1)
        mean *= scale
        centered = np.subtract(x2d, mean, out=x2d if fresh else None)
    else:
        mean, centered = None, x2d
    inv_std = np.einsum("ij,ij->i", centered, centered).reshape(-1, 1)
    inv_std *= scale
    inv_std += eps
    np.sqrt(inv_std, out=inv_std)
    np.reciprocal(inv_std, out=inv_std)
    if center:
        centered *= inv_std
        return centered, mean, inv_std
    return np.multiply(x2d, inv_std), mean, inv_std


def _stats_shape(x: np.ndarray, axis: int) -> tuple:
    return x.shape[:axis] + (1,) * (x.ndim - axis)


def _layer_norm(x: np.ndarray, scale, bias, axis: int, eps: float, center: bool, fresh: bool = False):
    axis = x.ndim - 1 if axis == -1 else norm_axis(axis, x.ndim)
    compiled = normalize_rows(x, axis, scale, bias, eps, center)
    if compiled is not None:
        y, mean, inv_std, _ = compiled
        stats_shape = _stats_shape(x, axis)
        return y.reshape(x.shape), [mean.reshape(stats_shape) if center else None, inv_std.reshape(stats_shape)]
    if x.dtype == np.float32 or x.dtype == np.float64:
        rows = x.reshape(-1, math.prod(x.shape[axis:])) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(
            -1, math.prod(x.shape[axis:]))
        y, mean, inv_std = _normalize_fast(rows, eps, center, fresh and x.flags.c_contiguous)
        y = y.reshape(x.shape)
        if scale is not None:
            y *= scale if scale.dtype == y.dtype else scale.astype(y.dtype)
        if bias is not None:
            y += bias if bias.dtype == y.dtype else bias.astype(y.dtype)
    else:
        outer = math.prod(x.shape[:axis])
        y, mean, inv_std = _normalize(np.ascontiguousarray(to_compute(x)).reshape(outer, -1), eps, center)
        y = y.reshape(x.shape)
        if scale is not None:
            y *= to_compute(scale)
        if bias is not None:
            y += to_compute(bias)
        y = y.astype(x.dtype, copy=False)
    stats_shape = _stats_shape(x, axis)
    stats = [mean.reshape(stats_shape) if mean is not None else None, inv_std.reshape(stats_shape)]
    return y, stats


def layer_norm(inputs, attrs, ctx):
    y, (mean, inv_std) = _layer_norm(inputs[0], arg(inputs, 1), arg(inputs, 2), attrs.get("axis", -1),
                                     attrs.get("epsilon", 1e-5), center=True)
    return [y, mean, inv_std]


def simplified_layer_norm(inputs, attrs, ctx):
    y, (_, inv_std) = _layer_norm(inputs[0], arg(inputs, 1), None, attrs.get("axis", -1),
                                  attrs.get("epsilon", 1e-5), center=False)
    return [y, inv_std]


def _skip_norm(center: bool):
    def kernel(inputs, attrs, ctx):
        x, skip, gamma = inputs[0], inputs[1], inputs[2]
        beta, bias = (arg(inputs, 3), arg(inputs, 4)) if center else (None, arg(inputs, 3))
        eps = attrs.get("epsilon", 1e-12)
        # the sum is an output too (index 3), needed unless the node has fewer outputs
        wants_total = not (ctx is not None and ctx.out and len(ctx.out) < 4)
        compiled = normalize_rows(x, x.ndim - 1, gamma, beta, eps, center, skip, bias, wants_total)
        if compiled is not None:
            y, mean, inv_std, total = compiled
            stats_shape = _stats_shape(x, x.ndim - 1)
            return [y.reshape(x.shape), mean.reshape(stats_shape) if center else None, inv_std.reshape(stats_shape),
                    total.reshape(x.shape) if wants_total else None]
        total = x + skip
        if bias is not None:
            total += bias
        # normalize the sum in place when nobody takes it
        y, (mean, inv_std) = _layer_norm(total, gamma, beta, -1, eps, center, fresh=not wants_total)
        return [y, mean, inv_std, total]
    return kernel


def instance_norm(inputs, attrs, ctx):
    x, scale, bias = inputs
    n, c = x.shape[:2]
    y, _, _ = _normalize(np.ascontiguousarray(to_compute(x)).reshape(n * c, -1), attrs.get("epsilon", 1e-5))
    y = y.reshape(x.shape)
    y *= _channel(to_compute(scale), x.ndim)
    y += _channel(to_compute(bias), x.ndim)
    return [y.astype(x.dtype, copy=False)]


def group_norm(inputs, attrs, ctx):
    x, scale, bias = inputs
    groups = attrs["num_groups"]
    n, c = x.shape[:2]
    y, _, _ = _normalize(np.ascontiguousarray(to_compute(x)).reshape(n * groups, -1), attrs.get("epsilon", 1e-5))
    if scale.size == groups and groups != c:  # opset 18: one scale and bias per group
        y = y.reshape(n, groups, -1) * scale.reshape(1, groups, 1) + bias.reshape(1, groups, 1)
        return [y.reshape(x.shape).astype(x.dtype, copy=False)]
    y = y.reshape(x.shape)
    y *= _channel(to_compute(scale), x.ndim)
    y += _channel(to_compute(bias), x.ndim)
    return [y.astype(x.dtype, copy=False)]


def lrn(inputs, attrs, ctx):
    x = to_compute(inputs[0])
    size = attrs["size"]
    alpha, beta, bias = attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
    square = np.square(x)
    below, above = (size - 1) // 2, size - 1 - (size - 1) // 2
    cum = np.concatenate([np.zeros_like(square[:, :1]), np.cumsum(square, axis=1)], axis=1)
    channels = x.shape[1]
    hi = np.minimum(np.arange(channels) + above + 1, channels)
    lo = np.maximum(np.arange(channels) - below, 0)
    window = cum[:, hi] - cum[:, lo]
    return [(x / (bias + (alpha / size) * window) ** beta).astype(inputs[0].dtype, copy=False)]


def lp_norm(inputs, attrs, ctx):
    x = to_compute(inputs[0])
    axis, p = attrs.get("axis", -1), attrs.get("p", 2)
    norm = np.sum(np.abs(x), axis=axis, keepdims=True) if p == 1 else np.sqrt(np.sum(x * x, axis=axis, keepdims=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.where(norm == 0, 0, x / norm)
    return [y.astype(inputs[0].dtype, copy=False)]


def mean_variance_norm(inputs, attrs, ctx):
    x = to_compute(inputs[0])
    axes = tuple(attrs.get("axes", [0, 2, 3]))
    mean = x.mean(axis=axes, keepdims=True)
    var = np.mean(x * x, axis=axes, keepdims=True) - mean * mean
    return [((x - mean) / (np.sqrt(var) + 1e-9)).astype(inputs[0].dtype, copy=False)]


def rms_norm(inputs, attrs, ctx):
    y, _ = _layer_norm(inputs[0], arg(inputs, 1), None, attrs.get("axis", -1), attrs.get("epsilon", 1e-5),
                       center=False)
    return [y]


KERNELS = {
    ("", "BatchNormalization"): batch_norm,
    ("", "InstanceNormalization"): instance_norm,
    ("", "GroupNormalization"): group_norm,
    ("", "LayerNormalization"): layer_norm,
    ("", "SimplifiedLayerNormalization"): simplified_layer_norm,
    ("", "RMSNormalization"): rms_norm,
    ("", "LRN"): lrn,
    ("", "LpNormalization"): lp_norm,
    ("", "MeanVarianceNormalization"): mean_variance_norm,
    ("com.microsoft", "SkipLayerNormalization"): _skip_norm(center=True),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): _skip_norm(center=False),
}
