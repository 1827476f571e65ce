"""Device shape and data-movement ops. Shape arguments (target shapes, axes, slice bounds) are read on
the host (`host_inputs`), so no op waits on a device-to-host copy. Kernels of runtime/kernels/shape.py
that only call array methods (reshape, indexing) run on device arrays unchanged."""

from __future__ import annotations

from ..kernels import shape as cpu_shape
from ..kernels.common import arg, axes_from, broadcast_shape, ints, norm_axis


def _host(*indices):
    def mark(fn):
        fn.host_inputs = indices
        return fn
    return mark


@_host(1)
def reshape(inputs, attrs, ctx):
    return cpu_shape.reshape(inputs, attrs, ctx)


@_host(1)
def unsqueeze(inputs, attrs, ctx):
    return cpu_shape.unsqueeze(inputs, attrs, ctx)


@_host(1)
def split(inputs, attrs, ctx):
    return cpu_shape.split(inputs, attrs, ctx)


@_host(1, 2, 3, 4)
def slice_(inputs, attrs, ctx):
    return cpu_shape.slice_(inputs, attrs, ctx)


@_host(1)
def squeeze(inputs, attrs, ctx):
    x = inputs[0]
    axes = axes_from(inputs, attrs, 1, x.ndim)
    return [ctx.xp.squeeze(x, axis=tuple(axes)) if axes is not None else ctx.xp.squeeze(x)]


@_host(1)
def expand(inputs, attrs, ctx):
    x = inputs[0]
    return [ctx.xp.broadcast_to(x, broadcast_shape(x.shape, tuple(ints(inputs[1]))))]


def transpose(inputs, attrs, ctx):
    return [ctx.xp.transpose(inputs[0], attrs.get("perm"))]


def concat(inputs, attrs, ctx):
    arrays = [x for x in inputs if x is not None]
    return [ctx.xp.concatenate(arrays, axis=norm_axis(attrs["axis"], arrays[0].ndim))]


def gather(inputs, attrs, ctx):
    x, indices = inputs
    axis = norm_axis(attrs.get("axis", 0), x.ndim)
    indices = ctx.xp.where(indices < 0, indices + x.shape[axis], indices)  # CuPy's take wraps, ONNX counts from the end
    return [ctx.xp.take(x, indices, axis=axis)]


def identity(inputs, attrs, ctx):
    return [inputs[0]]


SHAPE = {
    ("", "Reshape"): reshape, ("", "Unsqueeze"): unsqueeze, ("", "Split"): split, ("", "Slice"): slice_,
    ("", "Squeeze"): squeeze, ("", "Expand"): expand, ("", "Transpose"): transpose, ("", "Concat"): concat,
    ("", "Gather"): gather, ("", "Identity"): identity,
    ("", "Flatten"): cpu_shape.flatten, ("", "Dropout"): identity,
}
# Ops whose output may share memory with an input (views): the arena keeps the input's bytes alive
# as long as any view of them is.
VIEW_OPS = {("", op) for op in ("Reshape", "Unsqueeze", "Split", "Slice", "Squeeze", "Expand", "Transpose",
                                "Identity", "Flatten", "Dropout")}
_ = arg  # re-exported helper for the other op files
