"""Indexing ops: Gather*, Scatter*, OneHot, Compress, NonZero, Unique, TopK, TensorScatter."""

from __future__ import annotations

import math
import numpy as np

from .common import arg, ints, norm_axis


def _positive(indices: np.ndarray, dim) -> np.ndarray:
    indices = indices.astype(np.int64, copy=False)
    return np.where(indices < 0, indices + dim, indices)


def gather(inputs, attrs, ctx):
    # NumPy indexing already reads indices in [-n, -1] from the end, as ONNX does
    x, indices = inputs
    return [np.asarray(np.take(x, indices, axis=attrs.get("axis", 0)))]  # a 0-d index: a 0-d array, not a NumPy scalar


def gather_elements(inputs, attrs, ctx):
    x, indices = inputs
    return [np.take_along_axis(x, indices, axis=attrs.get("axis", 0))]


def gather_nd(inputs, attrs, ctx):
    x, indices = inputs
    batch_dims = attrs.get("batch_dims", 0)
    depth = indices.shape[-1]
    if batch_dims == 0 and depth == 1:  # rows of x by one index each: one take (negative ones count from the end)
        return [np.take(x, indices[..., 0].astype(np.int64, copy=False), axis=0)]
    num_batches = math.prod(x.shape[:batch_dims])
    data = x.reshape((num_batches,) + x.shape[batch_dims:])
    index = indices.reshape(num_batches, -1, depth).astype(np.int64)
    dims = np.array(x.shape[batch_dims:batch_dims + depth], np.int64)
    index = np.where(index < 0, index + dims, index)
    if index.size and ((index < 0) | (index >= dims)).any():
        raise IndexError(f"GatherND: an index is outside the data's dims {dims.tolist()}")
    # one row index into [batches * prod(dims), rest]: a single take, where an index array per
    # dimension makes NumPy's fancy indexing walk them all (SSDlite's box gather: 18 ms)
    strides = np.cumprod(np.concatenate([dims[1:], [1]])[::-1])[::-1]
    per_batch = int(np.prod(dims))
    rows = index @ strides + (np.arange(num_batches, dtype=np.int64) * per_batch)[:, None]
    picked = np.take(data.reshape((num_batches * per_batch,) + x.shape[batch_dims + depth:]), rows.reshape(-1), axis=0)
    return [picked.reshape(indices.shape[:-1] + x.shape[batch_dims + depth:])]


_REDUCE_AT = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_into(out: np.ndarray, index: tuple, updates: np.ndarray, reduction: str) -> np.ndarray:
    if reduction in ("none", None):
        out[index] = updates
    else:
        _REDUCE_AT[reduction].at(out, index, updates)
    return out


def scatter_elements(inputs, attrs, ctx):
    x, indices, updates = inputs
    axis = norm_axis(attrs.get("axis", 0), x.ndim)
    reduction = attrs.get("reduction", "none")
    if reduction in ("none", None) and indices.size:
        return [_scatter_flat(x, indices, updates, axis)]
    grid = list(np.indices(indices.shape, sparse=True))
    grid[axis] = _positive(indices, x.shape[axis])
    return [_scatter_into(x.copy(), tuple(grid), updates, reduction)]


def _scatter_flat(x: np.ndarray, indices: np.ndarray, updates: np.ndarray, axis: int) -> np.ndarray:
    """ScatterElements without a reduction as one put at flat offsets: index * stride along the axis
    plus each other coordinate times its stride, built from the small per-dim ranges. NumPy's fancy
    assignment with one index array per dim walks them all (torchvision's MultiScaleRoIAlign
    scatter of 100 x 256 x 7 x 7 pooled values: 18 ms). Later duplicates win, as there."""
    index = indices.astype(np.int64, copy=False)
    dim = x.shape[axis]
    lowest, highest = int(index.min()), int(index.max())  # two reductions: no full-size temporaries
    if lowest < -dim or highest >= dim:
        raise IndexError(f"ScatterElements: an index is outside [-{dim}, {dim - 1}] on axis {axis}")
    if indices.ndim != x.ndim or any(n > m for d, (n, m) in enumerate(zip(indices.shape, x.shape)) if d != axis):
        raise IndexError(f"ScatterElements: indices of shape {list(indices.shape)} do not fit data of shape {list(x.shape)}")
    strides = [math.prod(x.shape[d + 1:]) for d in range(x.ndim)]
    flat = index * strides[axis]
    if lowest < 0:  # negative indices count from the end
        flat[index < 0] += dim * strides[axis]
    for d, size in enumerate(indices.shape):
        if d != axis and size > 1:
            flat += (np.arange(size, dtype=np.int64) * strides[d]).reshape((size,) + (1,) * (indices.ndim - d - 1))
    out = np.array(x, copy=True, order="C")
    out.reshape(-1)[flat.reshape(-1)] = np.broadcast_to(updates, indices.shape).reshape(-1)
    return out


def scatter_nd(inputs, attrs, ctx):
    x, indices, updates = inputs
    depth = indices.shape[-1]
    index = _positive(indices, np.array(x.shape[:depth]))
    return [_scatter_into(x.copy(), tuple(index[..., j] for j in range(depth)), updates,
                          attrs.get("reduction", "none"))]


def one_hot(inputs, attrs, ctx):
    indices, depth, values = inputs
    depth = int(np.asarray(depth).reshape(-1)[0])
    index = indices.astype(np.int64)
    index = np.where(index < 0, index + depth, index)
    hot = index[..., None] == np.arange(depth)
    hot = np.moveaxis(hot, -1, norm_axis(attrs.get("axis", -1), indices.ndim + 1))
    off, on = values.reshape(-1)[:2]
    return [np.where(hot, on, off).astype(values.dtype, copy=False)]


def compress(inputs, attrs, ctx):
    x, condition = inputs
    axis = attrs.get("axis")
    axis = norm_axis(axis, x.ndim) if axis is not None else None
    return [np.compress(condition.astype(bool).ravel(), x, axis=axis)]


def non_zero(inputs, attrs, ctx):
    x = inputs[0]
    return [np.array(np.nonzero(x.reshape(1) if x.ndim == 0 else x), dtype=np.int64).reshape(x.ndim, -1)]


def unique(inputs, attrs, ctx):
    x = inputs[0]
    axis = attrs.get("axis")
    axis = norm_axis(axis, x.ndim) if axis is not None else None
    source = x.ravel() if axis is None else x
    y, first, inverse, counts = np.unique(source, return_index=True, return_inverse=True, return_counts=True,
                                          axis=axis)
    inverse = inverse.reshape(-1)
    if not attrs.get("sorted", 1):  # order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y, first, counts, inverse = np.take(y, order, axis=axis or 0), first[order], counts[order], rank[inverse]
    return [y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]


def top_k(inputs, attrs, ctx):
    x = inputs[0]
    k_input = inputs[1] if len(inputs) > 1 else None  # opset < 10: k is an attribute
    k = int(attrs["k"]) if k_input is None else int(np.asarray(k_input).reshape(-1)[0])
    axis = norm_axis(attrs.get("axis", -1), x.ndim)
    # Stable sort keeps the lower index first among equal values, as ONNX asks.
    if attrs.get("largest", 1):
        key = -x.astype(np.float64) if x.dtype.kind in "ub" else -x
    else:
        key = x
    partial = 0 < k * PARTIAL_SORT_RATIO <= x.shape[axis] and x.shape[axis] >= PARTIAL_SORT_MIN_AXIS
    order = _few_largest(key, k, axis) if partial else None
    if order is None:
        order = np.argsort(key, axis=axis, kind="stable")
        order = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, order, axis=axis), order.astype(np.int64)]


PARTIAL_SORT_RATIO = 8  # k at most an eighth of the axis: select, then sort only the candidates
PARTIAL_SORT_ROWS = 256  # rows handled one by one (a detector's score lists are a few long rows)
# ... on axes this long: below it one vectorized stable sort of every row costs less than the
# per-row partition loop (a 4 x 100 TopK with k 5: 133 -> 29 us)
PARTIAL_SORT_MIN_AXIS = 1024


def _few_largest(key: np.ndarray, k: int, axis: int) -> np.ndarray | None:
    """TopK's order (ascending key, lower index first among equals) from a partition: every key below
    the k-th smallest is in, and of the keys equal to it the lowest indexes, as a stable sort of the
    candidates (in index order) keeps them. None where the full sort must judge (a NaN k-th key)."""
    rows = np.moveaxis(key, axis, -1)
    flat = rows.reshape(-1, rows.shape[-1])
    if flat.shape[0] > PARTIAL_SORT_ROWS:
        return None
    order = np.empty((flat.shape[0], k), np.int64)
    for r, row in enumerate(flat):
        kth = np.partition(row, k - 1)[k - 1]
        if kth != kth:  # NaN: NaNs sort last, and the comparison below would drop them
            return None
        candidates = np.flatnonzero(row <= kth)
        order[r] = candidates[np.argsort(row[candidates], kind="stable")[:k]]
    return np.moveaxis(order.reshape(rows.shape[:-1] + (k,)), -1, axis)


def tensor_scatter(inputs, attrs, ctx):
    cache, update = inputs[0], inputs[1]
    write = arg(inputs, 2)
    axis = norm_axis(attrs.get("axis", -2), cache.ndim)
    starts = ints(write) if write is not None else [0] * cache.shape[0]
    length, capacity = update.shape[axis], cache.shape[axis]
    out = cache.copy()
    for batch, start in enumerate(starts):
        slots = start + np.arange(length)
        if attrs.get("mode", "linear") == "circular":
            slots %= capacity
        np.moveaxis(out[batch], axis - 1, 0)[slots] = np.moveaxis(update[batch], axis - 1, 0)
    return [out]


KERNELS = {
    ("", "Gather"): gather,
    ("", "GatherElements"): gather_elements,
    ("", "GatherND"): gather_nd,
    ("", "Scatter"): scatter_elements,
    ("", "ScatterElements"): scatter_elements,
    ("", "ScatterND"): scatter_nd,
    ("", "OneHot"): one_hot,
    ("", "Compress"): compress,
    ("", "NonZero"): non_zero,
    ("", "Unique"): unique,
    ("", "TopK"): top_k,
    ("", "TensorScatter"): tensor_scatter,
}
