"""Normalizations, whole and decomposed as exporters write them, softmax and reductions."""

import numpy as np

from .graph import F32


def _softmax(g, x, s):
    axis = int(g.rng.choice([-1, len(s) - 1, 1] if len(s) > 1 else [-1]))
    return g.node(str(g.rng.choice(["Softmax", "LogSoftmax"])), [x], s, axis=axis)


def _layernorm_decomposed(g, x, s):
    if not g.fixed(x, -1):
        return None
    d = s[-1]
    mean = g.node("ReduceMean", [x], (*s[:-1], 1), axes=[-1])
    centered = g.node("Sub", [x, mean], s)
    square = g.node("Pow", [centered, g.const(np.array(2.0, F32))], s)
    var = g.node("ReduceMean", [square], (*s[:-1], 1), axes=[-1])
    std = g.node("Sqrt", [g.node("Add", [var, g.const(np.array(1e-5, F32))], (*s[:-1], 1))], (*s[:-1], 1))
    normed = g.node("Div", [centered, std], s)
    scaled = g.node("Mul", [normed, g.const((1 + 0.1 * g.rng.standard_normal(d)).astype(F32))], s)
    return g.node("Add", [scaled, g.const((0.1 * g.rng.standard_normal(d)).astype(F32))], s)


def _layernorm(g, x, s):
    if not g.fixed(x, -1):
        return None
    d = s[-1]
    return g.node("LayerNormalization", [x, g.const((1 + 0.1 * g.rng.standard_normal(d)).astype(F32)),
                                         g.const((0.1 * g.rng.standard_normal(d)).astype(F32))], s, axis=-1,
                  epsilon=1e-5)


def _rmsnorm(g, x, s):
    if not g.fixed(x, -1):
        return None
    square = g.node("Pow", [x, g.const(np.array(2.0, F32))], s)
    mean = g.node("ReduceMean", [square], (*s[:-1], 1), axes=[-1])
    inv = g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [mean, g.const(np.array(1e-6, F32))], (*s[:-1], 1))],
                                       (*s[:-1], 1))], (*s[:-1], 1))
    return g.node("Mul", [g.node("Mul", [x, inv], s), g.const((1 + 0.1 * g.rng.standard_normal(s[-1])).astype(F32))], s)


def _group_norm_decomposed(g, x, s):
    if len(s) != 4 or not g.fixed(x, 1) or s[1] % 2:
        return None
    c, groups = s[1], 2
    grouped = g.node("Reshape", [x, g.const(np.array([0, groups, -1], np.int64), "shape")], (s[0], groups, c // 2 * s[2] * s[3]),
                     {2} if g.dyn[x] else set())
    mean = g.node("ReduceMean", [grouped], (s[0], groups, 1), set(), axes=[2])
    centered = g.node("Sub", [grouped, mean], g.shapes[grouped])
    var = g.node("ReduceMean", [g.node("Mul", [centered, centered], g.shapes[grouped])], (s[0], groups, 1), set(), axes=[2])
    normed = g.node("Div", [centered, g.node("Sqrt", [g.node("Add", [var, g.const(np.array(1e-5, F32))], (s[0], groups, 1))],
                                                   (s[0], groups, 1))], g.shapes[grouped])
    back = g.node("Reshape", [normed, g.shape_node("Shape", [x])], s, g.dyn[x])
    scale = g.const((1 + 0.1 * g.rng.standard_normal((c, 1, 1))).astype(F32))
    return g.node("Add", [g.node("Mul", [back, scale], s), g.const((0.1 * g.rng.standard_normal((c, 1, 1))).astype(F32))], s)


def _instance_norm(g, x, s):
    if len(s) not in (3, 4) or not g.fixed(x, 1):
        return None
    c = s[1]
    return g.node("InstanceNormalization", [x, g.const((1 + 0.1 * g.rng.standard_normal(c)).astype(F32)),
                                            g.const((0.1 * g.rng.standard_normal(c)).astype(F32))], s, epsilon=1e-5)


def _batchnorm(g, x, s):
    if len(s) != 4 or not g.fixed(x, 1):
        return None
    c = s[1]
    parts = [(1 + 0.1 * g.rng.standard_normal(c)), 0.1 * g.rng.standard_normal(c), 0.1 * g.rng.standard_normal(c),
             0.5 + g.rng.random(c)]
    return g.node("BatchNormalization", [x, *(g.const(p.astype(F32)) for p in parts)], s, epsilon=1e-5)


def _reduce(g, x, s):
    op = str(g.rng.choice(["ReduceMean", "ReduceMax", "ReduceSum", "ReduceL2"]))
    axis = int(g.rng.integers(1, len(s)))
    keep = int(g.rng.integers(2))
    shape = tuple(1 if i == axis else d for i, d in enumerate(s)) if keep else tuple(d for i, d in enumerate(s) if i != axis)
    if len(shape) < 2:
        return None
    dyn = {a if keep or a < axis else a - 1 for a in g.dyn[x] if a != axis}
    if op == "ReduceSum":  # axes an input since opset 13
        return g.node(op, [x, g.const(np.array([axis], np.int64), "axes")], shape, dyn, keepdims=keep)
    return g.node(op, [x], shape, dyn, axes=[axis], keepdims=keep)


def _reduce_spatial(g, x, s):
    if len(s) != 4:
        return None
    op = str(g.rng.choice(["ReduceMean", "ReduceMax", "ReduceSumSquare"]))
    shape = (*s[:2], 1, 1)
    return g.node(op, [x], shape, {a for a in g.dyn[x] if a < 2}, axes=[2, 3], keepdims=1)
