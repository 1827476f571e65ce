"""Device AveragePool, Resize and reductions over an array module, with the CPU kernels' semantics.

Both spatial ops split the work the same way: what depends only on shapes and attributes (window
counts, interpolation taps) is computed once on the host with the CPU runtime's own code and kept on
the device per input shape; the device does the data-sized arithmetic.

Resize is separable and linear along each axis: the CPU kernel applied to an identity matrix along
one axis gives that axis's interpolation matrix R (out, in), so every mode, coordinate transform,
antialias filter and tap rule of runtime/kernels/resize.py carries over exactly. The device then
computes y = sum over taps t of w[:, t] * take(x, idx[:, t], axis), with (idx, w) the nonzeros of R's
rows (one tap for nearest: a gather).
"""

from __future__ import annotations

import numpy as np

from ..kernels.common import arg, axes_from, ints, norm_axis
from ..kernels.conv import padded, taps
from ..kernels.pool import _window_geometry  # noqa: PLC2701 - the CPU pool's own window rule (ceil_mode)
from ..kernels.resize import resize_array


def _pad(x, begin, end, xp):
    if not any(begin) and not any(end):
        return x
    return xp.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end)), mode="constant")


def _window_counts(spatial, kernel, geo, end, include_pad: bool) -> np.ndarray:
    """Host (1, 1, *out) counts of the elements each window averages (the CPU AveragePool's rule)."""
    if include_pad:  # explicit pads count, the ceil_mode overhang does not
        inside = tuple(d + b + e for d, b, e in zip(spatial, geo.pads_begin, geo.pads_end))
        ones = padded(np.ones((1, 1) + inside, np.float32), (0,) * len(kernel), [e - pe for e, pe in zip(end, geo.pads_end)])
    else:
        ones = padded(np.ones((1, 1) + tuple(spatial), np.float32), geo.pads_begin, end)
    return sum(ones[window] for _, window in taps(kernel, geo))


def average_pool(inputs, attrs, ctx):
    x, xp = inputs[0], ctx.xp
    kernel, geo, end = _window_geometry(x, attrs)
    xpad = _pad(x, geo.pads_begin, end, xp)
    total = None
    for _, window in taps(kernel, geo):
        total = xpad[window] if total is None else total + xpad[window]
    key = ("avgpool_counts", x.shape[2:])
    if key not in ctx.memo:
        counts = _window_counts(x.shape[2:], kernel, geo, end, bool(attrs.get("count_include_pad", 0)))
        ctx.memo[key] = xp.asarray(counts.astype(x.dtype))
    return [(total / ctx.memo[key]).astype(x.dtype, copy=False)]


def _axis_taps(in_len: int, scale: float | None, size: int | None, attrs: dict) -> tuple[np.ndarray, np.ndarray]:
    """(idx (out, n) int64, w (out, n) float64) of one resized axis: the nonzeros of each row of R."""
    eye = np.eye(in_len, dtype=np.float64).reshape(in_len, in_len)
    one_axis = {**attrs, "axes": [0]}
    matrix = resize_array(eye, None if scale is None else [scale], None if size is None else [size], one_axis)
    n = max(1, int((matrix != 0).sum(axis=1).max()))
    idx = np.sort(np.argsort(-np.abs(matrix), axis=1, kind="stable")[:, :n], axis=1)  # taps in index order, as the CPU sums
    return idx, np.take_along_axis(matrix, idx, axis=1)


def resize(inputs, attrs, ctx):
    x, xp = inputs[0], ctx.xp
    if ctx.opset < 11 and len(inputs) == 2:  # Resize-10: (X, scales), asymmetric coordinates
        attrs = {**attrs, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
        inputs = [x, None, inputs[1]]
    scales, sizes = arg(inputs, 2), arg(inputs, 3)  # roi matters only for tf_crop_and_resize (host)
    scales = [float(s) for s in np.asarray(scales).reshape(-1)] if scales is not None and scales.size else None
    sizes = ints(sizes) if sizes is not None and sizes.size else None
    axes = [norm_axis(a, x.ndim) for a in attrs.get("axes") or range(x.ndim)]
    key = ("resize_taps", x.shape, tuple(scales or ()), tuple(sizes or ()))
    if key not in ctx.memo:
        plan = []
        for i, axis in enumerate(axes):
            scale, size = (scales[i], None) if scales is not None else (None, sizes[i])
            if (size if size is not None else int(x.shape[axis] * scale)) == x.shape[axis] and scale in (None, 1.0):
                continue
            idx, w = _axis_taps(x.shape[axis], scale, size, attrs)
            plan.append((axis, xp.asarray(idx), xp.asarray(w.astype(np.float32))))
        ctx.memo[key] = plan
    work = x if x.dtype.kind == "f" else x.astype(np.float32)
    for axis, idx, w in ctx.memo[key]:
        shape = (1,) * axis + (idx.shape[0],) + (1,) * (work.ndim - axis - 1)
        if idx.shape[1] == 1:
            work = xp.take(work, idx[:, 0], axis=axis)
            continue
        total = None
        for t in range(idx.shape[1]):
            term = xp.take(work, idx[:, t], axis=axis) * w[:, t].astype(work.dtype).reshape(shape)
            total = term if total is None else total + term
        work = total
    if x.dtype.kind in "iu":  # as the CPU kernel: clamp to the range, then truncate
        info = np.iinfo(x.dtype)
        return [xp.clip(work, info.min, info.max).astype(x.dtype)]
    return [work.astype(x.dtype, copy=False)]


resize.host_inputs = (1, 2, 3)
resize.may_run = lambda attrs: (attrs.get("coordinate_transformation_mode") != "tf_crop_and_resize"
                                and attrs.get("keep_aspect_ratio_policy", "stretch") == "stretch")


def _reduce(name: str):
    def op(inputs, attrs, ctx):
        x = inputs[0]
        axes = axes_from(inputs, attrs, 1, x.ndim)
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.ndim))
        result = getattr(x, name)(axis=tuple(axes), keepdims=bool(attrs.get("keepdims", 1)))
        return [result.astype(x.dtype, copy=False)]
    op.host_inputs = (1,)
    op.may_run = lambda attrs: True
    return op


SPATIAL = {
    ("", "AveragePool"): average_pool, ("", "Resize"): resize,
    ("", "ReduceMean"): _reduce("mean"), ("", "ReduceSum"): _reduce("sum"),
    ("", "ReduceMax"): _reduce("max"), ("", "ReduceMin"): _reduce("min"),
}
