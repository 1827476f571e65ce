"""Spatial sampling and detection ops: GridSample, AffineGrid, RoiAlign, NonMaxSuppression (nms.py), Col2Im."""

from __future__ import annotations

import math
import itertools

import numpy as np

from . import nms
from .common import arg, ints
from .jit_grid_sample import sample_bilinear
from .jit_roi_align import roi_align_compiled


def _reflect(x, low, high):
    span = high - low
    below, above = x < low, x > high
    dx = np.where(below, low - x, x - high)
    turns = np.floor(dx / span) if span > 0 else np.zeros_like(dx)
    rest = dx - turns * span
    even = turns % 2 == 0
    inside_from_below = np.where(even, low + rest, high - rest)
    inside_from_above = np.where(even, high - rest, low + rest)
    return np.where(below, inside_from_below, np.where(above, inside_from_above, x))


def _cubic_weights(t, a=-0.75):
    t = np.abs(t)
    return [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a, ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
            ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]


def grid_sample(inputs, attrs, ctx):
    x, grid = inputs
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(attrs.get("mode", "linear"), attrs.get("mode", "linear"))
    padding, align = attrs.get("padding_mode", "zeros"), bool(attrs.get("align_corners", 0))
    if mode == "linear":  # the common case compiled (jit_grid_sample.py), same arithmetic
        compiled = sample_bilinear(x, grid, padding, align)
        if compiled is not None:
            return [compiled]
    dims = x.shape[2:]
    nd = len(dims)
    lows = [0.0 if align else -0.5] * nd
    highs = [d - 1.0 if align else d - 0.5 for d in dims]
    coords = []
    for i, d in enumerate(dims):  # grid's last axis lists coordinates innermost dim first
        n = grid[..., nd - 1 - i].astype(np.float64)
        c = (n + 1) / 2 * (d - 1) if align else ((n + 1) * d - 1) / 2
        if mode == "nearest":
            c = np.rint(c)
        # coordinates outside the borders move inside (border: except for cubic, whose taps are clamped)
        if padding == "border" and mode != "cubic":
            c = np.where((c < lows[i]) | (c > highs[i]), np.clip(c, 0, d - 1), c)
        elif padding == "reflection":
            c = _reflect(c, lows[i], highs[i])
        coords.append(c)
    # every tap of every dim gathered at once (a bicubic 2-D sample has 16 taps: one NumPy pass each
    # cost 1.9 ms on a 70-point grid); taps are trailing axes, one per dim, summed at the end
    taps = 1 if mode == "nearest" else 2 if mode == "linear" else 4
    num_out = grid.ndim - 1  # N and the output's spatial dims
    index, weight, valid = [], 1.0, True
    for i, (c, d) in enumerate(zip(coords, dims)):
        tap_shape = (1,) * (num_out + i) + (taps,) + (1,) * (nd - 1 - i)
        floor = np.floor(c)
        if mode == "nearest":
            ix, w = c.astype(np.int64)[..., None], None
        else:
            ix = (floor.astype(np.int64) - (0 if taps == 2 else 1))[..., None] + np.arange(taps)
            frac = c - floor
            w = np.stack([1 - frac, frac] if taps == 2 else _cubic_weights(frac), axis=-1)
        if padding == "zeros":
            valid = valid & ((ix >= 0) & (ix < d)).reshape(ix.shape[:num_out] + tap_shape[num_out:])
            ix = np.clip(ix, 0, d - 1)
        elif padding == "border":
            ix = np.clip(ix, 0, d - 1)
        else:
            ix = np.clip(_reflect(ix.astype(np.float64), lows[i], highs[i]).astype(np.int64), 0, d - 1)
        index.append(ix.reshape(ix.shape[:num_out] + tap_shape[num_out:]))
        if w is not None:
            weight = weight * w.reshape(w.shape[:num_out] + tap_shape[num_out:])
    batch = np.arange(x.shape[0]).reshape((-1,) + (1,) * (num_out - 1 + nd))
    values = x[(batch, slice(None)) + tuple(index)]  # (N, *out, *taps, C)
    if padding == "zeros":  # taps outside read 0 (times a NaN weight still NaN, as compiled)
        values = np.where(valid[..., None], values, 0)
    tap_axes = tuple(range(num_out, num_out + nd))
    y = np.sum(values * np.asarray(weight)[..., None], axis=tap_axes)
    return [np.moveaxis(np.asarray(y), -1, 1).astype(x.dtype)]


def affine_grid(inputs, attrs, ctx):
    theta, size = inputs[0], ints(inputs[1])
    spatial = size[2:]
    align = bool(attrs.get("align_corners", 0))
    axes = [np.linspace(-1, 1, d) if align else (np.arange(d) * 2 + 1) / d - 1 for d in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")  # outermost dim first
    homo = np.stack([m for m in mesh[::-1]] + [np.ones_like(mesh[0])], axis=-1)  # x, y[, z], 1
    grid = homo.reshape(-1, len(spatial) + 1) @ np.swapaxes(theta.astype(np.float64), 1, 2)
    return [grid.reshape((theta.shape[0],) + tuple(spatial) + (len(spatial),)).astype(theta.dtype)]


def roi_align(inputs, attrs, ctx):
    x, rois, batch_index = inputs
    out_h, out_w = attrs.get("output_height", 1), attrs.get("output_width", 1)
    ratio, scale = attrs.get("sampling_ratio", 0), attrs.get("spatial_scale", 1.0)
    # RoiAlign-10 has no such attribute and never shifts by half a pixel (torchvision's aligned=False);
    # opset 16 added it with half_pixel as the default
    default_mode = "half_pixel" if ctx.opset >= 16 else "output_half_pixel"
    half_pixel = attrs.get("coordinate_transformation_mode", default_mode) == "half_pixel"
    is_max = attrs.get("mode", "avg") == "max"
    compiled = roi_align_compiled(x, rois, batch_index, out_h, out_w, ratio, scale, half_pixel, is_max)
    if compiled is not None:  # the same arithmetic, compiled (jit_roi_align.py)
        return [compiled]
    height, width = x.shape[2:]
    y = np.zeros((rois.shape[0], x.shape[1], out_h, out_w), dtype=x.dtype)
    for r, (box, b) in enumerate(zip(rois.astype(np.float64), batch_index)):
        start_w, start_h, end_w, end_h = box * scale - (0.5 if half_pixel else 0.0)
        roi_w, roi_h = end_w - start_w, end_h - start_h
        if not half_pixel:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        grid_h = ratio if ratio > 0 else int(np.ceil(roi_h / out_h))
        grid_w = ratio if ratio > 0 else int(np.ceil(roi_w / out_w))
        if grid_h * grid_w == 0:  # an empty box (half_pixel, zero size): no samples, 0 as onnxruntime gives
            continue
        ys = start_h + (np.arange(out_h)[:, None] + (np.arange(grid_h)[None, :] + 0.5) / grid_h) * roi_h / out_h
        xs = start_w + (np.arange(out_w)[:, None] + (np.arange(grid_w)[None, :] + 0.5) / grid_w) * roi_w / out_w
        yy, xx = ys.reshape(out_h, 1, grid_h, 1), xs.reshape(1, out_w, 1, grid_w)
        outside = (yy < -1.0) | (yy > height) | (xx < -1.0) | (xx > width)
        yy, xx = np.maximum(yy, 0), np.maximum(xx, 0)
        y_low, x_low = np.minimum(yy.astype(np.int64), height - 1), np.minimum(xx.astype(np.int64), width - 1)
        yy, xx = np.where(yy.astype(np.int64) >= height - 1, y_low, yy), np.where(xx.astype(np.int64) >= width - 1, x_low, xx)
        y_high, x_high = np.minimum(y_low + 1, height - 1), np.minimum(x_low + 1, width - 1)
        ly, lx = yy - y_low, xx - x_low
        image = x[int(b)].astype(np.float64)
        parts = [(1 - ly) * (1 - lx), image[:, y_low, x_low]], [(1 - ly) * lx, image[:, y_low, x_high]], \
            [ly * (1 - lx), image[:, y_high, x_low]], [ly * lx, image[:, y_high, x_high]]
        terms = [np.where(outside, 0, w) * v for w, v in parts]  # each (C, out_h, out_w, grid_h, grid_w)
        if is_max:
            y[r] = np.max(np.maximum.reduce(terms), axis=(-2, -1))
        else:
            y[r] = np.sum(sum(terms), axis=(-2, -1)) / max(grid_h * grid_w, 1)
    return [y]


def non_max_suppression(inputs, attrs, ctx):
    boxes, scores = inputs[0], inputs[1]
    limit = int(arg(inputs, 2).reshape(-1)[0]) if arg(inputs, 2) is not None and arg(inputs, 2).size else 0
    iou_limit = float(arg(inputs, 3).reshape(-1)[0]) if arg(inputs, 3) is not None and arg(inputs, 3).size else 0.0
    floor = float(arg(inputs, 4).reshape(-1)[0]) if arg(inputs, 4) is not None and arg(inputs, 4).size else None
    return [nms.non_max_suppression(boxes, scores, limit, iou_limit, floor, bool(attrs.get("center_point_box", 0)))]


def col2im(inputs, attrs, ctx):
    x, image, block = inputs[0], ints(inputs[1]), ints(inputs[2])
    nd = len(image)
    dilations = attrs.get("dilations") or [1] * nd
    pads = attrs.get("pads") or [0] * (2 * nd)
    strides = attrs.get("strides") or [1] * nd
    n, channels = x.shape[0], x.shape[1] // math.prod(block)
    full = [i + b + e for i, b, e in zip(image, pads[:nd], pads[nd:])]
    counts = [(f - (k - 1) * d - 1) // s + 1 for f, k, d, s in zip(full, block, dilations, strides)]
    cols = x.reshape((n, channels) + tuple(block) + tuple(counts))
    y = np.zeros((n, channels) + tuple(full), dtype=x.dtype)
    for index in itertools.product(*(range(k) for k in block)):
        window = (slice(None), slice(None)) + tuple(
            slice(k * d, k * d + (c - 1) * s + 1, s) for k, d, c, s in zip(index, dilations, counts, strides))
        y[window] += cols[(slice(None), slice(None)) + index]
    return [y[(slice(None), slice(None)) + tuple(slice(b, b + i) for b, i in zip(pads[:nd], image))]]


KERNELS = {
    ("", "GridSample"): grid_sample,
    ("", "AffineGrid"): affine_grid,
    ("", "RoiAlign"): roi_align,
    ("", "NonMaxSuppression"): non_max_suppression,
    ("", "Col2Im"): col2im,
}
