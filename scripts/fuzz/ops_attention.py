"""Sequence forms reading the graph's int64 inputs: multi-head attention with exporters' masks,
masked fills, token and position embeddings."""

import numpy as np
from onnx import TensorProto

from .graph import F32


def _fits_mask(g, x, s) -> bool:
    """x's axis 1 is the mask's length: the input's own sequence axis."""
    return g.mask_length is not None and s[1] == g.mask_length and (1 in g.dyn[x]) == g.mask_varies


def _mask_bias(g, rank: int) -> str:
    """The exporters' additive mask: (1 - mask) * -10000 (or a Where to the dtype's lowest value),
    [batch, 1, ..., length] against scores of `rank`."""
    g.mask_used = True
    axes = g.const(np.array(list(range(1, rank - 1)), np.int64), "axes")
    if g.rng.integers(2):
        as_float = g.shape_node("Cast", ["mask"], to=TensorProto.FLOAT)
        inverted = g.shape_node("Sub", [g.const(np.array(1.0, F32)), as_float])
        return g.shape_node("Unsqueeze", [g.shape_node("Mul", [inverted, g.const(np.array(-10000.0, F32))]), axes])
    keep = g.shape_node("Unsqueeze", [g.shape_node("Cast", ["mask"], to=TensorProto.BOOL), axes])
    return g.shape_node("Where", [keep, g.const(np.array(0.0, F32)), g.const(np.array(np.finfo(F32).min, F32))])


def _mha(g, x, s):
    """Multi-head self-attention as exporters write it, in one of its variants: heads split by a
    Reshape with 0s, K transposed in one Transpose or two, the scale on the scores or on q, an
    optional additive mask, projections with or without biases."""
    if len(s) != 3 or not g.fixed(x, -1):
        return None
    d, length = s[2], s[1]
    heads = int(g.rng.choice([h for h in (1, 2, 4) if d % h == 0]))
    dh = d // heads
    dyn_len = 1 in g.dyn[x]

    def project(value, shape):
        y = g.node("MatMul", [value, g.weight(d, d)], shape)
        return g.node("Add", [y, g.const((0.1 * g.rng.standard_normal(d)).astype(F32))], shape) if g.rng.integers(2) else y

    def split_heads(value):
        four = g.node("Reshape", [value, g.const(np.array([0, 0, heads, dh], np.int64), "shape")],
                      (s[0], length, heads, dh), {1} if dyn_len else set())
        return four

    scale = 1 / np.sqrt(dh)
    q = split_heads(project(x, s))
    if g.rng.integers(3) == 0:  # scaled before the product
        q = g.node("Mul", [q, g.const(np.array(scale, F32))], g.shapes[q])
        scale = None
    q = g.node("Transpose", [q], (s[0], heads, length, dh), {2} if dyn_len else set(), perm=[0, 2, 1, 3])
    k = split_heads(project(x, s))
    if g.rng.integers(2):
        kt = g.node("Transpose", [k], (s[0], heads, dh, length), {3} if dyn_len else set(), perm=[0, 2, 3, 1])
    else:
        k = g.node("Transpose", [k], (s[0], heads, length, dh), {2} if dyn_len else set(), perm=[0, 2, 1, 3])
        kt = g.node("Transpose", [k], (s[0], heads, dh, length), {3} if dyn_len else set(), perm=[0, 1, 3, 2])
    score_shape, score_dyn = (s[0], heads, length, length), ({2, 3} if dyn_len else set())
    scores = g.node("MatMul", [q, kt], score_shape, score_dyn)
    if scale is not None:
        if g.rng.integers(2):
            scores = g.node("Mul", [scores, g.const(np.array(scale, F32))], score_shape)
        else:
            scores = g.node("Div", [scores, g.const(np.array(1 / scale, F32))], score_shape)
    if _fits_mask(g, x, s) and g.rng.integers(3):
        scores = g.node("Add", [scores, _mask_bias(g, 4)], score_shape)
    probs = g.node("Softmax", [scores], score_shape, axis=-1)
    v = g.node("Transpose", [split_heads(project(x, s))], (s[0], heads, length, dh), {2} if dyn_len else set(),
               perm=[0, 2, 1, 3])
    context = g.node("MatMul", [probs, v], (s[0], heads, length, dh), {2} if dyn_len else set())
    merged = g.node("Transpose", [context], (s[0], length, heads, dh), {1} if dyn_len else set(), perm=[0, 2, 1, 3])
    flat = g.node("Reshape", [merged, g.const(np.array([0, 0, d], np.int64), "shape")], s, g.dyn[x])
    return project(flat, s)


def _masked_fill(g, x, s):
    """Padding positions of a sequence set to a constant, as pooling heads do before a mean / max."""
    if len(s) != 3 or not _fits_mask(g, x, s):
        return None
    g.mask_used = True
    keep = g.shape_node("Unsqueeze", [g.shape_node("Cast", ["mask"], to=TensorProto.BOOL),
                                      g.const(np.array([2], np.int64), "axes")])
    return g.node("Where", [keep, x, g.const(np.array(0.0 if g.rng.integers(2) else -1e4, F32))], s)


VOCAB, MAX_POSITIONS = 50, 32


def _embeddings(g, x, s):
    """x plus token and position embeddings read off an int64 ids input, positions either gathered
    at Range(0, seq) of the ids' Shape (TorchScript) or sliced as table[:seq] (dynamo)."""
    if len(s) != 3 or not g.fixed(x, -1) or not _fits_mask(g, x, s):
        return None
    g.ids_used = True
    d = s[2]
    tokens = g.node("Gather", [g.weight(VOCAB, d, scale=1.0), "ids"], s, g.dyn[x], axis=0)
    length = g.shape_node("Gather", [g.shape_node("Shape", ["ids"]), g.const(np.array(1, np.int64))], axis=0)
    table = g.weight(MAX_POSITIONS, d, scale=1.0)
    if g.rng.integers(2):
        positions = g.shape_node("Range", [g.const(np.array(0, np.int64)), length, g.const(np.array(1, np.int64))])
        pos = g.node("Gather", [table, positions], (s[1], d), {0} if 1 in g.dyn[x] else set(), axis=0)
    else:
        end = g.shape_node("Unsqueeze", [length, g.const(np.array([0], np.int64), "axes")])
        pos = g.node("Slice", [table, g.const(np.array([0], np.int64)), end, g.const(np.array([0], np.int64))],
                     (s[1], d), {0} if 1 in g.dyn[x] else set())
    del g.shapes[pos], g.dyn[pos]  # rank 2 without a batch: not for the other ops
    return g.node("Add", [x, g.node("Add", [tokens, pos], s, g.dyn[x])], s, g.dyn[x])
