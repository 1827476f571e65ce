"""Image and signal forms: Conv (1-D and 2-D), ConvTranspose, pools, Resize, DepthToSpace."""

import numpy as np

from .graph import F32


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


def _depth_space(g, x, s):
    if len(s) != 4 or not g.fixed(x, 1):
        return None
    if s[1] % 4 == 0 and g.rng.integers(2):
        mode = str(g.rng.choice(["DCR", "CRD"]))
        return g.node("DepthToSpace", [x], (s[0], s[1] // 4, 2 * s[2], 2 * s[3]), blocksize=2, mode=mode)
    if s[2] % 2 == 0 and s[3] % 2 == 0 and g.fixed(x, 2, 3):
        return g.node("SpaceToDepth", [x], (s[0], 4 * s[1], s[2] // 2, s[3] // 2), blocksize=2)
    return None
