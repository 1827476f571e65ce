"""Broadcasting and axis corners: rank-0 values computed in the graph, size-1 axes broadcast out to
an outer product, size-0 slices and constants concatenated or reduced (a sum over nothing is 0),
and axes written negative (Softmax, Concat, Gather with negative indices, CumSum, ReduceMean,
Unsqueeze / Squeeze, Flatten)."""

import numpy as np
from onnx import TensorProto

from .graph import F32

MAX_OUTER = 1 << 14  # an outer product's elements at batch 1


def _axes(g, values) -> str:
    return g.const(np.array(values, np.int64), "axes")


def _scalar_stat(g, x, s):
    """A rank-0 statistic of x (every axis reduced, keepdims=0) broadcast back against it."""
    op = str(g.rng.choice(["ReduceMax", "ReduceMin", "ReduceMean", "ReduceSum"]))
    scalar = g.shape_node(op, [x], keepdims=0)  # no axes: every axis
    if g.rng.integers(2):  # the scalar as [1] and back, as exporters write .item() round trips
        scalar = g.shape_node("Squeeze", [g.shape_node("Unsqueeze", [scalar, _axes(g, [0])])])
    kind = int(g.rng.integers(3))
    if kind == 0:
        return g.node("Sub", [x, scalar], s)
    if kind == 1:
        return g.node("Div", [x, g.shape_node("Add", [g.shape_node("Abs", [scalar]), g.const(np.array(1.0, F32))])], s)
    return g.node("Mul", [g.shape_node("Tanh", [scalar]), x], s)


def _outer_broadcast(g, x, s):
    """x[..., None] * w[k] (size 1 against size k), reduced back over the new last axis."""
    k = int(g.rng.choice([1, 3, 5]))
    if int(np.prod(s)) * k > MAX_OUTER:
        return None
    wide = g.shape_node("Mul", [g.shape_node("Unsqueeze", [x, _axes(g, [-1])]),
                                g.const(g.rng.standard_normal(k).astype(F32))])
    reduced = str(g.rng.choice(["ReduceMean", "ReduceMax", "ReduceSum"]))
    if reduced == "ReduceSum":
        return g.node(reduced, [wide, _axes(g, [-1])], s, g.dyn[x], keepdims=0)
    return g.node(reduced, [wide], s, g.dyn[x], axes=[-1], keepdims=0)


def _empty_parts(g, x, s):
    """A size-0 slice of x (start == end, on a negative axis) concatenated back, or summed over
    (ReduceSum over nothing: zeros) and added; sometimes the empty value is an output."""
    rank = len(s)
    a = int(g.rng.integers(1, rank))
    at = int(g.rng.integers(0, s[a] + 1)) if g.fixed(x, a) else 0
    empty = g.shape_node("Slice", [x, g.const(np.array([at], np.int64)), g.const(np.array([at], np.int64)),
                                   _axes(g, [a - rank])])
    if g.rng.integers(3) == 0:
        shape = tuple(0 if i == a else d for i, d in enumerate(s))
        g.typed_outputs.append((empty, TensorProto.FLOAT, shape, g.dyn[x] - {a}))
    if g.rng.integers(2):
        pieces = [x, empty] if g.rng.integers(2) else [empty, x]
        return g.node("Concat", pieces, s, axis=a - rank)
    zeros = g.shape_node("ReduceSum", [empty, _axes(g, [a - rank])], keepdims=1)
    return g.node("Add", [x, zeros], s)


def _negative_axes(g, x, s):
    """An op whose axis is written from the end."""
    rank = len(s)
    kind = int(g.rng.integers(6))
    a = int(g.rng.integers(1, rank))  # not the batch
    neg = a - rank
    if kind == 0:
        return g.node(str(g.rng.choice(["Softmax", "LogSoftmax"])), [x], s, axis=neg)
    if kind == 1 and g.fixed(x, a) and s[a] >= 2:  # the last and the first, by negative indices
        indices = g.const(np.array([-1, -s[a]], np.int64))
        return g.node("Gather", [x, indices], (*s[:a], 2, *s[a + 1:]), g.dyn[x] - {a}, axis=neg)
    if kind == 2:
        return g.node("CumSum", [x, g.const(np.array(neg, np.int64))], s, exclusive=int(g.rng.integers(2)),
                      reverse=int(g.rng.integers(2)))
    if kind == 3:
        mean = g.shape_node("ReduceMean", [x], axes=[neg], keepdims=1)
        return g.node("Sub", [x, mean], s)
    if kind == 4:  # a size-1 axis put in from the end and taken out again
        up = g.shape_node("Unsqueeze", [x, _axes(g, [neg - 1])])
        return g.node("Squeeze", [g.shape_node("Relu", [up]), _axes(g, [neg - 1])], s, g.dyn[x])
    if rank >= 3 and g.fixed(x, *range(1, rank)):  # Flatten at a negative axis, then back
        flat = g.shape_node("Flatten", [x], axis=neg)
        back = g.shape_node("Reshape", [g.shape_node("Sigmoid", [flat]), g.const(np.array([-1, *s[1:]], np.int64))])
        return g.node("Identity", [back], s, g.dyn[x])
    return g.node("Concat", [x, g.node("Neg", [x], s)], (*s[:a], 2 * s[a], *s[a + 1:]), axis=neg)
