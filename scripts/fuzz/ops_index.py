"""Indexing and broadcasting forms: ArgMax / ArgMin (ties after a Relu), GatherND and ScatterElements
with indices broadcast to the batch, Where and Expand broadcasting against computed shapes, Range
ramps off Shape, and NonZero's data-dependent lengths."""

import numpy as np
from onnx import TensorProto

from .graph import F32


def _argmax(g, x, s):
    axis = int(g.rng.integers(1, len(s)))
    keep = int(g.rng.integers(2))
    shape = tuple(1 if i == axis else d for i, d in enumerate(s)) if keep else tuple(d for i, d in enumerate(s) if i != axis)
    if len(shape) < 2:
        return None
    source = g.node("Relu", [x], s) if g.rng.integers(2) else x  # rows of zeros: ties
    index = g.shape_node(str(g.rng.choice(["ArgMax", "ArgMin"])), [source], axis=axis, keepdims=keep,
                         select_last_index=int(g.rng.integers(2)))
    dyn = {a if keep or a < axis else a - 1 for a in g.dyn[x] if a != axis}
    return g.node("Cast", [index], shape, dyn, to=TensorProto.FLOAT)


def _batch_expanded(g, indices: np.ndarray, like: str) -> str:
    """indices [1, ...] expanded to the batch of `like`, as exporters build per-batch indices."""
    batch = g.shape_node("Slice", [g.shape_node("Shape", [like]), g.const(np.array([0], np.int64)),
                                   g.const(np.array([1], np.int64))])
    target = g.shape_node("Concat", [batch, g.const(np.array(indices.shape[1:], np.int64))], axis=0)
    return g.shape_node("Expand", [g.const(indices.astype(np.int64), "indices"), target])


def _gather_nd(g, x, s):
    """GatherND with batch_dims=1: rows of x picked per batch element."""
    if len(s) < 3 or not g.fixed(x, 1, 2):
        return None
    k = int(g.rng.integers(1, 5))
    depth = int(g.rng.integers(1, 3)) if len(s) > 3 or g.rng.integers(2) else 1
    depth = min(depth, len(s) - 2)
    columns = [g.rng.integers(-s[1 + d], s[1 + d], size=k) for d in range(depth)]
    indices = np.stack(columns, axis=-1)[None]  # [1, k, depth]
    shape = (s[0], k, *s[1 + depth:])
    dyn = {a - depth + 1 for a in g.dyn[x] if a > depth}
    return g.node("GatherND", [x, _batch_expanded(g, indices, x)], shape, dyn, batch_dims=1)


def _scatter_elements(g, x, s):
    """ScatterElements along a fixed axis: a permutation (each slot written once), or with a
    reduction where slots repeat (opset 18's max / min, add / mul since 16)."""
    axes = [a for a in range(1, len(s)) if g.fixed(x, *range(1, len(s)))]
    if not axes:
        return None
    axis = int(g.rng.choice(axes))
    reduction = str(g.rng.choice(["none", "none", "add", "mul", "max", "min"]))
    picks = g.rng.permutation(s[axis]) if reduction == "none" else g.rng.integers(0, s[axis], size=s[axis])
    shape = [1] * len(s)
    shape[axis] = s[axis]
    indices = np.broadcast_to(picks.reshape(shape), (1, *s[1:])).copy()
    if reduction == "none":  # a different permutation per position off the axis too
        indices = np.argsort(g.rng.random((1, *s[1:])), axis=axis)
    updates = g.node("Tanh", [x], s)
    attrs = {} if reduction == "none" else {"reduction": reduction}
    return g.node("ScatterElements", [x, _batch_expanded(g, indices, x), updates], s, axis=axis, **attrs)


def _where_broadcast(g, x, s):
    """Where on a computed condition, its branches broadcast from lower ranks."""
    threshold = g.const(np.array(g.rng.uniform(-0.5, 0.5), F32))
    cond = g.shape_node(str(g.rng.choice(["Greater", "Less"])), [x, threshold])
    if g.fixed(x, -1) and g.rng.integers(2):
        other = g.const(g.rng.standard_normal(s[-1]).astype(F32))
    elif g.fixed(x, 1) and len(s) > 2:
        other = g.const(g.rng.standard_normal((s[1], *(1,) * (len(s) - 2))).astype(F32))
    else:
        other = g.const(np.array(g.rng.standard_normal(), F32))
    inputs = [cond, x, other] if g.rng.integers(2) else [cond, other, x]
    return g.node("Where", inputs, s)


def _expand_to_shape(g, x, s):
    """A constant broadcast to Shape(x) (bias tables, position terms) and added."""
    if g.fixed(x, -1):
        value = g.rng.standard_normal((1,) * (len(s) - 1) + (s[-1],))
    else:
        value = g.rng.standard_normal((1,) * len(s))
    expanded = g.shape_node("Expand", [g.const(value.astype(F32)), g.shape_node("Shape", [x])])
    return g.node(str(g.rng.choice(["Add", "Mul"])), [x, expanded], s)


def _range_ramp(g, x, s):
    """Range(0, Shape(x)[a]) as a float ramp along axis a (positions, sinusoid inputs)."""
    a = int(g.rng.integers(1, len(s)))
    length = g.shape_node("Gather", [g.shape_node("Shape", [x]), g.const(np.array(a, np.int64))], axis=0)
    if g.rng.integers(2):  # float Range over a Cast length, as dynamo writes arange(float)
        end = g.shape_node("Cast", [length], to=TensorProto.FLOAT)
        ramp = g.shape_node("Range", [g.const(np.array(0.0, F32)), end, g.const(np.array(1.0, F32))])
    else:
        ramp = g.shape_node("Cast", [g.shape_node("Range", [g.const(np.array(0, np.int64)), length,
                                                            g.const(np.array(1, np.int64))])], to=TensorProto.FLOAT)
    axes = [d for d in range(len(s)) if d != a]
    shaped = g.shape_node("Unsqueeze", [ramp, g.const(np.array(axes, np.int64), "axes")])
    scaled = g.shape_node("Mul", [shaped, g.const(np.array(0.1, F32))])
    return g.node("Add", [x, g.shape_node("Sin", [scaled])], s)


def _nonzero(g, x, s):
    """masked_select: the values of x past a threshold, a length only the data knows, as an output."""
    cond = g.shape_node("Greater", [x, g.const(np.array(0.5, F32))])
    picked = g.shape_node("GatherND", [x, g.shape_node("Transpose", [g.shape_node("NonZero", [cond])], perm=[1, 0])])
    g.extra_outputs.append((g.shape_node("Relu", [picked]), [f"{picked}_n"]))
    count = g.shape_node("Cast", [g.shape_node("Shape", [picked])], to=TensorProto.FLOAT)
    return g.node("Add", [x, g.shape_node("Mul", [count, g.const(np.array(1e-3, F32))])], s)


def _scatter_nd(g, x, s):
    """x[:, idx] = f(x[:, idx]) as torch exports index_put: ScatterND with [batch, k, 2] indices of
    (Range over the batch, the positions), distinct positions (a repeat has no defined result)."""
    if len(s) < 3 or not g.fixed(x, 1) or s[1] < 2:
        return None
    k = int(g.rng.integers(1, s[1]))
    positions = np.sort(g.rng.permutation(s[1])[:k]).astype(np.int64)
    shape_of = g.shape_node("Shape", [x])
    batch = g.shape_node("Gather", [shape_of, g.const(np.array(0, np.int64))], axis=0)
    rows = g.shape_node("Range", [g.const(np.array(0, np.int64)), batch, g.const(np.array(1, np.int64))])
    target = g.shape_node("Concat", [g.shape_node("Unsqueeze", [batch, g.const(np.array([0], np.int64), "axes")]),
                                     g.const(np.array([k], np.int64))], axis=0)
    row_ids = g.shape_node("Expand", [g.shape_node("Unsqueeze", [rows, g.const(np.array([1], np.int64), "axes")]), target])
    cols = g.shape_node("Expand", [g.const(positions[None], "positions"), target])
    last = g.const(np.array([-1], np.int64), "axes")
    indices = g.shape_node("Concat", [g.shape_node("Unsqueeze", [row_ids, last]), g.shape_node("Unsqueeze", [cols, last])],
                           axis=-1)
    picked = g.shape_node("Gather", [x, g.const(positions, "positions")], axis=1)
    updates = g.shape_node("Tanh", [picked])
    return g.node("ScatterND", [x, indices, updates], s)
