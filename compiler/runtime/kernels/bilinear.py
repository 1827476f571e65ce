"""2-D linear Resize in onnxruntime's own arithmetic (its UpsampleBilinear / NhwcUpsampleBilinear).

resize.py's separable taps (rows, then columns, weights 1 - r and r from float64 coordinates) give
the same value to within an ulp or two, but not the same bits. After a quantized model's
DequantizeLinear, bilinear weights of 1/4 and 3/4 land many outputs exactly on a rounding tie of
the QuantizeLinear that follows, so those ulps flip a quantum: tf2onnx's int8 TFLite upsampling
heads differed from onnxruntime in 1-2% of their outputs (one quantum each, 7.5e-3 of the mask's
range at the end). So for the layouts onnxruntime itself runs as bilinear (rank 2; rank 4 whose
two outer, or outer and inner, scales are 1) this file reproduces it step by step, in float32:

    in = clamp(coordinate(out), 0, len - 1)     coordinate in float32, the mode's formula
    i1 = int(in), i2 = min(i1 + 1, len - 1)     d1 = |in - i1|, d2 = |in - i2| (0.5, 0.5 if i1 == i2)
    y  = (dx2*dy2)*X[i1,j1] + (dx1*dy2)*X[i1,j2] + (dx2*dy1)*X[i2,j1] + (dx1*dy1)*X[i2,j2]

summed left to right, without fused multiply-adds, in the compiled kernel and the NumPy path alike.
"""

from __future__ import annotations

import numpy as np

from ..jit import jit
from .common import over_planes

F32 = np.float32
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
# tf_crop_and_resize extrapolates outside its ROI, and half_pixel_symmetric's coordinates here were
# still an ulp off onnxruntime's at fractional scales: resize.py keeps both
MODES = ("half_pixel", "asymmetric", "pytorch_half_pixel", "align_corners", "tf_half_pixel_for_nn")


def _coordinates(mode: str, out_len: int, in_len: int, scale: float) -> np.ndarray:
    """Source coordinate of every output position, in float32 operations as onnxruntime's
    get_original_coordinate lambdas (each step rounds to float32)."""
    y = np.arange(out_len, dtype=F32)
    s, n_out, n_in = F32(scale), F32(out_len), F32(in_len)
    if scale == 1:  # onnxruntime takes the output index itself on an unscaled axis
        return y
    if mode == "asymmetric":
        return y / s
    if mode == "align_corners":
        return np.zeros(out_len, F32) if out_len == 1 else y * (n_in - F32(1)) / (n_out - F32(1))
    if mode == "pytorch_half_pixel" and out_len <= 1:
        return np.zeros(out_len, F32)
    if mode == "tf_half_pixel_for_nn":
        return (y + F32(0.5)) / s
    return (y + F32(0.5)) / s - F32(0.5)  # half_pixel, pytorch_half_pixel


def axis_table(mode: str, out_len: int, in_len: int, scale: float, memo: dict | None = None):
    """(i1, i2, d1, d2) for one axis: the two source indices and onnxruntime's weights
    (d2 weighs i1, d1 weighs i2); kept in `memo` (the step's), as resize.py keeps its axis plans."""
    key = ("bilinear", mode, out_len, in_len, scale)
    table = memo.get(key) if memo is not None else None
    if table is None:
        table = _axis_table(mode, out_len, in_len, scale)
        if memo is not None:
            if len(memo) > 32:
                memo.clear()
            memo[key] = table
    return table


def _axis_table(mode: str, out_len: int, in_len: int, scale: float):
    coords = np.clip(_coordinates(mode, out_len, in_len, scale), F32(0), F32(in_len - 1))
    i1 = np.minimum(coords.astype(np.int64), in_len - 1)
    i2 = np.minimum(i1 + 1, in_len - 1)
    d1 = np.abs(coords - i1.astype(F32))
    d2 = np.abs(coords - i2.astype(F32))
    same = i1 == i2
    d1[same] = F32(0.5)
    d2[same] = F32(0.5)
    return i1, i2, d1, d2


def layout(attrs, rank: int, scale_of: dict) -> tuple[int, int] | None:
    """(height axis, width axis) where onnxruntime runs this resize as its bilinear kernel, else None."""
    if attrs.get("mode") != "linear" or attrs.get("antialias", 0) or attrs.get("exclude_outside", 0):
        return None
    if attrs.get("coordinate_transformation_mode", "half_pixel") not in MODES:
        return None
    scales = [scale_of.get(a, 1.0) for a in range(rank)]
    if all(s == 1 for s in scales):  # nothing to resize: resize.py passes the input through, as onnxruntime
        return None
    if rank == 2:
        return 0, 1
    if rank == 4 and scales[0] == 1 and scales[1] == 1:
        return 2, 3
    if rank == 4 and scales[0] == 1 and scales[3] == 1:
        return 1, 2
    return None


@jit(fastmath=set())
def _bilinear(x, h1, h2, dh1, dh2, w1, w2, dw1, dw2, y):
    """y [P, OH, OW, C] from x [P, H, W, C] in onnxruntime's order (module docstring); weights are
    float32 products, as onnxruntime forms them before multiplying the pixel."""
    planes, channels = x.shape[0], x.shape[3]
    out_h, out_w = y.shape[1], y.shape[2]
    for p in range(planes):
        for oh in range(out_h):
            top, bottom = x[p, h1[oh]], x[p, h2[oh]]
            for ow in range(out_w):
                w11 = dw2[ow] * dh2[oh]
                w21 = dw1[ow] * dh2[oh]
                w12 = dw2[ow] * dh1[oh]
                w22 = dw1[ow] * dh1[oh]
                left, right = w1[ow], w2[ow]
                if channels == 1:  # NCHW planes: no inner loop to set up per pixel
                    y[p, oh, ow, 0] = (w11 * top[left, 0] + w21 * top[right, 0]
                                       + w12 * bottom[left, 0] + w22 * bottom[right, 0])
                    continue
                for c in range(channels):
                    y[p, oh, ow, c] = (w11 * top[left, c] + w21 * top[right, c]
                                       + w12 * bottom[left, c] + w22 * bottom[right, c])


def _bilinear_numpy(x, h1, h2, dh1, dh2, w1, w2, dw1, dw2):
    top, bottom = x[:, h1], x[:, h2]
    dtype = x.dtype

    def weight(dw, dh):
        return (dw[None, :] * dh[:, None]).astype(dtype)[None, :, :, None]

    y = top[:, :, w1] * weight(dw2, dh2)
    y += top[:, :, w2] * weight(dw1, dh2)
    y += bottom[:, :, w1] * weight(dw2, dh1)
    y += bottom[:, :, w2] * weight(dw1, dh1)
    return y


def resize_bilinear(x: np.ndarray, axes: tuple[int, int], out_hw: tuple[int, int], scales: tuple[float, float],
                    mode: str, memo: dict | None = None) -> np.ndarray:
    """x (float) resized on `axes` (adjacent: (0, 1), (2, 3) or (1, 2)) to out_hw, as onnxruntime."""
    ha, wa = axes
    height, width = x.shape[ha], x.shape[wa]
    planes = int(np.prod(x.shape[:ha], dtype=np.int64))
    channels = int(np.prod(x.shape[wa + 1:], dtype=np.int64))
    x4 = np.ascontiguousarray(x).reshape(planes, height, width, channels)
    h1, h2, dh1, dh2 = axis_table(mode, out_hw[0], height, scales[0], memo)
    w1, w2, dw1, dw2 = axis_table(mode, out_hw[1], width, scales[1], memo)
    compiled = _bilinear.get() if x.dtype in FLOATS and x.size else None
    if compiled is None:
        y = _bilinear_numpy(x4, h1, h2, dh1, dh2, w1, w2, dw1, dw2)
    else:
        y = np.empty((planes, out_hw[0], out_hw[1], channels), x.dtype)
        over_planes(compiled, x4, (h1, h2, dh1, dh2, w1, w2, dw1, dw2), y, y.nbytes)
    return y.reshape(x.shape[:ha] + tuple(out_hw) + x.shape[wa + 1:])
