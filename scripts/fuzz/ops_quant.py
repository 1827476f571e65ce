"""Quantized forms as quantization tools write them: QDQ pairs around MatMul, Conv and Add (activations
per tensor, weights per tensor or per output channel, uint8 or int8), and the integer ops QLinearMatMul,
QLinearConv, MatMulInteger with DynamicQuantizeLinear.

A value's quantized form is integers, not a float value for the other ops to take (shape_node); each
form ends in a DequantizeLinear back to float. Scales are fixed numbers, not fitted to the value:
random graphs' ranges vary, so some values saturate, which is a case too."""

import numpy as np
from onnx import TensorProto, helper

from .graph import F32

ACTIVATION_SCALES = (0.02, 0.05, 0.1)


def _zero_point(g, unsigned: bool) -> tuple[str, np.dtype]:
    dtype = np.uint8 if unsigned else np.int8
    value = int(g.rng.choice([128, 120])) if unsigned else int(g.rng.choice([0, 0, -3]))
    return g.const(np.array(value, dtype), "zp"), dtype


def _quantize(g, x: str, unsigned: bool | None = None) -> tuple[str, str, str]:
    """Q(x) with a per-tensor scale: (quantized, scale, zero point)."""
    g.flags.add("quantized")
    unsigned = bool(g.rng.integers(2)) if unsigned is None else unsigned
    scale = g.const(np.array(g.rng.choice(ACTIVATION_SCALES), F32), "scale")
    zp, _ = _zero_point(g, unsigned)
    return g.shape_node("QuantizeLinear", [x, scale, zp]), scale, zp


def _qdq(g, x: str, s) -> str:
    q, scale, zp = _quantize(g, x)
    return g.node("DequantizeLinear", [q, scale, zp], s, g.dyn[x])


def _quantized_weight(g, w_float: np.ndarray, axis: int | None, unsigned: bool = False):
    """w as int8 (or uint8) with a symmetric scale per tensor, or per slice along `axis`."""
    if axis is None:
        scale = np.array(np.abs(w_float).max() / 127, F32)
        shaped = scale
    else:
        reduce = tuple(a for a in range(w_float.ndim) if a != axis)
        scale = (np.abs(w_float).max(axis=reduce) / 127).astype(F32)
        shaped = scale.reshape([-1 if a == axis else 1 for a in range(w_float.ndim)])
    q = np.clip(np.round(w_float / shaped), -127, 127)
    zero = 128 if unsigned else 0
    dtype = np.uint8 if unsigned else np.int8
    zp = np.full(scale.shape, zero, dtype)
    return g.const((q + zero).astype(dtype), "wq"), g.const(scale, "wscale"), g.const(zp, "wzp")


def _dq_weight(g, w_float: np.ndarray, axis: int) -> str:
    per_axis = bool(g.rng.integers(2))
    wq, ws, wzp = _quantized_weight(g, w_float, axis if per_axis else None)
    return g.shape_node("DequantizeLinear", [wq, ws, wzp], **({"axis": axis} if per_axis else {}))


def _qdq_matmul(g, x, s):
    if not g.fixed(x, -1):
        return None
    n = int(g.rng.choice([8, 16]))
    w = (g.rng.standard_normal((s[-1], n)) / np.sqrt(s[-1])).astype(F32)
    y = g.node("MatMul", [_qdq(g, x, s), _dq_weight(g, w, 1)], (*s[:-1], n))
    if g.rng.integers(2):
        y = g.node("Add", [y, g.const(g.rng.standard_normal(n).astype(F32))], (*s[:-1], n))
    return _qdq(g, y, g.shapes[y]) if g.rng.integers(2) else y


def _qdq_conv(g, x, s):
    if len(s) != 4 or not g.fixed(x, 1):
        return None
    c, out, kernel = s[1], int(g.rng.choice([8, 16])), int(g.rng.choice([1, 3]))
    w = (g.rng.standard_normal((out, c, kernel, kernel)) / np.sqrt(c * kernel * kernel)).astype(F32)
    inputs = [_qdq(g, x, s), _dq_weight(g, w, 0)]
    if g.rng.integers(2):
        inputs.append(g.const(g.rng.standard_normal(out).astype(F32)))
    y = g.node("Conv", inputs, (s[0], out, *s[2:]), {a for a in g.dyn[x] if a > 1}, kernel_shape=[kernel, kernel],
               pads=[kernel // 2] * 4)
    if g.rng.integers(2):
        y = g.node("Relu", [y], g.shapes[y])
    return _qdq(g, y, g.shapes[y])


def _qdq_add(g, x, s):
    """Two dequantized values summed and requantized: sums of quantized steps land on ties (x.5),
    where QuantizeLinear rounds half to even."""
    same = [v for v, shape in g.shapes.items() if shape == s and v != x and g.dyn[v] == g.dyn[x]]
    other = str(g.rng.choice(same)) if same else g.node("Relu", [x], s)
    return _qdq(g, g.node("Add", [_qdq(g, x, s), _qdq(g, other, s)], s), s)


def _qlinear_matmul(g, x, s):
    if not g.fixed(x, -1):
        return None
    n = int(g.rng.choice([8, 16]))
    xq, xs, xzp = _quantize(g, x)
    w = (g.rng.standard_normal((s[-1], n)) / np.sqrt(s[-1])).astype(F32)
    # onnxruntime's kernels: uint8 activations with either weight type, int8 ones with int8 only
    activation_unsigned = g.inits[xzp].dtype == np.uint8
    wq, ws, wzp = _quantized_weight(g, w, None, unsigned=activation_unsigned and bool(g.rng.integers(2)))
    ys = g.const(np.array(g.rng.choice(ACTIVATION_SCALES), F32), "scale")
    yzp = g.const(np.zeros((), g.inits[xzp].dtype), "zp")
    yq = g.shape_node("QLinearMatMul", [xq, xs, xzp, wq, ws, wzp, ys, yzp])
    return g.node("DequantizeLinear", [yq, ys, yzp], (*s[:-1], n), g.dyn[x])


def _qlinear_conv(g, x, s):
    if len(s) != 4 or not g.fixed(x, 1):
        return None
    c, out, kernel = s[1], int(g.rng.choice([8, 16])), int(g.rng.choice([1, 3]))
    xq, xs, xzp = _quantize(g, x, unsigned=True)  # onnxruntime's QLinearConv takes uint8 activations
    w = (g.rng.standard_normal((out, c, kernel, kernel)) / np.sqrt(c * kernel * kernel)).astype(F32)
    wq, ws, wzp = _quantized_weight(g, w, 0 if g.rng.integers(2) else None)
    ys = g.const(np.array(g.rng.choice(ACTIVATION_SCALES), F32), "scale")
    yzp = g.const(np.array(128, np.uint8), "zp")
    inputs = [xq, xs, xzp, wq, ws, wzp, ys, yzp]
    if g.rng.integers(2):  # int32 bias at scale x_scale * w_scale
        bias_scale = g.inits[xs] * g.inits[ws]
        inputs.append(g.const(np.round(g.rng.standard_normal(out) / bias_scale).astype(np.int32), "bias"))
    yq = g.shape_node("QLinearConv", inputs, kernel_shape=[kernel, kernel], pads=[kernel // 2] * 4)
    return g.node("DequantizeLinear", [yq, ys, yzp], (s[0], out, *s[2:]), {a for a in g.dyn[x] if a > 1})


def _matmul_integer(g, x, s):
    """onnxruntime's dynamic quantization: DynamicQuantizeLinear on the activation, MatMulInteger
    against int8 weights, the int32 product scaled back by x_scale * w_scale."""
    if not g.fixed(x, -1):
        return None
    g.flags.add("quantized")
    n = int(g.rng.choice([8, 16]))
    xq, xs, xzp = (g.name("dql") for _ in range(3))
    g.nodes.append(helper.make_node("DynamicQuantizeLinear", [x], [xq, xs, xzp], name=xq))
    w = (g.rng.standard_normal((s[-1], n)) / np.sqrt(s[-1])).astype(F32)
    wq, ws, wzp = _quantized_weight(g, w, None)
    product = g.shape_node("MatMulInteger", [xq, wq, xzp, wzp])
    as_float = g.shape_node("Cast", [product], to=TensorProto.FLOAT)
    scale = g.shape_node("Mul", [xs, ws])
    return g.node("Mul", [as_float, scale], (*s[:-1], n), g.dyn[x])
