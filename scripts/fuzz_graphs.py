"""Differential fuzzing: random small ONNX graphs through `infc optimize` and `infc build`, each
checked against onnxruntime on the original graph.

Single-op conformance is the ONNX backend node tests' job (docs/backend-node-tests.md); what they
cannot reach is how ops combine: a fusion that fires on a chain it should not, a layout pass that
moves a transpose past an op that cares, a kernel fed a strided view, a shape solved at one size
and wrong at another. Each graph draws 3-16 ops from OPS (rules as data: an op applies to a tensor
of some rank and returns the new tensor's shape and which of its axes vary) over one input whose
batch, and sometimes its length or height and width, are symbolic; it branches off earlier values
and exposes every unused value (and sometimes an interior one). Checked:

  optimize   the optimized model in onnxruntime (its own optimizations on) at min, opt and max;
  plan       a CPU plan on infc's own kernels (no whole-model variant, no fallback where it builds)
             at the profile's min, opt and max shapes.

A difference past 1e-4 of an output's largest value is a finding only when infc is also ten times
farther from a float64 run of the model than onnxruntime's float32 run is: random graphs make
ill-conditioned outputs (rounding noise over sqrt(eps), 1 + erf(-5)) where onnxruntime's own
float32 answer is no more right than infc's.

    python scripts/fuzz_graphs.py --seeds 0-199 [--keep DIR] [--json]

A failing seed prints one line and, with --keep, leaves its model and profile in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter
from onnx import TensorProto, helper, numpy_helper

os.environ.setdefault("INFC_WHOLE_MODEL", "0")  # infc's own kernels, not onnxruntime on the whole model

F32 = np.float32
BATCHES = {"min": 1, "opt": 2, "max": 3}
RTOL = 1e-4
ROUGH_RTOL = 1e-3


@dataclass
class Graph:
    rng: np.random.Generator
    nodes: list = field(default_factory=list)
    inits: dict = field(default_factory=dict)
    shapes: dict = field(default_factory=dict)  # value -> shape at batch 1 (dim 0 is the batch)
    dyn: dict = field(default_factory=dict)  # value -> its axes (besides the batch) that vary with the profile
    count: int = 0
    mask_length: int | None = None  # an attention mask input [batch, length] the graph may take
    mask_varies: bool = False
    mask_used: bool = False
    ids_used: bool = False  # token ids [batch, length] beside the mask

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def const(self, array, stem: str = "c") -> str:
        name = self.name(stem)
        self.inits[name] = np.asarray(array)
        return name

    def weight(self, *shape, scale: float | None = None) -> str:
        scale = scale if scale is not None else 1.0 / np.sqrt(max(1, shape[0]))
        return self.const((self.rng.standard_normal(shape) * scale).astype(F32), "w")

    def node(self, op: str, inputs: list[str], shape: tuple, dyn=None, **attrs) -> str:
        """`dyn`: the output's varying axes; by default its first input's, where ranks agree."""
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        self.shapes[out] = tuple(shape)
        if dyn is None:
            source = next((i for i in inputs if i in self.shapes), None)
            dyn = self.dyn.get(source, frozenset()) if source and len(self.shapes[source]) == len(shape) else frozenset()
        self.dyn[out] = frozenset(dyn)
        return out

    def shape_node(self, op: str, inputs: list[str], **attrs) -> str:
        """A node of the shape arithmetic: integers, not a value for the float ops to take."""
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def fixed(self, x: str, *axes: int) -> bool:
        """None of `axes` of x varies: a constant may be shaped by them."""
        rank = len(self.shapes[x])
        return not any(a % rank in self.dyn.get(x, ()) for a in axes)


# --- the op table: name -> (ranks it applies to, builder(graph, x, shape) -> new value or None) ---

def _unary(op, **attrs):
    return lambda g, x, s: g.node(op, [x], s, **attrs)


def _binary_const(op):
    def build(g, x, s):
        kind = g.rng.integers(3)
        if (kind == 0 and not g.fixed(x, -1)) or (kind == 2 and not g.fixed(x, -1, -2)):
            kind = 1
        shape = (s[-1],) if kind == 0 else () if kind == 1 else (1,) * (len(s) - 2) + s[-2:]
        value = g.rng.standard_normal(shape).astype(F32)
        if op == "Div":
            value = np.sign(value) * (np.abs(value) + 0.5)
        other = g.const(value)
        inputs = [other, x] if op in ("Add", "Mul") and g.rng.integers(2) else [x, other]
        return g.node(op, inputs, s)
    return build


def _residual(g, x, s):
    same = [v for v, shape in g.shapes.items() if shape == s and v != x and g.dyn[v] == g.dyn[x]]
    if not same:
        return None
    # no Sub: x - (x rounded to fp16) is all rounding error, relative to nothing
    return g.node(str(g.rng.choice(["Add", "Mul", "Max", "Min"])), [x, str(g.rng.choice(same))], s)


def _matmul(g, x, s):
    if not g.fixed(x, -1):
        return None
    n = int(g.rng.choice([4, 8, 16, 24]))
    y = g.node("MatMul", [x, g.weight(s[-1], n)], (*s[:-1], n))
    if g.rng.integers(2):
        y = g.node("Add", [y, g.const(g.rng.standard_normal(n).astype(F32))], (*s[:-1], n))
    return y


def _gemm(g, x, s):
    if len(s) != 2 or not g.fixed(x, 1):
        return None
    n = int(g.rng.choice([4, 8, 16]))
    trans_b = int(g.rng.integers(2))
    w = g.weight(*((n, s[1]) if trans_b else (s[1], n)))
    return g.node("Gemm", [x, w, g.const(g.rng.standard_normal(n).astype(F32))], (s[0], n), transB=trans_b,
                  alpha=float(g.rng.choice([1.0, 0.5])), beta=float(g.rng.choice([1.0, 2.0])))


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


def _gelu_erf(g, x, s):
    half = g.node("Mul", [x, g.const(np.array(0.5, F32))], s)
    erf = g.node("Erf", [g.node("Div", [x, g.const(np.array(np.sqrt(2.0), F32))], s)], s)
    return g.node("Mul", [half, g.node("Add", [erf, g.const(np.array(1.0, F32))], s)], s)


def _silu(g, x, s):
    return g.node("Mul", [x, g.node("Sigmoid", [x], s)], s)


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


def _clip(g, x, s):
    return g.node("Clip", [x, g.const(np.array(-0.5, F32)), g.const(np.array(0.7, F32))], s)


# Not in OPS: rounding to fp16 turns a 1e-7 difference before it into a whole fp16 step (5e-4) after
# it, so graphs with it fail the float32 tolerance for nothing; kept for runs that add it back.
def _cast_round_trip(g, x, s):
    half = g.node("Cast", [x], s, to=TensorProto.FLOAT16)
    out = g.node("Cast", [half], s, to=TensorProto.FLOAT)
    del g.shapes[half], g.dyn[half]  # not a float32 value for later ops to take
    return out


def _attention(g, x, s):
    if len(s) != 3 or not g.fixed(x, -1):
        return None
    d = s[-1]
    q, k, v = (g.node("MatMul", [x, g.weight(d, d)], s) for _ in range(3))
    both = {1, 2} if 1 in g.dyn[x] else set()
    kt = g.node("Transpose", [k], (s[0], d, s[1]), {2} & both or set(), perm=[0, 2, 1])
    scores = g.node("Mul", [g.node("MatMul", [q, kt], (s[0], s[1], s[1]), both),
                            g.const(np.array(1 / np.sqrt(d), F32))], (s[0], s[1], s[1]))
    return g.node("MatMul", [g.node("Softmax", [scores], (s[0], s[1], s[1]), axis=-1), v], s)


def _conv(g, x, s):
    if len(s) != 4 or not g.fixed(x, 1):
        return None
    c = s[1]
    kernel = int(g.rng.choice([1, 3, 3, 5]))
    stride = int(g.rng.choice([1, 1, 2]))
    dilation = int(g.rng.choice([1, 1, 2])) if kernel > 1 else 1
    pad = (kernel // 2) * dilation if g.rng.integers(4) else 0
    group = int(g.rng.choice([1, 1, c])) if c > 1 else 1
    out = int(g.rng.choice([c, 8, 16])) if group == 1 else c
    span = dilation * (kernel - 1) + 1
    h, w = ((d + 2 * pad - span) // stride + 1 for d in s[2:])
    if h < 2 or w < 2:
        return None
    inputs = [x, g.weight(out, c // group, kernel, kernel, scale=1.0 / np.sqrt(c // group * kernel * kernel))]
    if g.rng.integers(2):
        inputs.append(g.const(g.rng.standard_normal(out).astype(F32)))
    return g.node("Conv", inputs, (s[0], out, h, w), kernel_shape=[kernel, kernel], strides=[stride, stride],
                  pads=[pad] * 4, dilations=[dilation, dilation], group=group)


def _batchnorm(g, x, s):
    if len(s) != 4 or not g.fixed(x, 1):
        return None
    c = s[1]
    parts = [(1 + 0.1 * g.rng.standard_normal(c)), 0.1 * g.rng.standard_normal(c), 0.1 * g.rng.standard_normal(c),
             0.5 + g.rng.random(c)]
    return g.node("BatchNormalization", [x, *(g.const(p.astype(F32)) for p in parts)], s, epsilon=1e-5)


def _pool(g, x, s):
    if len(s) != 4:
        return None
    op = str(g.rng.choice(["MaxPool", "AveragePool", "GlobalAveragePool"]))
    if op == "GlobalAveragePool":
        return g.node(op, [x], (*s[:2], 1, 1))
    kernel, stride = int(g.rng.choice([2, 3])), int(g.rng.choice([1, 2]))
    pad = int(g.rng.integers(0, kernel // 2 + 1))
    h, w = ((d + 2 * pad - kernel) // stride + 1 for d in s[2:])
    if h < 2 or w < 2:
        return None
    extra = {"count_include_pad": int(g.rng.integers(2))} if op == "AveragePool" else {}
    return g.node(op, [x], (*s[:2], h, w), kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4,
                  **extra)


def _resize(g, x, s):
    if len(s) != 4:
        return None
    mode = str(g.rng.choice(["nearest", "linear"]))
    scales = g.const(np.array([1, 1, 2, 2], F32), "scales")
    return g.node("Resize", [x, "", scales], (*s[:2], s[2] * 2, s[3] * 2), mode=mode)


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


def _matmul_self(g, x, s):
    if len(s) < 3:
        return None
    perm = list(range(len(s)))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    dyn = {perm.index(a) for a in g.dyn[x]}
    xt = g.node("Transpose", [x], tuple(s[p] for p in perm), dyn, perm=perm)
    rows = (s[-2], s[-2])
    out_dyn = {a for a in g.dyn[x] if a < len(s) - 2} | ({len(s) - 2, len(s) - 1} if len(s) - 2 in g.dyn[x] else set())
    scaled = g.node("Mul", [x, g.const(np.array(1 / np.sqrt(s[-1]), F32))], s)
    return g.node("MatMul", [scaled, xt], (*s[:-2], *rows), out_dyn)


def _conv_transpose(g, x, s):
    if len(s) != 4 or not g.fixed(x, 1):
        return None
    c, out = s[1], int(g.rng.choice([4, 8]))
    kernel, stride = int(g.rng.choice([2, 3, 4])), int(g.rng.choice([1, 2]))
    pad = int(g.rng.integers(0, kernel // 2 + 1))
    extra = int(g.rng.integers(0, stride)) if stride > 1 else 0
    h, w = ((d - 1) * stride - 2 * pad + kernel + extra for d in s[2:])
    if h < 2 or w < 2:
        return None
    return g.node("ConvTranspose", [x, g.weight(c, out, kernel, kernel, scale=1.0 / np.sqrt(c * kernel))],
                  (s[0], out, h, w), kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4,
                  output_padding=[extra, extra])


def _instance_norm(g, x, s):
    if len(s) not in (3, 4) or not g.fixed(x, 1):
        return None
    c = s[1]
    return g.node("InstanceNormalization", [x, g.const((1 + 0.1 * g.rng.standard_normal(c)).astype(F32)),
                                            g.const((0.1 * g.rng.standard_normal(c)).astype(F32))], s, epsilon=1e-5)


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


def _prelu(g, x, s):
    if len(s) == 4 and g.fixed(x, 1):
        slope = g.rng.uniform(0, 0.5, (s[1], 1, 1))
    elif g.fixed(x, -1):
        slope = g.rng.uniform(0, 0.5, (s[-1],))
    else:
        return None
    return g.node("PRelu", [x, g.const(slope.astype(F32))], s)


def _variadic(g, x, s):
    same = [v for v, shape in g.shapes.items() if shape == s and g.dyn[v] == g.dyn[x]]
    return g.node(str(g.rng.choice(["Sum", "Mean", "Max", "Min"])), [x, *(str(v) for v in g.rng.choice(same, 2))], s)


def _powers(g, x, s):
    kind = int(g.rng.integers(4))
    if kind == 0:
        return g.node("Pow", [x, g.const(np.array(2.0, F32))], s)
    if kind == 1:
        return g.node("Sqrt", [g.node("Add", [g.node("Abs", [x], s), g.const(np.array(0.1, F32))], s)], s)
    if kind == 2:
        return g.node("Reciprocal", [g.node("Add", [g.node("Abs", [x], s), g.const(np.array(1.0, F32))], s)], s)
    return g.node("Exp", [g.node("Tanh", [x], s)], s)


def _depth_space(g, x, s):
    if len(s) != 4 or not g.fixed(x, 1):
        return None
    if s[1] % 4 == 0 and g.rng.integers(2):
        mode = str(g.rng.choice(["DCR", "CRD"]))
        return g.node("DepthToSpace", [x], (s[0], s[1] // 4, 2 * s[2], 2 * s[3]), blocksize=2, mode=mode)
    if s[2] % 2 == 0 and s[3] % 2 == 0 and g.fixed(x, 2, 3):
        return g.node("SpaceToDepth", [x], (s[0], 4 * s[1], s[2] // 2, s[3] // 2), blocksize=2)
    return None


def _reduce_spatial(g, x, s):
    if len(s) != 4:
        return None
    op = str(g.rng.choice(["ReduceMean", "ReduceMax", "ReduceSumSquare"]))
    shape = (*s[:2], 1, 1)
    return g.node(op, [x], shape, {a for a in g.dyn[x] if a < 2}, axes=[2, 3], keepdims=1)


def _conv1d(g, x, s):
    if len(s) != 3 or not g.fixed(x, 1):
        return None
    c, kernel = s[1], int(g.rng.choice([1, 3, 5]))
    stride, group = int(g.rng.choice([1, 1, 2])), int(g.rng.choice([1, c]))
    out = int(g.rng.choice([c, 8])) if group == 1 else c
    pad = kernel // 2
    length = (s[2] + 2 * pad - kernel) // stride + 1
    if length < 2:
        return None
    return g.node("Conv", [x, g.weight(out, c // group, kernel, scale=1.0 / np.sqrt(c // group * kernel)),
                           g.const(g.rng.standard_normal(out).astype(F32))], (s[0], out, length),
                  kernel_shape=[kernel], strides=[stride], pads=[pad, pad], group=group)


def _gelu_tanh(g, x, s):
    cube = g.node("Mul", [g.node("Mul", [x, x], s), x], s)
    inner = g.node("Add", [x, g.node("Mul", [cube, g.const(np.array(0.044715, F32))], s)], s)
    t = g.node("Tanh", [g.node("Mul", [inner, g.const(np.array(np.sqrt(2 / np.pi), F32))], s)], s)
    return g.node("Mul", [g.node("Mul", [x, g.const(np.array(0.5, F32))], s),
                          g.node("Add", [t, g.const(np.array(1.0, F32))], s)], s)


def _rmsnorm(g, x, s):
    if not g.fixed(x, -1):
        return None
    square = g.node("Pow", [x, g.const(np.array(2.0, F32))], s)
    mean = g.node("ReduceMean", [square], (*s[:-1], 1), axes=[-1])
    inv = g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [mean, g.const(np.array(1e-6, F32))], (*s[:-1], 1))],
                                       (*s[:-1], 1))], (*s[:-1], 1))
    return g.node("Mul", [g.node("Mul", [x, inv], s), g.const((1 + 0.1 * g.rng.standard_normal(s[-1])).astype(F32))], s)


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


BRANCH_OPS = ("relu", "sigmoid", "tanh", "add", "mul", "gelu", "silu", "softmax", "layernorm", "abs", "leaky",
              "hardswish", "powers", "clip", "rmsnorm")


def _if(g, x, s):
    """If on a value-dependent condition, each branch a short chain over x (an outer value); with
    even odds both branches name their output alike, as Optimum's merged decoders do."""
    # on the graph input: a sum of intermediate values can sit within rounding of 0 (a normalized
    # row sums to 0), and then infc and onnxruntime rightly take different branches
    total = g.shape_node("ReduceSum", ["x"], keepdims=0)
    cond = g.shape_node("Greater", [total, g.const(np.array(0.0, F32))])
    shared = f"{g.name('branch')}_out" if g.rng.integers(2) else None
    branches = []
    for k in range(2):
        start, known = len(g.nodes), set(g.shapes)
        y = x
        for _ in range(int(g.rng.integers(1, 4))):
            made = OPS[str(g.rng.choice(BRANCH_OPS))][1](g, y, s)
            if made is not None and g.shapes[made] == tuple(s):
                y = made
        inner = g.nodes[start:]
        del g.nodes[start:]
        for name in set(g.shapes) - known:  # the branch's values are not the main graph's
            del g.shapes[name], g.dyn[name]
        out = shared or g.name(f"branch{k}_out")
        inner.append(helper.make_node("Identity", [y], [out], name=out))
        branches.append(helper.make_graph(inner, f"branch{k}", [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)]))
    return g.node("If", [cond], s, g.dyn[x], then_branch=branches[0], else_branch=branches[1])


ANY = (2, 3, 4)
OPS = {
    "relu": (ANY, _unary("Relu")), "sigmoid": (ANY, _unary("Sigmoid")), "tanh": (ANY, _unary("Tanh")),
    "leaky": (ANY, _unary("LeakyRelu", alpha=0.1)), "hardswish": (ANY, _unary("HardSwish")),
    "hardsigmoid": (ANY, _unary("HardSigmoid", alpha=0.2, beta=0.5)), "softplus": (ANY, _unary("Softplus")),
    "abs": (ANY, _unary("Abs")), "neg": (ANY, _unary("Neg")), "elu": (ANY, _unary("Elu", alpha=1.0)),
    "add": (ANY, _binary_const("Add")), "mul": (ANY, _binary_const("Mul")), "sub": (ANY, _binary_const("Sub")),
    "div": (ANY, _binary_const("Div")), "residual": (ANY, _residual), "matmul": (ANY, _matmul),
    "gemm": ((2,), _gemm), "transpose": ((3, 4), _transpose), "merge": ((3, 4), _reshape_merge),
    "split": ((2, 3), _reshape_split), "softmax": (ANY, _softmax), "ln_decomposed": (ANY, _layernorm_decomposed),
    "layernorm": (ANY, _layernorm), "gelu": (ANY, _gelu_erf), "silu": (ANY, _silu), "reduce": ((3, 4), _reduce),
    "concat": (ANY, _concat), "slice": (ANY, _slice), "unsqueeze": ((2, 3), _unsqueeze_squeeze),
    "where": (ANY, _where), "clip": (ANY, _clip), "attention": ((3,), _attention),
    "conv": ((4,), _conv), "conv2": ((4,), _conv), "batchnorm": ((4,), _batchnorm), "pool": ((4,), _pool),
    "resize": ((4,), _resize), "flatten": ((3, 4), _flatten), "pad": (ANY, _pad),
    "shape_reshape": ((3, 4), _shape_reshape), "split_halves": (ANY, _split), "expand": (ANY, _expand),
    "tile": (ANY, _tile), "gather": (ANY, _gather), "matmul_self": ((3, 4), _matmul_self),
    "conv_transpose": ((4,), _conv_transpose), "instance_norm": ((3, 4), _instance_norm),
    "group_norm": ((4,), _group_norm_decomposed), "prelu": (ANY, _prelu), "variadic": (ANY, _variadic),
    "powers": (ANY, _powers), "depth_space": ((4,), _depth_space), "reduce_spatial": ((4,), _reduce_spatial),
    "conv1d": ((3,), _conv1d), "gelu_tanh": (ANY, _gelu_tanh), "rmsnorm": (ANY, _rmsnorm), "cumsum": (ANY, _cumsum),
    "topk": (ANY, _topk), "mha": ((3,), _mha), "mha2": ((3,), _mha), "masked_fill": ((3,), _masked_fill),
    "if": (ANY, _if), "embeddings": ((3,), _embeddings), "embeddings2": ((3,), _embeddings),
}
# (shape at the opt level, the axes that may vary): images of any height and width, sequences of any length
START_SHAPES = (((1, 6, 10, 12), {2, 3}), ((1, 4, 8, 8), {2, 3}), ((1, 12, 16), {1}), ((1, 7, 24), {1}), ((1, 20), set()))
AXIS_LEVELS = {"min": -2, "opt": 0, "max": 3}  # a varying axis' size at each level, from its opt size
DIM_NAMES = {1: "len", 2: "height", 3: "width"}
MAX_ELEMENTS = 1 << 16  # per value at batch 1: keeps a graph's build and run well under a second


def random_case(seed: int) -> tuple[onnx.ModelProto, dict[str, dict[str, list[int]]]]:
    """The seed's model and its inputs' shapes at each profile level."""
    rng = np.random.default_rng(seed)
    g = Graph(rng)
    start, varying = START_SHAPES[rng.integers(len(START_SHAPES))]
    varying = varying if rng.integers(2) else set()
    g.shapes["x"], g.dyn["x"] = start, frozenset(varying)
    if len(start) == 3 and rng.integers(2):  # a sequence may come with its attention mask
        g.mask_length, g.mask_varies = start[1], 1 in varying
    current = "x"
    for _ in range(int(rng.integers(3, 17))):
        if len(g.nodes) > 1 and rng.integers(4) == 0:  # branch off an earlier value
            current = str(rng.choice(list(g.shapes)))
        shape = g.shapes[current]
        choices = [k for k, (ranks, _) in OPS.items() if len(shape) in ranks]
        assert choices, f"no op takes rank {len(shape)} ({current})"
        for _attempt in range(8):
            made = OPS[str(rng.choice(choices))][1](g, current, shape)
            if made is not None and 0 < np.prod(g.shapes[made]) <= MAX_ELEMENTS:
                current = made
                break
    consumed = {i for n in g.nodes for i in n.input}
    outputs = [current] + [n.output[0] for n in g.nodes
                           if n.output[0] in g.shapes and n.output[0] not in consumed and n.output[0] != current]
    interior = [n.output[0] for n in g.nodes if n.output[0] in g.shapes and n.output[0] not in outputs]
    if interior and rng.integers(3) == 0:
        outputs.append(str(rng.choice(interior)))  # an interior value a fusion must keep

    def info(name, dims):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)

    def output_dims(name):
        return ["batch", *(f"{name}_{a}" if a in g.dyn[name] else d for a, d in enumerate(g.shapes[name]) if a)]

    inputs = [info("x", ["batch", *(DIM_NAMES[a] if a in varying else d for a, d in enumerate(start) if a)])]
    for name, used in (("mask", g.mask_used), ("ids", g.ids_used)):
        if used:
            inputs.append(helper.make_tensor_value_info(name, TensorProto.INT64,
                                                        ["batch", DIM_NAMES[1] if g.mask_varies else g.mask_length]))
    graph = helper.make_graph(g.nodes, f"fuzz_{seed}", inputs, [info(o, output_dims(o)) for o in outputs],
                              [numpy_helper.from_array(v, k) for k, v in g.inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    if seed % 2:  # odd seeds at opset 18, as dynamo writes it: reductions' axes, Split, Pad and Resize as inputs
        model = onnx.version_converter.convert_version(model, 18)
        onnx.checker.check_model(model, full_check=True)
    levels = {}
    for level in BATCHES:
        x = [BATCHES[level], *(d + AXIS_LEVELS[level] if a in varying else d for a, d in enumerate(start) if a)]
        levels[level] = {"x": x, **({"mask": x[:2]} if g.mask_used else {}), **({"ids": x[:2]} if g.ids_used else {})}
    return model, levels


def random_model(seed: int) -> onnx.ModelProto:
    return random_case(seed)[0]


def _feeds(shapes: dict[str, list[int]], seed: int) -> dict:
    """x normal; a mask of ones and zeros whose rows each keep their first position."""
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal(shapes["x"]).astype(F32)}
    if "mask" in shapes:
        mask = rng.integers(0, 2, size=shapes["mask"]).astype(np.int64)
        mask[:, 0] = 1
        feeds["mask"] = mask
    if "ids" in shapes:
        feeds["ids"] = rng.integers(0, VOCAB, size=shapes["ids"]).astype(np.int64)
    return feeds


def as_double(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model in float64: onnxruntime's float32 reference carries its own rounding (1 + tanh(-5)
    is 0 in float32), so a finding is an error well past what onnxruntime's float32 run makes."""
    double = onnx.ModelProto()
    double.CopyFrom(model)
    graph = double.graph
    _value_types_to_double(graph)
    float_only = {n.input[2] for n in graph.node if n.op_type == "Resize" and len(n.input) > 2}  # scales
    for index, tensor in enumerate(graph.initializer):
        if tensor.data_type == TensorProto.FLOAT and tensor.name not in float_only:
            graph.initializer[index].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64),
                                                                      tensor.name))
    _decompose_instance_norms(double)
    return double


def _value_types_to_double(graph: onnx.GraphProto) -> None:
    """Declared float32 values and Casts to float32 as float64, in If branches too."""
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.DOUBLE
            if attr.type == onnx.AttributeProto.GRAPH:
                _value_types_to_double(attr.g)


def _decompose_instance_norms(model: onnx.ModelProto) -> None:
    """InstanceNormalization as float64 primitives: onnxruntime has no float64 kernel for it, and its
    float32 one is far off on constant rows of large values (1e8 normalized to 0, not to the bias)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in [*inferred.graph.input, *inferred.graph.value_info]}
    nodes = []
    for node in model.graph.node:
        if node.op_type != "InstanceNormalization" or node.input[0] not in ranks:
            nodes.append(node)
            continue
        x, scale, bias = node.input
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        rank, stem = ranks[x], node.output[0]
        axes = list(range(2, rank))
        channel = numpy_helper.from_array(np.array([-1] + [1] * (rank - 2), np.int64), f"{stem}/channel")
        epsilon = numpy_helper.from_array(np.array(eps, np.float64), f"{stem}/eps")
        model.graph.initializer.extend([channel, epsilon])
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        if opset >= 18:  # axes an input
            model.graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), f"{stem}/axes"))

        def reduce_mean(x_in, out):
            if opset >= 18:
                return helper.make_node("ReduceMean", [x_in, f"{stem}/axes"], [out])
            return helper.make_node("ReduceMean", [x_in], [out], axes=axes)

        nodes += [reduce_mean(x, f"{stem}/mean"),
                  helper.make_node("Sub", [x, f"{stem}/mean"], [f"{stem}/centered"]),
                  helper.make_node("Mul", [f"{stem}/centered", f"{stem}/centered"], [f"{stem}/square"]),
                  reduce_mean(f"{stem}/square", f"{stem}/var"),
                  helper.make_node("Add", [f"{stem}/var", epsilon.name], [f"{stem}/var_eps"]),
                  helper.make_node("Sqrt", [f"{stem}/var_eps"], [f"{stem}/std"]),
                  helper.make_node("Div", [f"{stem}/centered", f"{stem}/std"], [f"{stem}/normed"]),
                  helper.make_node("Reshape", [scale, channel.name], [f"{stem}/scale"]),
                  helper.make_node("Reshape", [bias, channel.name], [f"{stem}/bias"]),
                  helper.make_node("Mul", [f"{stem}/normed", f"{stem}/scale"], [f"{stem}/scaled"]),
                  helper.make_node("Add", [f"{stem}/scaled", f"{stem}/bias"], list(node.output))]
        for index, made in enumerate(nodes[-11:]):
            made.name = f"{stem}/decomposed_{index}"
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def run_double(model: onnx.ModelProto, feeds_by_level: dict) -> tuple[dict | None, int]:
    """as_double's outputs at each level, and how many ops ran in float32: an op onnxruntime has no
    float64 kernel for (Conv, Erf, InstanceNormalization, ...) computes in float32 between casts, the
    rest in float64. Its own rounding then stays in the reference (onnxruntime's InstanceNormalization
    over one element is not exactly its bias)."""
    import re

    from infc.compiler.verify import ort_session

    double = as_double(model)
    names = [o.name for o in model.graph.output]
    for in_float32 in range(64):
        try:
            session = ort_session(double)
            return {level: session.run(names, {k: v.astype(np.float64) if v.dtype == F32 else v for k, v in feeds.items()})
                    for level, feeds in feeds_by_level.items()}, in_float32
        except Exception as exc:  # noqa: BLE001 - onnxruntime names the node it has no kernel for
            found = re.search(r"Could not find an implementation for (\w+)\(\d+\) node with name '([^']*)'", str(exc))
            if not found:
                return None, 0
            op, name = found.groups()
            # a node onnxruntime made expanding a function op has no name: the ops it comes from
            nodes = [name] if name else [n.name for n in double.graph.node if n.op_type in (op, *EXPANDED_FROM.get(op, ()))]
            for each in nodes:
                _in_float32(double, each)
    return None, 0


EXPANDED_FROM = {"HardSigmoid": ("HardSwish",)}  # onnxruntime runs HardSwish as its function body


def _in_float32(model: onnx.ModelProto, node_name: str) -> None:
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.input, *inferred.graph.value_info,
                                                            *inferred.graph.output]}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    nodes = []
    for node in model.graph.node:
        if node.name != node_name:
            nodes.append(node)
            continue
        original = list(node.input)
        for index, name in enumerate(original):
            if types.get(name) == TensorProto.DOUBLE:
                if name not in original[:index]:  # Mean(a, a, a) casts a once
                    nodes.append(helper.make_node("Cast", [name], [f"{name}/f32/{node_name}"], to=TensorProto.FLOAT))
                node.input[index] = f"{name}/f32/{node_name}"
        outputs = list(node.output)
        node.output[:] = [f"{o}/f32" for o in outputs]
        nodes.append(node)
        nodes += [helper.make_node("Cast", [f"{o}/f32"], [o], to=TensorProto.DOUBLE) for o in outputs]
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _worst(expected: list, actual: list) -> float:
    worst = 0.0
    for want, got in zip(expected, actual):
        want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
        if want.shape != got.shape:
            return float("inf")
        scale = max(np.abs(want).max(initial=0.0), 1e-6)
        worst = max(worst, float(np.abs(want - got).max(initial=0.0) / scale))
    return worst


def check_seed(seed: int, folder: Path) -> dict:
    import yaml

    from infc.compiler.build import BuildOptions, build
    from infc.compiler.errors import InfcError
    from infc.compiler.optimize import optimize_model
    from infc.compiler.runtime.session import PlanSession
    from infc.compiler.verify import ort_session

    model, levels = random_case(seed)
    names = [o.name for o in model.graph.output]
    reference = ort_session(model)  # onnxruntime's own fusions off: they have bugs of their own
    expected = {}
    for level, shape in levels.items():
        try:
            expected[level] = reference.run(names, _feeds(shape, seed))
        except Exception:  # noqa: BLE001 - a pooled size the min level makes empty: not a finding
            return {"seed": seed, "skipped": f"onnxruntime cannot run the model at the {level} shapes"}
    exact, in_float32 = run_double(model, {level: _feeds(shape, seed) for level, shape in levels.items()})
    # with ops of the reference in float32, only a gross error is a finding
    floor = ROUGH_RTOL if in_float32 else RTOL
    ops = [n.op_type for n in model.graph.node]
    result = {"seed": seed, "nodes": len(ops), "ops": ops, "findings": []}

    def judge(check: str, level: str, actual: list) -> None:
        result[check] = error = _worst(expected[level], actual)
        if error <= RTOL:
            return
        if exact is not None:  # as far from float64 as onnxruntime's own float32 run, give or take: no finding
            ours, theirs = _worst(exact[level], actual), _worst(exact[level], expected[level])
            result[f"{check}_vs_float64"] = [ours, theirs]
            if ours <= max(floor, 10 * theirs):
                return
        result["findings"].append(check)

    optimized = optimize_model(model).model
    try:  # as users run it: with onnxruntime's own fusions on top of infc's
        session = ort_session(optimized, optimize=True)
    except Exception:  # noqa: BLE001 - onnxruntime's optimizer failing on the original too is not ours
        try:
            ort_session(model, optimize=True)
        except Exception:  # noqa: BLE001
            return {"seed": seed, "skipped": "onnxruntime's optimizer fails on the original model"}
        raise
    for level, shape in levels.items():
        judge(f"optimize_{level}", level, session.run(names, _feeds(shape, seed)))
    path, profile, plan = folder / "model.onnx", folder / "profile.yaml", folder / "plan.bin"
    onnx.save(model, path)
    profile.write_text(yaml.safe_dump({"inputs": {name: {level: shapes[name] for level, shapes in levels.items()}
                                                  for name in levels["opt"]}}))
    options = BuildOptions(cache_dir=folder / "cache", use_cache=False, show_progress=False, allow_fallback=False)
    try:
        build(str(path), str(profile), str(plan), options)
        result["fallback"] = False
    except InfcError:  # an op without a native kernel: islands allowed
        options.allow_fallback = True
        build(str(path), str(profile), str(plan), options)
        result["fallback"] = True
    plan_session = PlanSession(plan)
    for level, shape in levels.items():
        outputs = plan_session.run(plan_session.check_feeds(_feeds(shape, seed), "fuzz"))
        judge(f"plan_{level}", level, [outputs[n] for n in names])
    return result


PRECISION_SLACK = 3  # fresh inputs may sit a little past the repair's own samples


def check_precision(seed: int, folder: Path, precision: str) -> dict:
    """A reduced-precision plan either keeps its error within the tolerance on fresh inputs at the
    opt shapes (the 99.9th percentile of element errors, as the repair budgets it, with slack) or
    said it does not (plan metadata `accuracy.within_tolerance`, a build warning): never silently off."""
    import yaml

    from infc.compiler.build import BuildOptions, build
    from infc.compiler.build_precision import DEFAULT_TOLERANCE
    from infc.compiler.plan.format import read_plan
    from infc.compiler.quantize.accuracy import compare_runs, worst
    from infc.compiler.runtime.session import PlanSession
    from infc.compiler.verify import ort_session

    model, levels = random_case(seed)
    names = [o.name for o in model.graph.output]
    feeds = [_feeds(levels["opt"], 1000 + k) for k in range(4)]
    try:
        expected = [ort_session(model).run(names, f) for f in feeds]
    except Exception:  # noqa: BLE001
        return {"seed": seed, "skipped": "onnxruntime cannot run the model at the opt shapes"}
    path, profile, plan = folder / "model.onnx", folder / "profile.yaml", folder / "plan.bin"
    onnx.save(model, path)
    profile.write_text(yaml.safe_dump({"inputs": {name: {level: shapes[name] for level, shapes in levels.items()}
                                                  for name in levels["opt"]}}))
    for level, shapes in levels.items():
        try:
            ort_session(model).run(names, _feeds(shapes, seed))
        except Exception:  # noqa: BLE001
            return {"seed": seed, "skipped": f"onnxruntime cannot run the model at the {level} shapes"}
    build(str(path), str(profile), str(plan), BuildOptions(cache_dir=folder / "cache", use_cache=False,
                                                           show_progress=False, precision=precision))
    accuracy = (read_plan(plan).meta.get("precision") or {}).get("accuracy", {})
    session = PlanSession(plan)
    actual = [[session.run(session.check_feeds(f, "fuzz"))[n] for n in names] for f in feeds]
    error = worst(compare_runs(model, names, expected, actual), "q_rel")
    result = {"seed": seed, "nodes": len(model.graph.node), "ops": [n.op_type for n in model.graph.node],
              "q_rel": error, "within_tolerance": accuracy.get("within_tolerance"), "findings": [], "fallback": True}
    if error > PRECISION_SLACK * DEFAULT_TOLERANCE and accuracy.get("within_tolerance") is not False:
        result["findings"].append("q_rel")
    return result


def _seeds(text: str) -> list[int]:
    seeds = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += list(range(int(low), int(high or low) + 1))
    return seeds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-49", help="e.g. 0-199 or 3,17,40-45")
    parser.add_argument("--keep", type=Path, help="leave failing seeds' models and profiles here")
    parser.add_argument("--json", action="store_true", help="one JSON object per seed on stdout")
    parser.add_argument("--precision", choices=("fp16", "bf16"), help="check reduced-precision plans instead: "
                        "within their tolerance on fresh inputs, or saying they are not")
    args = parser.parse_args()
    failures = 0
    for seed in _seeds(args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                result = (check_precision(seed, Path(tmp), args.precision) if args.precision
                          else check_seed(seed, Path(tmp)))
                bad = result.get("findings", [])
            except Exception as exc:  # noqa: BLE001 - a crash is a finding, reported with its seed
                result = {"seed": seed, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                          "trace": traceback.format_exc(limit=-3)}
                bad = ["error"]
            if bad and args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                model, levels = random_case(seed)
                onnx.save(model, args.keep / f"fuzz_{seed}.onnx")
                (args.keep / f"fuzz_{seed}.yaml").write_text(json.dumps({"inputs": {
                    name: {level: shapes[name] for level, shapes in levels.items()} for name in levels["opt"]}}))
        failures += bool(bad)
        if args.json:
            print(json.dumps({k: v for k, v in result.items() if k != "trace"}), flush=True)
        elif bad:
            detail = result.get("error") or ", ".join(
                f"{k} {result[k]:.2g}" + (" (float64: infc {:.2g}, onnxruntime {:.2g})".format(*result[f"{k}_vs_float64"])
                                         if f"{k}_vs_float64" in result else "") for k in bad)
            print(f"seed {seed}: FAIL {detail} | {' '.join(result.get('ops', []))}", flush=True)
            if "trace" in result:
                print(result["trace"], file=sys.stderr)
        elif "skipped" in result:
            print(f"seed {seed}: skipped ({result['skipped']})", flush=True)
        elif args.precision:
            print(f"seed {seed}: ok ({result['nodes']} nodes, {args.precision} q_rel {result['q_rel']:.1e}, "
                  f"within tolerance: {result['within_tolerance']})", flush=True)
        else:
            print(f"seed {seed}: ok ({result['nodes']} nodes{', islands' if result['fallback'] else ''}, "
                  f"worst {max(result[k] for k in result if k.startswith(('optimize_', 'plan_')) and '_vs_' not in k):.1e})", flush=True)
    print(f"{failures} of {len(_seeds(args.seeds))} seeds failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
