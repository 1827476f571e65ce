"""Resize (all coordinate modes, nearest / linear / cubic, antialias, axes, keep_aspect_ratio_policy)
and Upsample. Separable: one gather plus a weighted sum of taps per resized axis; an integer nearest
upscale is a plain np.repeat."""

from __future__ import annotations

import numpy as np

from .common import arg, ints, norm_axis, to_compute


def _source_coords(mode, out_len, in_len, scale, roi):
    y = np.arange(out_len, dtype=np.float64)
    out_float = scale * in_len
    if mode == "align_corners":  # the output length here is the integer one (as ORT)
        return np.zeros(out_len) if out_len == 1 else y * (in_len - 1) / (out_len - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        x = np.full(out_len, (end - start) * (in_len - 1) / 2) if out_float == 1 else \
            y * (end - start) * (in_len - 1) / (out_float - 1)
        return x + start * (in_len - 1)
    if mode == "pytorch_half_pixel":
        return np.full(out_len, -0.5) if out_float == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / out_float)
        return offset + (y + 0.5) / scale - 0.5
    return (y + 0.5) / scale - 0.5  # half_pixel


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


def _resize_axis(x, axis, out_len, scale, attrs, roi):
    in_len = x.shape[axis]
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
    shape = (1,) * axis + (out_len,) + (1,) * (x.ndim - axis - 1)
    if attrs.get("mode", "nearest") == "nearest":
        pick = np.take_along_axis(index, np.argmax(weights, axis=1)[:, None], axis=1)[:, 0]
        y = np.take(x, pick, axis=axis)
    else:
        weights = weights.astype(x.dtype)
        y = None
        for tap in range(n):
            term = np.take(x, index[:, tap], axis=axis)
            term *= weights[:, tap].reshape(shape)
            y = term if y is None else np.add(y, term, out=y)
    if coord_mode == "tf_crop_and_resize":
        outside = ((coords < 0) | (coords > in_len - 1)).reshape(shape)
        y = np.where(outside, x.dtype.type(attrs.get("extrapolation_value", 0.0)), y)
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
        if full_sizes[a] == shape[a] and np.isclose(scale_of[a], 1.0) and np.allclose(full_roi.get(a, (0.0, 1.0)), (0.0, 1.0)):
            continue
        if not _is_repeat(attrs, scale_of[a], full_sizes[a], shape[a]):
            return None
        repeats[a] = int(scale_of[a])
    return repeats or None


def resize_array(x, scales, sizes, attrs, roi=None):
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
    for a in axes:
        region = full_roi.get(a, (0.0, 1.0))
        if full_sizes[a] == work.shape[a] and np.isclose(scale_of[a], 1.0) and np.allclose(region, (0.0, 1.0)):
            continue
        scale = scale_of[a]
        if _is_repeat(attrs, scale, full_sizes[a], work.shape[a]):
            work = np.repeat(work, int(scale), axis=a)
            continue
        work = _resize_axis(work, a, full_sizes[a], scale, attrs, region)
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
    return [resize_array(x, scales, sizes, attrs, roi)]


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
