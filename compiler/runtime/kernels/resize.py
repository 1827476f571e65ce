"""Resize (all coordinate modes, nearest / linear / cubic, antialias, axes, keep_aspect_ratio_policy)
and Upsample. Separable: one gather plus a weighted sum of taps per resized axis; an integer nearest
upscale is a plain np.repeat."""

from __future__ import annotations

import numpy as np

from . import bilinear
from .common import arg, ints, norm_axis, to_compute
from .jit_resize import resize2d


HALF = np.float32(0.5)


def _near(a: float, b: float) -> bool:
    """np.isclose's test on two floats, without its ~60 us of array machinery per call."""
    return abs(a - b) <= 1e-8 + 1e-5 * abs(b)


def _is_whole(region) -> bool:
    """A ROI of (0, 1) on an axis: the whole axis."""
    return _near(float(region[0]), 0.0) and _near(float(region[1]), 1.0)


def _source_coords(mode, out_len, in_len, scale, roi):
    """The source coordinate of each output position, in float32 as onnxruntime computes it: a nearest
    pick on a coordinate that is an integer in exact arithmetic (10 -> 14, output row 10: 7.0) lands
    on either side of it by rounding, and float64 took the row below where onnxruntime takes 7
    (fuzz_graphs seed 3112)."""
    return _source_coords_f32(mode, out_len, in_len, np.float32(scale), roi).astype(np.float64)


def _source_coords_f32(mode, out_len, in_len, scale, roi):
    y = np.arange(out_len, dtype=np.float32)
    in_len = np.float32(in_len)
    out_float = scale * in_len
    if mode == "align_corners":  # the output length here is the integer one (as ORT)
        return np.zeros(out_len, np.float32) if out_len == 1 else y * (in_len - 1) / np.float32(out_len - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_crop_and_resize":
        start, end = np.float32(roi[0]), np.float32(roi[1])
        x = np.full(out_len, (end - start) * (in_len - 1) / 2, np.float32) if out_float == 1 else \
            y * (end - start) * (in_len - 1) / (out_float - 1)
        return x + start * (in_len - 1)
    if mode == "pytorch_half_pixel":
        return np.full(out_len, -0.5, np.float32) if out_float == 1 else (y + HALF) / scale - HALF
    if mode == "tf_half_pixel_for_nn":  # TF's nearest with half-pixel centers (tf2onnx writes it at any opset)
        return (y + HALF) / scale
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - np.float32(out_len) / out_float)
        return offset + (y + HALF) / scale - HALF
    return (y + HALF) / scale - HALF  # half_pixel


def _cubic(t, a):
    t = np.abs(t)
    return np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                    np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))


def _taps(ratio, scale, attrs):
    """Per output position: weights of the taps around it, (out, n). ratio in (0, 1]."""
    mode = attrs.get("mode", "nearest")
    if mode == "nearest":
        rule = attrs.get("nearest_mode", "round_prefer_floor")
        upper = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                 "floor": np.zeros_like(ratio, bool), "ceil": np.ones_like(ratio, bool)}[rule]
        upper = np.where(ratio == 1, True, upper)
        return np.stack([~upper, upper], axis=1).astype(np.float64)
    antialias = attrs.get("antialias", 0) and scale < 1
    a = attrs.get("cubic_coeff_a", -0.75)
    if not antialias:
        if mode == "linear":
            return np.stack([1 - ratio, ratio], axis=1)
        return _cubic(np.stack([ratio + 1, ratio, 1 - ratio, 2 - ratio], axis=1), a)
    support = 1 if mode == "linear" else 2
    start = int(np.floor(-support / scale) + 1)
    offsets = np.arange(start, 2 - start)
    args = (offsets[None, :] - ratio[:, None]) * scale
    weights = np.clip(1 - np.abs(args), 0, 1) if mode == "linear" else _cubic(args, a)
    return weights / weights.sum(axis=1, keepdims=True)


_PLAN_KEYS = ("mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a", "antialias", "exclude_outside")


def _axis_plan(in_len: int, out_len: int, scale: float, attrs, roi, plans: dict | None):
    """(index [out, n] of the source taps, their weights, the outside-the-ROI mask or None) for one
    axis: a function of the lengths, scale, ROI and mode alone, so kept in the step's memo (the
    coordinate arithmetic costs more than the gathers on the small maps of decoder heads)."""
    key = (in_len, out_len, scale, tuple(roi), tuple(attrs.get(k) for k in _PLAN_KEYS))
    plan = plans.get(key) if plans is not None else None
    if plan is None:
        plan = _compute_axis_plan(in_len, out_len, scale, attrs, roi)
        if plans is not None:
            if len(plans) > 32:
                plans.clear()
            plans[key] = plan
    return plan


def _compute_axis_plan(in_len, out_len, scale, attrs, roi):
    coord_mode = attrs.get("coordinate_transformation_mode", "half_pixel")
    coords = _source_coords(coord_mode, out_len, in_len, scale, roi)
    floor = np.floor(coords)
    ratio = np.where(coords == floor, 1.0, coords - floor)
    weights = _taps(ratio, scale, attrs)
    n = weights.shape[1]
    # the n taps nearest the source coordinate, ties to the smaller index (as the ONNX reference)
    padded = coords + (n + 1) // 2
    base = np.floor(padded)
    frac = padded - base
    if n % 2 == 0:
        first = base + np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        first = base + np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    index = first.astype(np.int64)[:, None] + np.arange(n)[None, :] - (n + 1) // 2
    if attrs.get("exclude_outside", 0):
        weights = np.where((index < 0) | (index >= in_len), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    index = np.clip(index, 0, in_len - 1)
    if attrs.get("mode", "nearest") == "nearest":
        index = np.take_along_axis(index, np.argmax(weights, axis=1)[:, None], axis=1)
        weights = None
    outside = (coords < 0) | (coords > in_len - 1) if coord_mode == "tf_crop_and_resize" else None
    return index, weights, outside


def _resize_axis(x, axis, out_len, scale, attrs, roi, plans=None):
    index, weights, outside = _axis_plan(x.shape[axis], out_len, scale, attrs, roi, plans)
    shape = (1,) * axis + (out_len,) + (1,) * (x.ndim - axis - 1)
    if weights is None:  # nearest
        y = np.take(x, index[:, 0], axis=axis)
    else:
        weights = weights.astype(x.dtype)
        y = None
        for tap in range(index.shape[1]):
            term = np.take(x, index[:, tap], axis=axis)
            term *= weights[:, tap].reshape(shape)
            y = term if y is None else np.add(y, term, out=y)
    if outside is not None:
        y = np.where(outside.reshape(shape), x.dtype.type(attrs.get("extrapolation_value", 0.0)), y)
    return y


def _is_repeat(attrs, scale, out_len, in_len) -> bool:
    """Integer nearest upscales that pick source index y // scale: exactly np.repeat."""
    if attrs.get("mode", "nearest") != "nearest" or scale != int(scale) or out_len != in_len * scale:
        return False
    coord, rule = attrs.get("coordinate_transformation_mode", "half_pixel"), attrs.get("nearest_mode", "round_prefer_floor")
    if coord in ("half_pixel", "pytorch_half_pixel"):  # offsets stay strictly inside (-0.5, 0.5)
        return rule in ("round_prefer_floor", "round_prefer_ceil") and out_len > 1
    return coord == "asymmetric" and (rule == "floor" or (scale == 2 and rule == "round_prefer_floor"))


def _repeats(attrs, axes, scale_of, full_sizes, shape, full_roi) -> dict | None:
    """axis -> factor when every axis that changes is an integer nearest upscale (np.repeat)."""
    repeats = {}
    for a in axes:
        if full_sizes[a] == shape[a] and _near(scale_of[a], 1.0) and _is_whole(full_roi.get(a, (0.0, 1.0))):
            continue
        if not _is_repeat(attrs, scale_of[a], full_sizes[a], shape[a]):
            return None
        repeats[a] = int(scale_of[a])
    return repeats or None


def _changes(a, work_shape, full_sizes, scale_of, full_roi) -> bool:
    region = full_roi.get(a, (0.0, 1.0))
    return not (full_sizes[a] == work_shape[a] and _near(scale_of[a], 1.0) and _is_whole(region))


def _resize_last_two_compiled(work, axes, full_sizes, scale_of, full_roi, attrs, plans, result: list) -> list:
    """Linear or cubic resizes of exactly the last two axes run as one compiled call (jit_resize.py,
    appended to `result`); returns the axes still to resize one at a time."""
    rank = work.ndim
    changing = [a for a in axes if _changes(a, work.shape, full_sizes, scale_of, full_roi)]
    if attrs.get("mode", "nearest") == "nearest" or changing != [rank - 2, rank - 1] or \
            attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        return axes
    plan_h, plan_w = (_axis_plan(work.shape[a], full_sizes[a], scale_of[a], attrs, full_roi.get(a, (0.0, 1.0)), plans)
                      for a in changing)
    resized = resize2d(work, plan_h[:2], plan_w[:2])
    if resized is None:
        return axes
    result.append(resized)
    return []


def resize_array(x, scales, sizes, attrs, roi=None, plans: dict | None = None):
    rank = x.ndim
    axes = [norm_axis(a, rank) for a in attrs.get("axes") or range(rank)]
    if sizes is not None:
        full_sizes = list(x.shape)
        for a, s in zip(axes, sizes):
            full_sizes[a] = int(s)
        scale_of = {a: full_sizes[a] / x.shape[a] for a in axes}
        policy = attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            common = pick(scale_of.values())
            scale_of = {a: common for a in axes}
            full_sizes = [int(common * x.shape[a] + 0.5) if a in axes else x.shape[a] for a in range(rank)]
    else:
        scale_of = {a: float(s) for a, s in zip(axes, scales)}
        full_sizes = [int(x.shape[a] * scale_of[a]) if a in scale_of else x.shape[a] for a in range(rank)]
    full_roi = {a: (roi[i], roi[i + len(axes)]) for i, a in enumerate(axes)} if roi is not None and len(roi) else {}
    work = to_compute(x) if x.dtype.kind == "f" else x.astype(np.float32)
    hw = bilinear.layout(attrs, rank, scale_of)
    if hw is not None and x.dtype.kind in "iu" and hw != (2, 3):
        hw = None  # onnxruntime's 8-bit NHWC bilinear is fixed-point: the float taps below are as near
    if hw is not None:
        work = bilinear.resize_bilinear(work, hw, (full_sizes[hw[0]], full_sizes[hw[1]]),
                                        (scale_of.get(hw[0], 1.0), scale_of.get(hw[1], 1.0)),
                                        attrs.get("coordinate_transformation_mode", "half_pixel"), plans)
        axes = []
    repeats = _repeats(attrs, axes, scale_of, full_sizes, work.shape, full_roi)
    if repeats and rank - 1 in repeats:  # the last axis: np.repeat (a broadcast copy would move 4-byte runs)
        work = np.repeat(work, repeats.pop(rank - 1), axis=rank - 1)
    if repeats:  # integer nearest upscales on the other axes: one broadcasting copy of whole rows
        spread = tuple(d for a in range(rank) for d in ((work.shape[a], repeats[a]) if a in repeats else (work.shape[a],)))
        index = tuple(i for a in range(rank) for i in ((slice(None), None) if a in repeats else (slice(None),)))
        y = np.empty(spread, dtype=work.dtype)
        np.copyto(y, work[index])
        work = y.reshape(full_sizes)
    if repeats is not None:
        axes = []
    axes = _resize_last_two_compiled(work, axes, full_sizes, scale_of, full_roi, attrs, plans, result := [])
    if result:
        work = result[0]
    for a in axes:
        region = full_roi.get(a, (0.0, 1.0))
        if full_sizes[a] == work.shape[a] and _near(scale_of[a], 1.0) and _is_whole(region):
            continue
        scale = scale_of[a]
        if _is_repeat(attrs, scale, full_sizes[a], work.shape[a]):
            work = np.repeat(work, int(scale), axis=a)
            continue
        work = _resize_axis(work, a, full_sizes[a], scale, attrs, region, plans)
    if x.dtype.kind in "iu":  # ORT casts the float result (truncation), after clamping to the range
        info = np.iinfo(x.dtype)
        return np.clip(work, info.min, info.max).astype(x.dtype)
    return work.astype(x.dtype, copy=False)


def resize(inputs, attrs, ctx):
    x = inputs[0]
    if ctx.opset < 11 and len(inputs) == 2:  # Resize-10: (X, scales), asymmetric coordinates
        attrs = {**attrs, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
        return [resize_array(x, inputs[1].tolist(), None, attrs)]
    roi, scales, sizes = arg(inputs, 1), arg(inputs, 2), arg(inputs, 3)
    scales = scales.tolist() if scales is not None and scales.size else None
    sizes = ints(sizes) if sizes is not None and sizes.size else None
    roi = roi.astype(np.float64).tolist() if roi is not None and roi.size else None
    return [resize_array(x, scales, sizes, attrs, roi, ctx.memo.setdefault("resize-plans", {}))]


def upsample(inputs, attrs, ctx):
    scales = arg(inputs, 1)
    scales = scales.tolist() if scales is not None else attrs["scales"]
    mode = attrs.get("mode", "nearest")
    attrs = {"mode": mode, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    return [resize_array(inputs[0], scales, None, attrs)]


KERNELS = {
    ("", "Resize"): resize,
    ("", "Upsample"): upsample,
}
