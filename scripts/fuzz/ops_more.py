"""More forms users' models carry: Einsum as exporters write it, GroupNormalization and
RMSNormalization as whole ops (opset 21 / 23, written in the LATE domain until the model reaches that
opset), Resize in its modes, grouped and dilated ConvTranspose, Pad that crops, and float16 islands
between Casts."""

import numpy as np
from onnx import TensorProto

from .graph import F32, LATE


def _einsum(g, x, s):
    r = len(s)
    letters = "bcde"[:r]
    kind = int(g.rng.integers(3))
    if kind == 0 and g.fixed(x, -1):  # a projection: "bcd,de->bce"
        n = int(g.rng.choice([8, 16]))
        return g.node("Einsum", [x, g.weight(s[-1], n)], (*s[:-1], n), equation=f"{letters},{letters[-1]}z->{letters[:-1]}z")
    if kind == 1 and r >= 3:  # scores of a value with itself: "bcd,bed->bce"
        other = letters[:-2] + "z" + letters[-1]
        shape = (*s[:-1], s[-2])
        dyn = {a for a in g.dyn[x] if a < r - 2} | ({r - 2, r - 1} if r - 2 in g.dyn[x] else set())
        return g.node("Einsum", [x, x], shape, dyn, equation=f"{letters},{other}->{letters[:-1]}z")
    if r >= 3:  # a transpose of the last two axes, written as Einsum
        out = letters[:-2] + letters[-1] + letters[-2]
        dyn = {({r - 1: r - 2, r - 2: r - 1}.get(a, a)) for a in g.dyn[x]}
        return g.node("Einsum", [x], (*s[:-2], s[-1], s[-2]), dyn, equation=f"{letters}->{out}")
    return None


def _late(g):
    g.flags.add("late")
    return {"domain": LATE}


def _group_norm_op(g, x, s):
    if len(s) not in (3, 4) or not g.fixed(x, 1) or s[1] % 2:
        return None
    c = s[1]
    groups = int(g.rng.choice([d for d in (1, 2, 4, c) if c % d == 0]))
    scale = g.const((1 + 0.1 * g.rng.standard_normal(c)).astype(F32))  # per channel: opset 21
    bias = g.const((0.1 * g.rng.standard_normal(c)).astype(F32))
    return g.node("GroupNormalization", [x, scale, bias], s, num_groups=groups, epsilon=1e-5, **_late(g))


def _rms_norm_op(g, x, s):
    if not g.fixed(x, -1):
        return None
    scale = g.const((1 + 0.1 * g.rng.standard_normal(s[-1])).astype(F32))
    return g.node("RMSNormalization", [x, scale], s, axis=-1, epsilon=1e-6, **_late(g))


COORDINATES = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _resize_modes(g, x, s):
    if len(s) != 4:
        return None
    mode = str(g.rng.choice(["nearest", "linear", "cubic"]))
    attrs = {"mode": mode, "coordinate_transformation_mode": str(g.rng.choice(COORDINATES))}
    if mode == "nearest":
        attrs["nearest_mode"] = str(g.rng.choice(NEAREST))
    if mode == "cubic":
        attrs["cubic_coeff_a"] = float(g.rng.choice([-0.75, -0.5]))
        attrs["exclude_outside"] = int(g.rng.integers(2))
    if g.rng.integers(2) and g.fixed(x, 2, 3):  # sizes, which may shrink one axis
        h, w = int(g.rng.integers(2, 2 * s[2] + 2)), int(g.rng.integers(2, 2 * s[3] + 2))
        # the batch varies: sizes are Shape(x)[:2] and the fixed spatial target
        lead = g.shape_node("Slice", [g.shape_node("Shape", [x]), g.const(np.array([0], np.int64)),
                                      g.const(np.array([2], np.int64))])
        sizes = g.shape_node("Concat", [lead, g.const(np.array([h, w], np.int64))], axis=0)
        return g.node("Resize", [x, "", "", sizes], (*s[:2], h, w), {a for a in g.dyn[x] if a < 2}, **attrs)
    factor = [float(g.rng.choice([0.5, 1.5, 2.0, 3.0])) for _ in range(2)]
    h, w = (int(np.floor(d * f)) for d, f in zip(s[2:], factor))
    if h < 2 or w < 2 or (not g.fixed(x, 2, 3) and min(factor) < 1):
        return None
    scales = g.const(np.array([1, 1, *factor], F32), "scales")
    return g.node("Resize", [x, "", scales], (*s[:2], h, w), **attrs)


def _conv_transpose_grouped(g, x, s):
    if len(s) != 4 or not g.fixed(x, 1):
        return None
    c = s[1]
    group = int(g.rng.choice([d for d in (1, 2, c) if c % d == 0]))
    out_per_group = int(g.rng.choice([1, 2]))
    kernel, stride, dilation = int(g.rng.choice([2, 3])), int(g.rng.choice([1, 2])), int(g.rng.choice([1, 2]))
    pad = int(g.rng.integers(0, kernel // 2 + 1))
    extra = int(g.rng.integers(0, max(stride, dilation))) if stride > 1 else 0
    h, w = ((d - 1) * stride - 2 * pad + dilation * (kernel - 1) + 1 + extra for d in s[2:])
    if h < 2 or w < 2:
        return None
    weight = g.weight(c, out_per_group, kernel, kernel, scale=1.0 / np.sqrt(c // group * kernel))
    inputs = [x, weight] + ([g.const(g.rng.standard_normal(out_per_group * group).astype(F32))] if g.rng.integers(2) else [])
    return g.node("ConvTranspose", inputs, (s[0], out_per_group * group, h, w), kernel_shape=[kernel, kernel],
                  strides=[stride, stride], pads=[pad] * 4, dilations=[dilation, dilation], output_padding=[extra, extra],
                  group=group)


def _pad_crop(g, x, s):
    """Negative pads crop (an exporter's F.pad with negative widths), with a constant value input."""
    axes = [a for a in range(1, len(s)) if s[a] > 2 and g.fixed(x, a)]
    if not axes:
        return None
    axis = int(g.rng.choice(axes))
    pads = [0] * (2 * len(s))
    pads[axis], pads[len(s) + axis] = -int(g.rng.integers(0, 2)), int(g.rng.integers(-1, 3))
    shape = tuple(d + pads[i] + pads[len(s) + i] for i, d in enumerate(s))
    value = g.const(np.array(g.rng.uniform(-1, 1), F32))
    return g.node("Pad", [x, g.const(np.array(pads, np.int64), "pads"), value], shape, mode="constant")


def _half_island(g, x, s):
    """A float16 stretch between Casts, as autocast exports write: MatMul or elementwise in fp16."""
    g.flags.add("fp16")
    half = g.shape_node("Cast", [x], to=TensorProto.FLOAT16)
    if g.fixed(x, -1) and g.rng.integers(2):
        w = g.const((g.rng.standard_normal((s[-1], s[-1])) / np.sqrt(s[-1])).astype(np.float16), "w16")
        y = g.shape_node("MatMul", [half, w])
        shape = s
    else:
        y = g.shape_node("Mul", [half, g.const(np.array(0.5, np.float16))])
        shape = s
    y = g.shape_node(str(g.rng.choice(["Relu", "Tanh", "Sigmoid"])), [y])
    return g.node("Cast", [y], shape, g.dyn[x], to=TensorProto.FLOAT)
