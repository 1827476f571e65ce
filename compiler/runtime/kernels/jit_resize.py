"""Compiled (numba, see runtime/jit.py) 2-D linear / cubic Resize of the last two axes of float data.

resize.py resizes one axis at a time with np.take and a weighted sum per tap: on the upsampling in
segmentation heads and UNets that is 4-6x onnxruntime's time, mostly gathers along a middle axis.
Here each output row is built from its source rows (the height taps) into a row buffer, then each
output pixel from that buffer (the width taps): the same products and sums in the same order as
the NumPy path, one call for the whole tensor. Index and weight tables come from resize.py's axis
plans, so every coordinate mode, cubic coefficient and exclude_outside stays where it is defined.
"""

from __future__ import annotations

import numpy as np

from ..jit import jit
from .common import over_planes

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@jit
def _resize_planes(x, index_h, weight_h, index_w, weight_w, y):
    """y [P, OH, OW] from x [P, H, W]: rows through (index_h, weight_h) [OH, n], then columns
    through (index_w, weight_w) [OW, m]."""
    planes, width = x.shape[0], x.shape[2]
    out_h, out_w = y.shape[1], y.shape[2]
    taps_h, taps_w = index_h.shape[1], index_w.shape[1]
    row = np.empty(width, x.dtype)
    for p in range(planes):
        for oh in range(out_h):
            source = x[p, index_h[oh, 0]]
            weight = weight_h[oh, 0]
            for w in range(width):
                row[w] = source[w] * weight
            for t in range(1, taps_h):
                source = x[p, index_h[oh, t]]
                weight = weight_h[oh, t]
                for w in range(width):
                    row[w] += source[w] * weight
            out = y[p, oh]
            for ow in range(out_w):
                value = row[index_w[ow, 0]] * weight_w[ow, 0]
                for t in range(1, taps_w):
                    value += row[index_w[ow, t]] * weight_w[ow, t]
                out[ow] = value


def resize2d(x: np.ndarray, plan_h, plan_w) -> np.ndarray | None:
    """x (..., H, W) resized along its last two axes by the (index, weights) axis plans, or None
    where the compiled path does not apply."""
    compiled = _resize_planes.get()
    if compiled is None or x.dtype not in FLOATS or x.ndim < 2 or not x.size:
        return None
    (index_h, weight_h), (index_w, weight_w) = plan_h, plan_w
    height, width = x.shape[-2:]
    planes = np.ascontiguousarray(x).reshape(-1, height, width)
    y = np.empty((planes.shape[0], index_h.shape[0], index_w.shape[0]), x.dtype)
    args = (np.ascontiguousarray(index_h), np.ascontiguousarray(weight_h, dtype=x.dtype),
            np.ascontiguousarray(index_w), np.ascontiguousarray(weight_w, dtype=x.dtype))
    over_planes(compiled, planes, args, y, y.nbytes)
    return y.reshape(x.shape[:-2] + y.shape[1:])
