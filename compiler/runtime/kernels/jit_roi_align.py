"""Compiled (numba, see runtime/jit.py) RoiAlign for float32 features.

Two-stage detectors (torchvision's Faster / Mask / Keypoint R-CNN) pool every proposal box from the
feature maps: a hundred boxes or more, each 256 channels x 7 x 7 bins of a few bilinear samples.
The NumPy path (vision.py) loops over the boxes in Python and converts the box's whole feature map
to float64 for each one (Faster R-CNN MobileNetV3-320: 69 ms of a 115 ms run, onnxruntime 44 ms).
Here each box's sample positions and weights are computed once per bin and the channels read the
float32 map in place, the boxes shared between numba's threads where a thread-safe layer is there.

Same arithmetic as the NumPy path, in float64: the box scaled (and shifted by half a pixel in
half_pixel mode), at least 1 x 1 in output_half_pixel mode, an adaptive grid of ceil(size / bins)
samples per bin unless sampling_ratio fixes it, a sample outside [-1, size] adding zero, one
clamped into the map's last row or column reading it alone, the four corners weighted
(1 - l) / l per axis; avg divides the sum over the bin's samples by their count, max takes the
largest weighted corner; one rounding to float32. The sums' order differs from NumPy's pairwise
reduction, so a bin may differ in the last float32 bit.
"""

from __future__ import annotations

import math

import numpy as np

from ..jit import jit, prange

SPREAD_MIN_OUTPUTS = 1 << 14  # pooled values from which the boxes are shared between numba's threads


@jit
def _roi_align(x, rois, batch_index, out_h, out_w, ratio, scale, half_pixel, is_max, y):
    height, width = x.shape[2], x.shape[3]
    channels = x.shape[1]
    shift = 0.5 if half_pixel else 0.0
    for r in prange(rois.shape[0]):  # the parallel build: boxes over numba's threads
        b = batch_index[r]
        start_w = np.float64(rois[r, 0]) * scale - shift
        start_h = np.float64(rois[r, 1]) * scale - shift
        roi_w = (np.float64(rois[r, 2]) * scale - shift) - start_w
        roi_h = (np.float64(rois[r, 3]) * scale - shift) - start_h
        if not half_pixel:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        grid_h = ratio if ratio > 0 else int(math.ceil(roi_h / out_h))
        grid_w = ratio if ratio > 0 else int(math.ceil(roi_w / out_w))
        count = max(grid_h * grid_w, 1)
        samples = grid_h * grid_w
        bins = out_h * out_w
        # every bin's samples first, then the channels one plane at a time (the plane stays in cache)
        low_y, high_y = np.empty(bins * samples, np.int64), np.empty(bins * samples, np.int64)
        low_x, high_x = np.empty(bins * samples, np.int64), np.empty(bins * samples, np.int64)
        weights = np.empty((bins * samples, 4), np.float64)
        s = 0
        for ph in range(out_h):
            for pw in range(out_w):
                for iy in range(grid_h):
                    yy = start_h + (ph + (iy + 0.5) / grid_h) * roi_h / out_h
                    for ix in range(grid_w):
                        xx = start_w + (pw + (ix + 0.5) / grid_w) * roi_w / out_w
                        outside = yy < -1.0 or yy > height or xx < -1.0 or xx > width
                        sy, sx = max(yy, 0.0), max(xx, 0.0)
                        yl, xl = min(int(sy), height - 1), min(int(sx), width - 1)
                        if int(sy) >= height - 1:
                            sy = np.float64(yl)
                        if int(sx) >= width - 1:
                            sx = np.float64(xl)
                        ly, lx = sy - yl, sx - xl
                        low_y[s], high_y[s] = yl, min(yl + 1, height - 1)
                        low_x[s], high_x[s] = xl, min(xl + 1, width - 1)
                        if outside:
                            weights[s, 0] = weights[s, 1] = weights[s, 2] = weights[s, 3] = 0.0
                        else:
                            weights[s, 0], weights[s, 1] = (1.0 - ly) * (1.0 - lx), (1.0 - ly) * lx
                            weights[s, 2], weights[s, 3] = ly * (1.0 - lx), ly * lx
                        s += 1
        for c in range(channels):
            plane = x[b, c]
            for ph in range(out_h):
                for pw in range(out_w):
                    first = (ph * out_w + pw) * samples
                    best = -np.inf
                    total = 0.0
                    for s in range(first, first + samples):
                        v0 = weights[s, 0] * np.float64(plane[low_y[s], low_x[s]])
                        v1 = weights[s, 1] * np.float64(plane[low_y[s], high_x[s]])
                        v2 = weights[s, 2] * np.float64(plane[high_y[s], low_x[s]])
                        v3 = weights[s, 3] * np.float64(plane[high_y[s], high_x[s]])
                        if is_max:
                            best = max(best, max(max(v0, v1), max(v2, v3)))
                        else:
                            total += ((v0 + v1) + v2) + v3
                    if is_max and samples == 0:  # an empty box (half_pixel, zero size): 0, as onnxruntime gives
                        best = 0.0
                    y[r, c, ph, pw] = np.float32(best if is_max else total / count)


def roi_align_compiled(x, rois, batch_index, out_h: int, out_w: int, ratio: int, scale: float, half_pixel: bool,
                       is_max: bool) -> np.ndarray | None:
    """RoiAlign of x [N, C, H, W] float32, or None where the NumPy path serves (compiled kernels off,
    other dtypes, an empty map, a box whose batch index is out of range)."""
    kernel = _roi_align.get()
    if kernel is None or x.dtype != np.float32 or x.ndim != 4 or 0 in x.shape or rois.ndim != 2 or rois.shape[1] != 4:
        return None
    index = np.asarray(batch_index).astype(np.int64).reshape(-1)
    if index.shape[0] != rois.shape[0] or (index.size and (index.min() < 0 or index.max() >= x.shape[0])):
        return None
    y = np.empty((rois.shape[0], x.shape[1], out_h, out_w), np.float32)
    if rois.shape[0]:
        spread = _roi_align.get_parallel() if rois.shape[0] > 1 and y.size >= SPREAD_MIN_OUTPUTS else None
        (spread or kernel)(np.ascontiguousarray(x), np.ascontiguousarray(rois, dtype=np.float64), index, int(out_h),
                           int(out_w), int(ratio), float(scale), bool(half_pixel), bool(is_max), y)
    return y
