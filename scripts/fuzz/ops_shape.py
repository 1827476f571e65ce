"""Data movement and indexing forms: reshapes, transposes, slices, concat / split, gather, pad, tile,
expand, and the exporters' Shape-computed reshapes; CumSum and TopK."""

import numpy as np
from onnx import helper

from .graph import F32


def _transpose(g, x, s):
    rest = list(g.rng.permutation(range(1, len(s))))  # the batch stays first
    perm = [0, *[int(p) for p in rest]]
    dyn = {i for i, p in enumerate(perm) if p in g.dyn[x]}
    return g.node("Transpose", [x], tuple(s[p] for p in perm), dyn, perm=perm)


def _reshape_merge(g, x, s):
    if len(s) < 3 or not g.fixed(x, -1, -2):
        return None
    shape = (*s[:-2], s[-2] * s[-1])
    # 0 copies a leading dim (the batch, a varying length); -1 in its place is solved at run time
    kept = [0] * (len(s) - 2)
    if g.rng.integers(2) and len(kept) == 1:
        kept = [-1]
    target = [*kept, s[-2] * s[-1]]
    return g.node("Reshape", [x, g.const(np.array(target, np.int64), "shape")], shape, g.dyn[x])


def _reshape_split(g, x, s):
    last = s[-1]
    if last % 2 or len(s) > 3 or not g.fixed(x, -1):
        return None
    shape = (*s[:-1], 2, last // 2)
    target = [0] * (len(s) - 1) + [2, last // 2]
    return g.node("Reshape", [x, g.const(np.array(target, np.int64), "shape")], shape, g.dyn[x])


def _concat(g, x, s):
    axis = int(g.rng.integers(1, len(s)))
    other = g.node("Relu", [x], s) if g.rng.integers(2) else x
    shape = tuple(d * 2 if i == axis else d for i, d in enumerate(s))
    return g.node("Concat", [x, other], shape, axis=axis)


def _slice(g, x, s):
    axis = int(g.rng.integers(1, len(s)))
    size = s[axis]
    if size < 2 or not g.fixed(x, axis):
        return None
    step = int(g.rng.choice([1, 1, 2, -1]))
    if step > 0:
        start = int(g.rng.integers(0, size - 1))
        end = int(g.rng.integers(start + 1, size + 1))
    else:  # ONNX clamps a negative end as Python's slices do
        start, end = size - 1, int(g.rng.integers(-size - 1, size - 1))
    length = len(range(size)[slice(start, end, step)])
    if length < 1:
        return None
    shape = tuple(length if i == axis else d for i, d in enumerate(s))
    return g.node("Slice", [x, *(g.const(np.array([v], np.int64), k) for k, v in
                                 (("starts", start), ("ends", end), ("axes", axis), ("steps", step)))], shape)


def _unsqueeze_squeeze(g, x, s):
    axis = int(g.rng.integers(1, len(s) + 1))
    axes = g.const(np.array([axis], np.int64), "axes")
    y = g.node("Unsqueeze", [x, axes], (*s[:axis], 1, *s[axis:]), {a + (a >= axis) for a in g.dyn[x]})
    return g.node("Squeeze", [y, axes], s, g.dyn[x]) if g.rng.integers(2) else y


def _where(g, x, s):
    if not g.fixed(x, *range(1, len(s))):
        return None
    mask = g.const(g.rng.integers(0, 2, size=s[1:]).astype(bool), "mask")
    return g.node("Where", [mask, x, g.const(np.array(-1e4 if g.rng.integers(2) else 0.0, F32))], s)


def _flatten(g, x, s):
    return g.node("Flatten", [x], (s[0], int(np.prod(s[1:]))), {1} if g.dyn[x] else set(), axis=1) if len(s) > 2 else None


def _pad(g, x, s):
    pads = [0] * (2 * len(s))
    axis = int(g.rng.integers(1, len(s)))
    pads[axis], pads[len(s) + axis] = int(g.rng.integers(0, 3)), int(g.rng.integers(0, 3))
    mode = str(g.rng.choice(["constant", "reflect", "edge"]))
    if mode == "reflect" and max(pads[axis], pads[len(s) + axis]) >= s[axis]:
        mode = "constant"
    shape = tuple(d + pads[i] + pads[len(s) + i] for i, d in enumerate(s))
    return g.node("Pad", [x, g.const(np.array(pads, np.int64), "pads")], shape, mode=mode)


def _shape_reshape(g, x, s):
    """The exporters' form: the target shape computed from Shape(x), so a varying dim stays one."""
    if len(s) < 3:
        return None
    r = len(s)
    shape_of = g.shape_node("Shape", [x])
    lead = g.shape_node("Slice", [shape_of, g.const(np.array([0], np.int64)), g.const(np.array([r - 2], np.int64))])
    tail = g.shape_node("Slice", [shape_of, g.const(np.array([r - 2], np.int64)), g.const(np.array([r], np.int64))])
    target = g.shape_node("Concat", [lead, g.shape_node("ReduceProd", [tail], keepdims=1)], axis=0)
    merged = {a for a in g.dyn[x] if a < r - 2} | ({r - 2} if {r - 2, r - 1} & g.dyn[x] else set())
    return g.node("Reshape", [x, target], (*s[:-2], s[-2] * s[-1]), merged)


def _split(g, x, s):
    axes = [a for a in range(1, len(s)) if s[a] % 2 == 0 and g.fixed(x, a)]
    if not axes:
        return None
    axis = int(g.rng.choice(axes))
    half = tuple(d // 2 if i == axis else d for i, d in enumerate(s))
    first, second = g.name("split"), g.name("split")
    g.nodes.append(helper.make_node("Split", [x, g.const(np.array([s[axis] // 2] * 2, np.int64), "sizes")],
                                    [first, second], name=first, axis=axis))
    for name in (first, second):
        g.shapes[name], g.dyn[name] = half, g.dyn[x]
    return g.node(str(g.rng.choice(["Add", "Mul", "Max"])), [first, second], half)  # no Sub: see _residual


def _expand(g, x, s):
    # not the last axis: rows of equal values normalize to rounding noise over sqrt(eps), an
    # ill-conditioned output where no two correct implementations agree
    ones = [a for a in range(1, len(s) - 1) if s[a] == 1]
    if not ones:
        return None
    axis = int(g.rng.choice(ones))
    target = [1] * len(s)
    target[axis] = 3
    return g.node("Expand", [x, g.const(np.array(target, np.int64), "shape")],
                  tuple(3 if i == axis else d for i, d in enumerate(s)))


def _tile(g, x, s):
    axis = int(g.rng.integers(1, len(s)))
    repeats = [1] * len(s)
    repeats[axis] = 2
    return g.node("Tile", [x, g.const(np.array(repeats, np.int64), "repeats")],
                  tuple(2 * d if i == axis else d for i, d in enumerate(s)))


def _gather(g, x, s):
    axes = [a for a in range(1, len(s)) if g.fixed(x, a)]
    if not axes:
        return None
    axis = int(g.rng.choice(axes))
    if g.rng.integers(3) == 0 and len(s) > 2:  # a scalar index drops the axis
        index = int(g.rng.integers(-s[axis], s[axis]))
        dyn = {a - (a > axis) for a in g.dyn[x]}
        return g.node("Gather", [x, g.const(np.array(index, np.int64), "index")],
                      tuple(d for i, d in enumerate(s) if i != axis), dyn, axis=axis)
    indices = g.rng.integers(-s[axis], s[axis], size=int(g.rng.integers(1, 6)))
    return g.node("Gather", [x, g.const(indices.astype(np.int64), "indices")],
                  tuple(len(indices) if i == axis else d for i, d in enumerate(s)), axis=axis)


def _cumsum(g, x, s):
    axis = int(g.rng.integers(1, len(s)))
    return g.node("CumSum", [x, g.const(np.array(axis, np.int64), "axis")], s, exclusive=int(g.rng.integers(2)),
                  reverse=int(g.rng.integers(2)))


def _topk(g, x, s):
    if not g.fixed(x, -1) or s[-1] < 3:
        return None
    k = int(g.rng.integers(1, s[-1]))
    values, indices = g.name("topk"), g.name("topk_i")
    g.nodes.append(helper.make_node("TopK", [x, g.const(np.array([k], np.int64), "k")], [values, indices], name=values,
                                    axis=-1, largest=int(g.rng.integers(2))))
    g.shapes[values], g.dyn[values] = (*s[:-1], k), g.dyn[x]
    return values
