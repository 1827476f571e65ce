"""Compiled (numba, see runtime/jit.py) 2-D MaxPool / AveragePool for float32 and float64.

The NumPy path (pool.py) pads a copy of the input and makes one whole-tensor pass per kernel tap;
on a ResNet stem's 3x3 stride-2 max pool that is 7-13x onnxruntime's time. Here each output row is
built from the input rows its window covers, one tap column at a time over the output positions
whose input column is inside the image, so padding is never materialized: a max skips it, an
average counts it only where count_include_pad says (explicit pads yes, the ceil_mode overhang no).

The max keeps onnxruntime's (MLAS's maxps) NaN rule: a NaN tap makes the result NaN until a later
tap replaces it. Planes are split between the caller and the helper thread when the input is large.
"""

from __future__ import annotations

import numpy as np

from ..jit import jit
from .common import over_planes

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@jit
def _pool_planes(x, kernel, strides, dilations, pads_begin, count_low, count_high, is_max, y):
    """y [P, OH, OW] = the pool of x [P, H, W]; count_low/high: per axis, the input range whose
    positions an average counts (the explicit pads included or not)."""
    planes, height, width = x.shape
    out_h, out_w = y.shape[1], y.shape[2]
    kh, kw = kernel[0], kernel[1]
    sh, sw = strides[0], strides[1]
    dh, dw = dilations[0], dilations[1]
    ph, pw = pads_begin[0], pads_begin[1]
    t = x.dtype.type
    # per tap column: the output columns whose input column lies in [0, width), and per output
    # column the taps an average counts; integer divisions hoisted out of the loops (on maps of a
    # few dozen columns they cost more than the additions)
    first_tap = max(0, -((pw - (out_w - 1) * sw) // -dw))
    last_tap = min(kw, (width - 1 + pw) // dw + 1)
    lo, hi = np.zeros(kw, np.int64), np.zeros(kw, np.int64)
    for j in range(first_tap, last_tap):
        offset = j * dw - pw
        lo[j] = 0 if offset >= 0 else (-offset + sw - 1) // sw
        hi[j] = min(out_w, (width - 1 - offset) // sw + 1) if width - 1 - offset >= 0 else 0
    cols = np.empty(out_w, np.int64)
    for ow in range(out_w):
        left = ow * sw - pw
        cols[ow] = max(0, min(kw - 1, (count_high[1] - 1 - left) // dw) - max(0, -((left - count_low[1]) // dw)) + 1)
    start = t(-np.inf) if is_max else t(0)
    for oh in range(out_h):
        top = oh * sh - ph
        # only the taps inside the image: a window far larger than the image (EfficientNet's
        # AvgPool(1280, ceil_mode) over 7x7) must not cost a loop over all of its taps
        first_row, last_row = max(0, -(top // dh)), min(kh, (height - 1 - top) // dh + 1)
        rows = max(0, min(kh - 1, (count_high[0] - 1 - top) // dh) - max(0, -((top - count_low[0]) // dh)) + 1)
        for p in range(planes):
            out = y[p, oh]
            for ow in range(out_w):
                out[ow] = start
            for i in range(first_row, last_row):
                row = x[p, top + i * dh]
                for j in range(first_tap, last_tap):
                    offset = j * dw - pw
                    # unit stride spelled out: a stride known to be 1 lets LLVM vectorize the loop
                    if is_max and sw == 1:  # a select, not a branch: random data mispredicts a branch half the time
                        for ow in range(lo[j], hi[j]):
                            v = row[offset + ow]
                            o = out[ow]
                            out[ow] = o if o >= v else v  # noqa: FURB136 - numba compiles max() slower
                    elif is_max:
                        for ow in range(lo[j], hi[j]):
                            v = row[offset + ow * sw]
                            o = out[ow]
                            out[ow] = o if o >= v else v  # noqa: FURB136
                    elif sw == 1:
                        for ow in range(lo[j], hi[j]):
                            out[ow] += row[offset + ow]
                    else:
                        for ow in range(lo[j], hi[j]):
                            out[ow] += row[offset + ow * sw]
            if not is_max:  # divided by the taps counted (explicit pads with count_include_pad)
                for ow in range(out_w):
                    count = rows * cols[ow]
                    out[ow] = out[ow] / t(count) if count else t(0)


def pool2d(x: np.ndarray, kernel, geo, is_max: bool, count_include_pad: bool = False) -> np.ndarray | None:
    """The 2-D pool of x (N, C, H, W) with the geometry of conv.geometry, or None where the compiled
    path does not apply (the caller takes the NumPy path)."""
    compiled = _pool_planes.get()
    if compiled is None or x.ndim != 4 or x.dtype not in FLOATS or not x.size or not all(geo.out):
        return None
    n, c, height, width = x.shape
    planes = np.ascontiguousarray(x).reshape(n * c, height, width)
    y = np.empty((n * c,) + tuple(geo.out), dtype=x.dtype)
    spatial = (height, width)
    if count_include_pad:
        low = np.array([-b for b in geo.pads_begin], np.int64)
        high = np.array([s + e for s, e in zip(spatial, geo.pads_end)], np.int64)
    else:
        low, high = np.zeros(2, np.int64), np.array(spatial, np.int64)
    args = (np.array(kernel, np.int64), np.array(geo.strides, np.int64), np.array(geo.dilations, np.int64),
            np.array(geo.pads_begin, np.int64), low, high, is_max)
    over_planes(compiled, planes, args, y, x.nbytes)
    return y.reshape((n, c) + tuple(geo.out))
