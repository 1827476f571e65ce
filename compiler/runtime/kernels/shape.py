"""Shape and layout ops. Results may be views of their input (kernels never write into inputs)."""

from __future__ import annotations

import math
import numpy as np

from .common import arg, axes_from, broadcast_shape, ints, norm_axis, np_dtype


def reshape(inputs, attrs, ctx):
    x, shape = inputs[0], inputs[1].tolist()
    if 0 in shape and not attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


def transpose(inputs, attrs, ctx):
    perm = attrs.get("perm")
    return [np.transpose(inputs[0], perm if perm is not None else None)]


def squeeze(inputs, attrs, ctx):
    x = inputs[0]
    axes = axes_from(inputs, attrs, 1, x.ndim)
    return [np.squeeze(x, axis=tuple(axes)) if axes is not None else np.squeeze(x)]


def unsqueeze(inputs, attrs, ctx):
    x = inputs[0]
    given = arg(inputs, 1)
    raw = tuple(ints(given)) if given is not None else tuple(attrs["axes"])
    key = ("unsqueeze", x.shape, raw)
    shape = ctx.memo.get(key) if ctx is not None else None
    if shape is None:
        rank = x.ndim + len(raw)
        shape = list(x.shape)
        for axis in sorted(norm_axis(a, rank) for a in raw):
            shape.insert(axis, 1)
        shape = tuple(shape)
        if ctx is not None:
            _remember(ctx.memo, key, shape)
    return [x.reshape(shape)]


def _remember(memo: dict, key, value) -> None:
    """Per-step plans by shape; a step whose shapes keep changing starts over rather than grow."""
    if len(memo) > 64:
        memo.clear()
    memo[key] = value


def flatten(inputs, attrs, ctx):
    x = inputs[0]
    axis = attrs.get("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    outer = math.prod(x.shape[:axis])
    return [x.reshape(outer, math.prod(x.shape[axis:]))]


def concat(inputs, attrs, ctx):
    arrays = [x for x in inputs if x is not None]
    return [np.concatenate(arrays, axis=norm_axis(attrs["axis"], arrays[0].ndim))]


def split(inputs, attrs, ctx):
    x = inputs[0]
    given = arg(inputs, 1)
    sizes = tuple(ints(given)) if given is not None else attrs.get("split")
    num_outputs = len(ctx.out) or attrs.get("num_outputs", 1)
    key = ("split", x.shape, None if sizes is None else tuple(sizes), num_outputs)
    index = ctx.memo.get(key)
    if index is None:
        axis = norm_axis(attrs.get("axis", 0), x.ndim)
        if sizes is None:
            dim = x.shape[axis]
            chunk = -(-dim // num_outputs)  # ceil: the last piece may be smaller
            sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(num_outputs)]
        index, start = [], 0
        for size_ in sizes:
            index.append((slice(None),) * axis + (slice(start, start + size_),))
            start += size_
        _remember(ctx.memo, key, index)
    return [x[i] for i in index]


def slice_(inputs, attrs, ctx):
    x = inputs[0]
    if len(inputs) == 1:  # opset < 10: attributes
        starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs.get("axes"), None
    else:
        starts, ends = ints(inputs[1]), ints(inputs[2])
        axes = ints(inputs[3]) if arg(inputs, 3) is not None else None
        steps = ints(inputs[4]) if arg(inputs, 4) is not None else None
    axes = [norm_axis(a, x.ndim) for a in axes] if axes is not None else list(range(len(starts)))
    steps = steps or [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[axis] = slice_bounds(start, end, step, x.shape[axis])
    return [x[tuple(index)]]


def slice_bounds(start: int, end: int, step: int, dim: int) -> slice:
    """ONNX clamping rules as a Python slice (a negative end must become None, not wrap)."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start, end = min(max(start, -1), dim - 1), min(max(end, -1), dim - 1)
    if start < 0:
        return slice(0, 0)
    return slice(start, end if end >= 0 else None, step)


def expand(inputs, attrs, ctx):
    x, shape = inputs[0], tuple(ints(inputs[1]))
    key = ("expand", x.shape, x.strides, shape)
    plan = ctx.memo.get(key) if ctx is not None else None
    if plan is None:
        target = broadcast_shape(x.shape, shape)
        lead = len(target) - x.ndim
        strides = (0,) * lead + tuple(0 if d == 1 and t != 1 else s for d, t, s in zip(x.shape, target[lead:], x.strides))
        plan = (target, strides)
        if ctx is not None:
            _remember(ctx.memo, key, plan)
    target, strides = plan
    if target == x.shape:
        return [x]
    if x.flags.c_contiguous and x.size:  # a read-only broadcast view, without np.broadcast_to's Python overhead
        view = np.ndarray(target, x.dtype, x, 0, strides)
        view.flags.writeable = False
        return [view]
    return [np.broadcast_to(x, target)]


def tile(inputs, attrs, ctx):
    return [np.tile(inputs[0], ints(inputs[1]))]


def pad(inputs, attrs, ctx):
    x = inputs[0]
    mode = attrs.get("mode", "constant")
    if len(inputs) == 1:  # opset < 11: attributes
        pads, value, axes = attrs.get("pads", attrs.get("paddings")), attrs.get("value", 0.0), None
    else:
        pads = ints(inputs[1])
        value = arg(inputs, 2)
        value = value.reshape(-1)[0] if value is not None and value.size else 0
        axes = ints(inputs[3]) if arg(inputs, 3) is not None else None
    axes = [norm_axis(a, x.ndim) for a in axes] if axes is not None else list(range(x.ndim))
    width = [[0, 0] for _ in range(x.ndim)]
    for i, axis in enumerate(axes):
        width[axis] = [pads[i], pads[i + len(axes)]]
    # Negative pads crop first.
    crop = tuple(slice(-min(b, 0), d + min(e, 0)) for (b, e), d in zip(width, x.shape))
    x = x[crop]
    width = [(max(b, 0), max(e, 0)) for b, e in width]
    if mode == "constant":
        out = np.full(tuple(d + b + e for d, (b, e) in zip(x.shape, width)), value, dtype=x.dtype)
        out[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, width))] = x
        return [out]
    # edge / reflect / wrap: one gather per padded axis, its source positions memoized (np.pad
    # spends tens of microseconds of Python a call, most of a small pad's time)
    for axis, (begin, end) in enumerate(width):
        if begin or end:
            key = ("pad-source", mode, x.shape[axis], begin, end)
            source = ctx.memo.get(key) if ctx is not None else None
            if source is None:
                source = _pad_source(mode, x.shape[axis], begin, end)
                if ctx is not None:
                    _remember(ctx.memo, key, source)
            x = np.take(x, source, axis=axis)
    return [x]


def _pad_source(mode: str, size: int, begin: int, end: int) -> np.ndarray:
    """For each position of a padded axis, the input position it copies (as np.pad computes it)."""
    position = np.arange(-begin, size + end)
    if mode == "edge":
        return np.clip(position, 0, size - 1)
    if mode == "wrap":
        return position % size
    if mode != "reflect":
        raise ValueError(f"Pad mode {mode!r} is not one of constant, edge, reflect, wrap")
    if size == 1:
        return np.zeros_like(position)
    period = 2 * (size - 1)  # a reflection about both ends repeats with this period
    folded = position % period
    return np.where(folded < size, folded, period - folded)


def shape(inputs, attrs, ctx):
    dims = inputs[0].shape
    cached = ctx.memo.get(dims) if ctx is not None else None
    if cached is None:
        start, end = attrs.get("start", 0), attrs.get("end")
        cached = np.array(dims[start:end] if end is not None else dims[start:], dtype=np.int64)
        cached.flags.writeable = False  # handed out again on every run with this shape
        if ctx is not None:
            _remember(ctx.memo, dims, cached)
    return [cached]


def size(inputs, attrs, ctx):
    return [np.array(inputs[0].size, dtype=np.int64)]


def constant_of_shape(inputs, attrs, ctx):
    value = attrs.get("value")
    value = np.zeros(1, np.float32) if value is None else value
    return [np.full(ints(inputs[0]), value.reshape(-1)[0], dtype=value.dtype)]


_CONSTANT_FORMS = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
                   "value_ints": np.int64, "value_string": object, "value_strings": object}


def constant(inputs, attrs, ctx):
    if "value" in attrs:
        return [attrs["value"]]
    for key, dtype in _CONSTANT_FORMS.items():
        if key in attrs:
            return [np.array(attrs[key], dtype=dtype)]
    raise ValueError("Constant without a supported value attribute")


def range_(inputs, attrs, ctx):
    start, limit, delta = (np.asarray(v).reshape(()) for v in inputs)
    count = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    return [(start + np.arange(count, dtype=start.dtype) * delta).astype(start.dtype, copy=False)]


def eye_like(inputs, attrs, ctx):
    x = inputs[0]
    dtype = np_dtype(attrs["dtype"]) if attrs.get("dtype") is not None else x.dtype
    return [np.eye(x.shape[0], x.shape[1], k=attrs.get("k", 0), dtype=dtype)]


def trilu(inputs, attrs, ctx):
    k = int(np.asarray(inputs[1]).reshape(-1)[0]) if arg(inputs, 1) is not None else 0
    return [np.triu(inputs[0], k) if attrs.get("upper", 1) else np.tril(inputs[0], k)]


def depth_to_space(inputs, attrs, ctx):
    x = inputs[0]
    b, c, h, w = x.shape
    bs = attrs["blocksize"]
    if attrs.get("mode", "DCR") == "DCR":
        y = x.reshape(b, bs, bs, c // (bs * bs), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(b, c // (bs * bs), bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [y.reshape(b, c // (bs * bs), h * bs, w * bs)]


def space_to_depth(inputs, attrs, ctx):
    x = inputs[0]
    b, c, h, w = x.shape
    bs = attrs["blocksize"]
    order = (0, 3, 5, 1, 2, 4) if attrs.get("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
    y = x.reshape(b, c, h // bs, bs, w // bs, bs).transpose(order)
    return [y.reshape(b, c * bs * bs, h // bs, w // bs)]


def center_crop_pad(inputs, attrs, ctx):
    x, target = inputs[0], ints(inputs[1])
    axes = [norm_axis(a, x.ndim) for a in attrs.get("axes", range(x.ndim))]
    new_shape, src, dst = list(x.shape), [slice(None)] * x.ndim, [slice(None)] * x.ndim
    for axis, want in zip(axes, target):
        dim = x.shape[axis]
        new_shape[axis] = want
        if want < dim:
            begin = (dim - want) // 2
            src[axis] = slice(begin, begin + want)
        elif want > dim:
            begin = (want - dim) // 2
            dst[axis] = slice(begin, begin + dim)
    y = np.zeros(new_shape, dtype=x.dtype)
    y[tuple(dst)] = x[tuple(src)]
    return [y]


def reverse_sequence(inputs, attrs, ctx):
    x, lengths = inputs[0], ints(inputs[1])
    batch_axis, time_axis = attrs.get("batch_axis", 1), attrs.get("time_axis", 0)
    y = x.copy()
    for b, n in enumerate(lengths):
        index = [slice(None)] * x.ndim
        index[batch_axis], index[time_axis] = b, slice(0, n)
        y[tuple(index)] = np.flip(x[tuple(index)], axis=time_axis - (batch_axis < time_axis))
    return [y]


KERNELS = {
    ("", "Reshape"): reshape, ("", "Transpose"): transpose, ("", "Squeeze"): squeeze,
    ("", "Unsqueeze"): unsqueeze, ("", "Flatten"): flatten, ("", "Concat"): concat, ("", "Split"): split,
    ("", "Slice"): slice_, ("", "Expand"): expand, ("", "Tile"): tile, ("", "Pad"): pad, ("", "Shape"): shape,
    ("", "Size"): size, ("", "ConstantOfShape"): constant_of_shape, ("", "Constant"): constant,
    ("", "Range"): range_, ("", "EyeLike"): eye_like, ("", "Trilu"): trilu, ("", "DepthToSpace"): depth_to_space,
    ("", "SpaceToDepth"): space_to_depth, ("", "CenterCropPad"): center_crop_pad,
    ("", "ReverseSequence"): reverse_sequence,
}
