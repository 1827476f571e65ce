"""Reductions (ReduceX with keepdims/noop_with_empty_axes, axes as attribute or input), ArgMax/ArgMin,
CumSum/CumProd."""

from __future__ import annotations

import numpy as np

from .common import axes_from, ints, norm_axis, to_compute


def _empty_fill(kind: str, dtype: np.dtype):
    # Identity elements for reductions over an empty set (ONNX: -inf for max, +inf for min, ...)
    if kind in ("max", "logsum", "logsumexp"):
        return -np.inf if dtype.kind == "f" else False if dtype.kind == "b" else np.iinfo(dtype).min
    if kind == "min":
        return np.inf if dtype.kind == "f" else True if dtype.kind == "b" else np.iinfo(dtype).max
    return 1 if kind == "prod" else 0


def _reduce(kind: str):
    def kernel(inputs, attrs, ctx):
        x = inputs[0]
        work = to_compute(x)
        axes = axes_from(inputs, attrs, 1, x.ndim)
        keepdims = bool(attrs.get("keepdims", 1))
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.ndim))
        axis = tuple(axes)
        if work.size == 0 or any(work.shape[a] == 0 for a in axis):
            shape = [1 if a in axis else d for a, d in enumerate(work.shape)] if keepdims else \
                [d for a, d in enumerate(work.shape) if a not in axis]
            fill = _empty_fill(kind, work.dtype)
            return [np.full(shape, fill, dtype=work.dtype).astype(x.dtype)]
        trailing = axis == tuple(range(work.ndim - len(axis), work.ndim))
        if len(axis) == 1 and work.shape[axis[0]] <= SHORT_AXIS and kind in _FOLDS:
            result = _fold_short_axis(kind, work, axis[0], keepdims)
        elif trailing and len(axis) > 1 and work.flags.c_contiguous:  # one long axis: pairwise sums
            kept = work.shape[:work.ndim - len(axis)]
            result = _REDUCERS[kind](work.reshape(kept + (-1,)), (len(kept),), False)
            result = np.reshape(result, kept + (1,) * len(axis) if keepdims else kept)
        else:
            result = _REDUCERS[kind](work, axis, keepdims)
        return [np.asarray(result).astype(x.dtype, copy=False)]
    return kernel


# NumPy reduces an axis of a few elements one output at a time: a sum over the (re, im) pair of an
# STFT's [batch, frames, bins, 2] took 7 ms where adding the two slices takes 0.07. Up to this size
# the axis is folded slice by slice, in the order NumPy's own loop adds them (the same bits).
SHORT_AXIS = 4
_FOLDS = {  # kind: (elementwise map before the fold, binary fold, after)
    "sum": (None, np.add, None), "mean": (None, np.add, "mean"), "max": (None, np.maximum, None),
    "min": (None, np.minimum, None), "prod": (None, np.multiply, None), "l1": (np.abs, np.add, None),
    "sumsquare": (np.square, np.add, None), "l2": (np.square, np.add, np.sqrt),
}


def _fold_short_axis(kind: str, x: np.ndarray, axis: int, keepdims: bool) -> np.ndarray:
    before, fold, after = _FOLDS[kind]
    if x.dtype.kind == "b" and fold is not np.maximum and fold is not np.minimum:
        return _REDUCERS[kind](x, (axis,), keepdims)  # NumPy sums booleans as integers
    lead = (slice(None),) * axis
    pieces = [x[lead + (i,)] for i in range(x.shape[axis])]  # views
    if before is not None:
        pieces = [before(piece) for piece in pieces]
    result = np.array(pieces[0], copy=True)
    for piece in pieces[1:]:
        fold(result, piece, out=result)
    if after == "mean":
        result = np.true_divide(result, x.shape[axis], out=result) if result.dtype.kind == "f" else \
            np.mean(x, axis=axis)
    elif after is not None:
        result = after(result)
    return np.expand_dims(result, axis) if keepdims else result


def _log_sum_exp(x, axis, keepdims):
    peak = np.max(x, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0)
    result = np.log(np.sum(np.exp(x - peak), axis=axis, keepdims=True)) + peak
    return result if keepdims else np.squeeze(result, axis=axis)


def _mean(x, axis, keepdims):
    if x.dtype.kind == "f":
        return np.mean(x, axis=axis, keepdims=keepdims, dtype=x.dtype)
    return np.mean(x, axis=axis, keepdims=keepdims)


_REDUCERS = {
    "sum": lambda x, a, k: np.sum(x, axis=a, keepdims=k),
    "mean": _mean,
    "max": lambda x, a, k: np.max(x, axis=a, keepdims=k),
    "min": lambda x, a, k: np.min(x, axis=a, keepdims=k),
    "prod": lambda x, a, k: np.prod(x, axis=a, keepdims=k),
    "l1": lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k),
    "l2": lambda x, a, k: np.sqrt(np.sum(np.square(x), axis=a, keepdims=k)),
    "logsum": lambda x, a, k: np.log(np.sum(x, axis=a, keepdims=k)),
    "logsumexp": _log_sum_exp,
    "sumsquare": lambda x, a, k: np.sum(np.square(x), axis=a, keepdims=k),
}


def _arg(fn):
    def kernel(inputs, attrs, ctx):
        x = to_compute(inputs[0])
        axis = norm_axis(attrs.get("axis", 0), x.ndim)
        if attrs.get("select_last_index", 0):
            flipped = np.flip(x, axis=axis)
            index = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            index = fn(x, axis=axis)
        if attrs.get("keepdims", 1):
            index = np.expand_dims(index, axis)
        return [np.asarray(index, dtype=np.int64)]
    return kernel


def _cumulative(ufunc):
    def kernel(inputs, attrs, ctx):
        x = to_compute(inputs[0])
        axis = norm_axis(ints(inputs[1])[0], x.ndim)
        reverse, exclusive = attrs.get("reverse", 0), attrs.get("exclusive", 0)
        work = np.flip(x, axis) if reverse else x
        # float16 accumulated in float32: NumPy adds float16 one step at a time, rounding each running
        # sum (384 steps were 2% off where onnxruntime is within float16's rounding: fuzz_graphs)
        accumulator = np.float32 if x.dtype == np.float16 else x.dtype
        result = ufunc.accumulate(work, axis=axis, dtype=accumulator)
        if exclusive:
            identity = np.full_like(np.take(result, [0], axis=axis), ufunc.identity)
            result = np.concatenate([identity, np.take(result, np.arange(x.shape[axis] - 1), axis=axis)], axis=axis)
        if reverse:
            result = np.flip(result, axis)
        return [np.ascontiguousarray(result).astype(inputs[0].dtype, copy=False)]
    return kernel


KERNELS = {
    **{("", f"Reduce{name}"): _reduce(kind) for name, kind in (
        ("Sum", "sum"), ("Mean", "mean"), ("Max", "max"), ("Min", "min"), ("Prod", "prod"), ("L1", "l1"),
        ("L2", "l2"), ("LogSum", "logsum"), ("LogSumExp", "logsumexp"), ("SumSquare", "sumsquare"))},
    ("", "ArgMax"): _arg(np.argmax),
    ("", "ArgMin"): _arg(np.argmin),
    ("", "CumSum"): _cumulative(np.add),
    ("", "CumProd"): _cumulative(np.multiply),
}
