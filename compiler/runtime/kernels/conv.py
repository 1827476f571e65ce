"""Convolutions: Conv / com.microsoft FusedConv (im2col + one BLAS GEMM per group, bias, residual and
activation fused into the epilogue; a no-copy path for pointwise convs and a per-tap path for
depthwise convs) and ConvTranspose (GEMM + col2im)."""

from __future__ import annotations

import math
import itertools
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from . import im2col as phased
from .common import arg


@dataclass(frozen=True)
class Geometry:
    strides: tuple
    dilations: tuple
    pads_begin: tuple
    pads_end: tuple
    out: tuple


def geometry(spatial, kernel, attrs, ceil_mode: bool = False) -> Geometry:
    nd = len(spatial)
    strides = tuple(attrs.get("strides") or [1] * nd)
    dilations = tuple(attrs.get("dilations") or [1] * nd)
    pads = list(attrs.get("pads") or [0] * (2 * nd))
    begin, end = pads[:nd], pads[nd:]
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(nd):
            out = -(-spatial[i] // strides[i])
            total = max((out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial[i], 0)
            small = total // 2
            begin[i], end[i] = (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)
    elif auto_pad == "VALID":
        begin, end = [0] * nd, [0] * nd
    out = []
    for i in range(nd):
        span = (kernel[i] - 1) * dilations[i] + 1
        room = spatial[i] + begin[i] + end[i] - span
        count = (-(-room // strides[i]) if ceil_mode else room // strides[i]) + 1
        if ceil_mode and (count - 1) * strides[i] >= spatial[i] + begin[i]:
            count -= 1  # the last window must start inside the input or its leading pad
        out.append(count)
    return Geometry(strides, dilations, tuple(begin), tuple(end), tuple(out))


def padded(x: np.ndarray, begin, end, value=0.0) -> np.ndarray:
    if not any(begin) and not any(end):
        return x
    shape = x.shape[:2] + tuple(d + b + e for d, b, e in zip(x.shape[2:], begin, end))
    xp = np.full(shape, value, dtype=x.dtype)
    xp[(slice(None), slice(None)) + tuple(slice(b, b + d) for b, d in zip(begin, x.shape[2:]))] = x
    return xp


def taps(kernel, geo: Geometry):
    """For each kernel offset: its index and the strided slice of the padded input it reads."""
    for index in itertools.product(*(range(k) for k in kernel)):
        yield index, (slice(None), slice(None)) + tuple(
            slice(k * d, k * d + (o - 1) * s + 1, s) for k, d, o, s in zip(index, geo.dilations, geo.out, geo.strides))


def im2col(xp: np.ndarray, kernel, geo: Geometry) -> np.ndarray:
    """(N, C, *spatial) -> (N, C * prod(kernel), prod(out)), rows ordered (c, k1, k2, ...)."""
    nd = len(kernel)
    n, c = xp.shape[:2]
    if all(k == 1 for k in kernel) and all(s == 1 for s in geo.strides):
        return xp.reshape(n, c, -1)
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, geo.dilations)]
    windows = sliding_window_view(xp, spans, axis=tuple(range(2, 2 + nd)))
    windows = windows[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in geo.strides)
                      + tuple(slice(None, None, d) for d in geo.dilations)]
    order = (0, 1) + tuple(range(2 + nd, 2 + 2 * nd)) + tuple(range(2, 2 + nd))
    return np.ascontiguousarray(windows.transpose(order)).reshape(n, c * math.prod(kernel), -1)


def depthwise(xp: np.ndarray, w: np.ndarray, geo: Geometry) -> np.ndarray:
    """One channel per group: accumulate one strided slice per kernel tap (no loop over channels)."""
    n, c = xp.shape[:2]
    m = w.shape[0]
    if m != c:  # channel multiplier: output channel j reads input channel j // (m // c)
        xp = np.repeat(xp, m // c, axis=1)
    bcast = (1, m) + (1,) * (xp.ndim - 2)
    acc = tmp = None
    for index, window in taps(w.shape[2:], geo):
        tap = w[(slice(None), 0) + index].reshape(bcast)
        if acc is None:
            acc = np.multiply(xp[window], tap)
            tmp = np.empty_like(acc)
        else:
            acc += np.multiply(xp[window], tap, out=tmp)
    return acc


def conv_forward(x: np.ndarray, w: np.ndarray, bias, attrs, residual=None, memo: dict | None = None) -> np.ndarray:
    n, c = x.shape[:2]
    m, group = w.shape[0], attrs.get("group", 1)
    kernel = attrs.get("kernel_shape") or w.shape[2:]
    geo = geometry(x.shape[2:], kernel, attrs)
    is_depthwise = group == c == m and w.shape[1] == 1 and group > 1
    pointwise = all(k == 1 for k in kernel) and all(s == 1 for s in geo.strides) and not any(geo.pads_begin + geo.pads_end)
    if len(kernel) == 2 and all(d == 1 for d in geo.dilations) and x.dtype.kind == "f" and (
            is_depthwise or (group == 1 and not pointwise)):
        fast = phased.depthwise2d if is_depthwise else phased.dense2d
        y = fast(x, w, bias, geo.strides, geo.pads_begin, geo.pads_end, geo.out, {} if memo is None else memo)
        if residual is not None:
            y += residual
        return y
    xp = padded(x, geo.pads_begin, geo.pads_end)
    if group == c and w.shape[1] == 1 and group > 1:
        y = depthwise(xp, w, geo)
    else:
        cols = im2col(xp, kernel, geo)
        weights = w.reshape(m, -1)
        if group == 1:
            y = np.matmul(weights, cols)
        else:
            y = np.empty((n, m, cols.shape[-1]), dtype=x.dtype)
            rows, outs = cols.shape[1] // group, m // group
            for g in range(group):
                np.matmul(weights[g * outs:(g + 1) * outs], cols[:, g * rows:(g + 1) * rows],
                          out=y[:, g * outs:(g + 1) * outs])
        y = y.reshape((n, m) + geo.out)
    if bias is not None:
        y += bias.reshape((m,) + (1,) * len(geo.out))
    if residual is not None:
        y += residual
    return y


def conv(inputs, attrs, ctx):
    return [conv_forward(inputs[0], inputs[1], arg(inputs, 2), attrs, memo=ctx.memo)]


def apply_activation(y: np.ndarray, name: str | None, params) -> np.ndarray:
    """ORT's fused activations, in place: activation_params are (alpha) for LeakyRelu, (min, max) for
    Clip and (alpha, beta) for HardSigmoid."""
    if not name or name == "Identity":
        return y
    if name == "Relu":
        return np.maximum(y, 0, out=y)
    if name == "Tanh":
        return np.tanh(y, out=y)
    if name == "Sigmoid":
        y *= 0.5
        np.tanh(y, out=y)
        y *= 0.5
        y += 0.5
        return y
    if name == "LeakyRelu":
        alpha = params[0] if params else 0.01
        return np.maximum(y, y * alpha, out=y) if 0 <= alpha <= 1 else np.where(y >= 0, y, y * alpha)
    if name == "Clip":
        return np.clip(y, params[0], params[1], out=y)
    if name == "HardSigmoid":
        alpha, beta = (params or [0.2, 0.5])[:2]
        y *= alpha
        y += beta
        return np.clip(y, 0, 1, out=y)
    raise NotImplementedError(f"fused activation {name}")


def fused_conv(inputs, attrs, ctx):
    y = conv_forward(inputs[0], inputs[1], arg(inputs, 2), attrs, residual=arg(inputs, 3), memo=ctx.memo)
    return [apply_activation(y, attrs.get("activation"), attrs.get("activation_params"))]


def conv_transpose(inputs, attrs, ctx):
    x, w, bias = inputs[0], inputs[1], arg(inputs, 2)
    n, c = x.shape[:2]
    group = attrs.get("group", 1)
    outs = w.shape[1]
    kernel = tuple(attrs.get("kernel_shape") or w.shape[2:])
    nd = len(kernel)
    spatial = x.shape[2:]
    strides = attrs.get("strides") or [1] * nd
    dilations = attrs.get("dilations") or [1] * nd
    extra = attrs.get("output_padding") or [0] * nd
    full = [s * (i - 1) + e + (k - 1) * d + 1 for s, i, e, k, d in zip(strides, spatial, extra, kernel, dilations)]
    pads, target = attrs.get("pads"), attrs.get("output_shape")
    if pads is None and attrs.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        target = target or [i * s for i, s in zip(spatial, strides)]
        total = [f - t for f, t in zip(full, target)]
        upper = attrs["auto_pad"] == "SAME_UPPER"
        pads = [t // 2 if upper else t - t // 2 for t in total] + [t - t // 2 if upper else t // 2 for t in total]
    pads = pads or [0] * (2 * nd)
    target = target or [f - b - e for f, b, e in zip(full, pads[:nd], pads[nd:])]
    # GEMM: (Mg*K, Cg) @ (Cg, HW) per group, then scatter-add every tap into the output (col2im).
    cg = c // group
    weights = w.reshape(group, cg, outs * math.prod(kernel))
    cols = np.empty((n, group, outs * math.prod(kernel), math.prod(spatial)), dtype=x.dtype)
    xs = x.reshape(n, group, cg, -1)
    for g in range(group):
        np.matmul(weights[g].T, xs[:, g], out=cols[:, g])
    cols = cols.reshape((n, group * outs) + kernel + tuple(spatial))
    y = np.zeros((n, group * outs) + tuple(max(f, b + t) for f, b, t in zip(full, pads[:nd], target)), dtype=x.dtype)
    for index in itertools.product(*(range(k) for k in kernel)):
        window = (slice(None), slice(None)) + tuple(
            slice(k * d, k * d + (i - 1) * s + 1, s) for k, d, i, s in zip(index, dilations, spatial, strides))
        y[window] += cols[(slice(None), slice(None)) + index]
    y = y[(slice(None), slice(None)) + tuple(slice(b, b + t) for b, t in zip(pads[:nd], target))]
    if bias is not None:
        y = y + bias.reshape((-1,) + (1,) * nd)
    return [np.ascontiguousarray(y)]


KERNELS = {
    ("", "Conv"): conv,
    ("com.microsoft", "FusedConv"): fused_conv,
    ("", "ConvTranspose"): conv_transpose,
}
