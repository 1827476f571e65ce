"""Pooling: MaxPool (with Indices), AveragePool, LpPool, the Global* forms and MaxUnpool.

Windows are reduced one kernel tap at a time over strided views of the padded input, so the work is
a handful of whole-tensor NumPy passes whatever the channel count (2-D float pools run compiled
instead where numba is there: jit_pool.py). Where the kernel has more taps than
the output has positions (a 7x7 average at the end of a CNN, a window as large as the image with
ceil_mode), each output window is reduced directly instead, clipped to the input: the tap loop would
make one pass per tap and pad the input out to the whole window."""

from __future__ import annotations

import itertools
import math

import numpy as np

from .common import arg, ints
from .conv import geometry, padded, taps
from .jit_pool import pool2d


def _window_geometry(x, attrs):
    kernel = attrs["kernel_shape"]
    geo = geometry(x.shape[2:], kernel, attrs, ceil_mode=bool(attrs.get("ceil_mode", 0)))
    # ceil_mode windows may run past the explicit pads: pad the end further (never counted).
    need = [(o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip(geo.out, geo.strides, kernel, geo.dilations)]
    extra = [max(n - (i + b + e), 0) for n, i, b, e in zip(need, x.shape[2:], geo.pads_begin, geo.pads_end)]
    return kernel, geo, [e + x_ for e, x_ in zip(geo.pads_end, extra)]


def _prefers_windows(kernel, geo) -> bool:
    return all(d == 1 for d in geo.dilations) and math.prod(geo.out) < math.prod(kernel)


def _windows(x, kernel, geo):
    """Per output position: its index, the window's slice of the (unpadded) input and the window's
    extent inside the explicit pads (the ceil_mode overhang excluded), for count_include_pad."""
    spatial = x.shape[2:]
    for position in itertools.product(*(range(n) for n in geo.out)):
        starts = [o * s - b for o, s, b in zip(position, geo.strides, geo.pads_begin)]
        window = tuple(slice(max(a, 0), max(min(a + k, n), 0)) for a, k, n in zip(starts, kernel, spatial))
        padded_extent = math.prod(min(a + k, n + e) - max(a, -b) for a, k, n, b, e in
                                  zip(starts, kernel, spatial, geo.pads_begin, geo.pads_end))
        yield (Ellipsis,) + position, (slice(None), slice(None)) + window, padded_extent


def _reduce_windows(x, kernel, geo, reduce, empty):
    axes = tuple(range(2, x.ndim))
    y = np.empty(x.shape[:2] + tuple(geo.out), dtype=x.dtype)
    for at, window, _ in _windows(x, kernel, geo):
        part = x[window]
        y[at] = reduce(part, axis=axes) if part.size else empty
    return y


def max_pool(inputs, attrs, ctx):
    x = inputs[0]
    kernel, geo, end = _window_geometry(x, attrs)
    compiled = pool2d(x, kernel, geo, is_max=True) if len(ctx.out) < 2 else None
    if compiled is not None:
        return [compiled]
    if len(ctx.out) < 2 and _prefers_windows(kernel, geo):
        return [_reduce_windows(x, kernel, geo, np.max, -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min)]
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    xp = padded(x, geo.pads_begin, end, low)
    y = None
    for _, window in taps(kernel, geo):
        y = xp[window].copy() if y is None else np.maximum(y, xp[window], out=y)
    if len(ctx.out) < 2:
        return [y]
    return [y, _max_indices(x, xp, y, kernel, geo, attrs.get("storage_order", 0))]


def _max_indices(x, xp, y, kernel, geo, storage_order):
    # Flat index (into the unpadded input) of the first tap reaching the maximum.
    nd = len(kernel)
    spatial = x.shape[2:]
    index = np.full(y.shape, -1, dtype=np.int64)
    grids = np.meshgrid(*(np.arange(o) * s for o, s in zip(geo.out, geo.strides)), indexing="ij")
    strides_c = np.cumprod((1,) + tuple(spatial[::-1]))[::-1][1:] if not storage_order else \
        np.cumprod((1,) + tuple(spatial))[:-1]
    for tap, window in taps(kernel, geo):
        hit = (xp[window] == y) & (index < 0)
        flat = 0
        for axis in range(nd):
            flat = flat + (grids[axis] + tap[axis] * geo.dilations[axis] - geo.pads_begin[axis]) * strides_c[axis]
        index = np.where(hit, flat, index)
    base = (np.arange(x.shape[0])[:, None] * x.shape[1] + np.arange(x.shape[1])) * math.prod(spatial)
    return index + base.reshape(x.shape[:2] + (1,) * nd)


def average_pool(inputs, attrs, ctx):
    x = inputs[0]
    kernel, geo, end = _window_geometry(x, attrs)
    compiled = pool2d(x, kernel, geo, is_max=False, count_include_pad=bool(attrs.get("count_include_pad", 0)))
    if compiled is not None:
        return [compiled]
    if _prefers_windows(kernel, geo):
        return [_average_windows(x, kernel, geo, bool(attrs.get("count_include_pad", 0)))]
    xp = padded(x, geo.pads_begin, end)
    total = None
    for _, window in taps(kernel, geo):
        total = xp[window].copy() if total is None else np.add(total, xp[window], out=total)
    if attrs.get("count_include_pad", 0):  # explicit pads count, the ceil_mode overhang does not
        inside = tuple(d + b + e for d, b, e in zip(x.shape[2:], geo.pads_begin, geo.pads_end))
        ones = padded(np.ones((1, 1) + inside, x.dtype), (0,) * len(kernel),
                      [e - pe for e, pe in zip(end, geo.pads_end)], 0.0)
    else:
        ones = padded(np.ones((1, 1) + x.shape[2:], x.dtype), geo.pads_begin, end, 0.0)
    count = None
    for _, window in taps(kernel, geo):
        count = ones[window].copy() if count is None else count + ones[window]
    total /= count
    return [total]


def _average_windows(x, kernel, geo, count_include_pad: bool) -> np.ndarray:
    axes = tuple(range(2, x.ndim))
    y = np.empty(x.shape[:2] + tuple(geo.out), dtype=x.dtype)
    for at, window, padded_extent in _windows(x, kernel, geo):
        part = x[window]
        count = padded_extent if count_include_pad else math.prod(w.stop - w.start for w in window[2:])
        y[at] = np.sum(part, axis=axes) / count if count else 0.0
    return y


def lp_pool(inputs, attrs, ctx):
    x = inputs[0]
    p = attrs.get("p", 2)
    kernel, geo, end = _window_geometry(x, attrs)
    xp = np.abs(padded(x, geo.pads_begin, end)) ** p
    total = None
    for _, window in taps(kernel, geo):
        total = xp[window].copy() if total is None else np.add(total, xp[window], out=total)
    return [(total ** (1.0 / p)).astype(x.dtype, copy=False)]


def _global(reducer):
    def kernel(inputs, attrs, ctx):
        x = inputs[0]
        # one contiguous last axis: NumPy sums it pairwise (float32 accuracy over large images)
        flat = np.ascontiguousarray(x).reshape(x.shape[:2] + (-1,))
        return [reducer(flat, -1).reshape(x.shape[:2] + (1,) * (x.ndim - 2)).astype(x.dtype, copy=False)]
    return kernel


BLAS_MEAN_MAX_LEN = 1 << 14  # longer rows: NumPy's pairwise sum (BLAS accumulates each lane sequentially)


def _mean_last(x: np.ndarray) -> np.ndarray:
    """Row means of contiguous (N, C, L) data; float32/float64 rows up to BLAS_MEAN_MAX_LEN as one
    BLAS matrix-vector product (np.mean reduces each short row separately, an order of magnitude
    slower on N*C short rows)."""
    if x.dtype not in (np.float32, np.float64) or not x.size or x.shape[-1] > BLAS_MEAN_MAX_LEN:
        return np.mean(x, axis=-1, dtype=x.dtype)
    sums = np.matmul(x, np.ones(x.shape[-1], dtype=x.dtype))
    sums *= x.dtype.type(1 / x.shape[-1])
    return sums


def _global_lp(x, axis, p=2):
    return np.sum(np.abs(x) ** p, axis=axis) ** (1.0 / p)


def max_unpool(inputs, attrs, ctx):
    x, indices, shape = inputs[0], inputs[1], arg(inputs, 2)
    kernel = attrs["kernel_shape"]
    nd = len(kernel)
    strides = attrs.get("strides") or [1] * nd
    pads = attrs.get("pads") or [0] * (2 * nd)
    inferred = list(x.shape[:2]) + [(i - 1) * s + k - b - e for i, s, k, b, e in
                                    zip(x.shape[2:], strides, kernel, pads[:nd], pads[nd:])]
    y = np.zeros(math.prod(inferred), dtype=x.dtype)
    y[indices.ravel()] = x.ravel()
    y = y.reshape(inferred)
    if shape is None or ints(shape) == inferred:
        return [y]
    # Indices address the inferred shape; a larger output_shape pads at the end.
    out = np.zeros(ints(shape), dtype=x.dtype)
    out[tuple(slice(0, d) for d in inferred)] = y
    return [out]


KERNELS = {
    ("", "MaxPool"): max_pool,
    ("", "AveragePool"): average_pool,
    ("", "LpPool"): lp_pool,
    ("", "GlobalAveragePool"): _global(lambda x, axis: _mean_last(x)),
    ("", "GlobalMaxPool"): _global(lambda x, axis: np.max(x, axis=axis)),
    ("", "GlobalLpPool"): lambda inputs, attrs, ctx: _global(lambda x, a: _global_lp(x, a, attrs.get("p", 2)))(
        inputs, attrs, ctx),
    ("", "MaxUnpool"): max_unpool,
}
