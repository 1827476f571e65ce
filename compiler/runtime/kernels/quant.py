"""Quantization: QuantizeLinear / DequantizeLinear (per tensor, per axis, blocked; integer, float8 and
sub-byte types), DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv."""

from __future__ import annotations

import numpy as np

from .. import integer_gemm
from ..integer_gemm import exact_integer_matmul
from .cast import cast_array
from .common import arg, is_exotic, norm_axis, np_dtype
from .conv import conv_forward
from .jit_quant import dynamic_quantize

_INTEGER_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
                   "uint4": (0, 15), "int4": (-8, 7), "uint2": (0, 3), "int2": (-2, 1)}


def _spread(param: np.ndarray, shape, axis: int, block: int) -> np.ndarray:
    """A scale or zero point broadcast against x: scalar, one value per `axis` index, or per block."""
    if param.size == 1 and param.ndim <= 1:
        return param.reshape(())
    rank = len(shape)
    axis = norm_axis(axis, rank)
    if block:
        return np.repeat(param, block, axis=axis).take(np.arange(shape[axis]), axis=axis)
    return param.reshape((-1,) + (1,) * (rank - axis - 1))


def _as_float(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float32) if is_exotic(v.dtype) or v.dtype.kind in "iub" else v


def quantize(x: np.ndarray, scale, zero_point, out_dtype: np.dtype, saturate: bool = True) -> np.ndarray:
    scaled = x / scale
    if out_dtype.name in _INTEGER_RANGES:
        # saturated in float before the conversion, as onnxruntime does: an int conversion of inf or
        # of a value past 2^31 wraps; NaN goes to the lowest value
        q = np.rint(scaled)
        if zero_point is not None:
            q += zero_point.astype(q.dtype)
        low, high = _INTEGER_RANGES[out_dtype.name]
        np.clip(q, low, high, out=q)
        q[np.isnan(q)] = low
        return q.astype(out_dtype)
    if out_dtype.name == "float4_e2m1fn" and zero_point is not None:
        scaled = scaled + _as_float(zero_point)
    return cast_array(scaled.astype(np.float32), out_dtype, saturate)


def quantize_linear(inputs, attrs, ctx):
    x, scale, zero_point = inputs[0], inputs[1], arg(inputs, 2)
    axis, block = attrs.get("axis", 1), attrs.get("block_size", 0)
    if zero_point is not None:
        out_dtype = zero_point.dtype
    else:
        out_dtype = np_dtype(attrs["output_dtype"]) if attrs.get("output_dtype") else np.dtype(np.uint8)
    work = _as_float(x)
    scale = _spread(_as_float(scale), x.shape, axis, block).astype(work.dtype, copy=False)
    zp = _spread(zero_point, x.shape, axis, block) if zero_point is not None else None
    return [quantize(work, scale, zp, out_dtype, bool(attrs.get("saturate", 1)))]


def dequantize_linear(inputs, attrs, ctx):
    x, scale, zero_point = inputs[0], inputs[1], arg(inputs, 2)
    axis, block = attrs.get("axis", 1), attrs.get("block_size", 0)
    out_dtype = np_dtype(attrs["output_dtype"]) if attrs.get("output_dtype") else scale.dtype
    work_scale = _spread(_as_float(scale), x.shape, axis, block)
    values = x.astype(np.float32) if is_exotic(x.dtype) else x.astype(np.float32 if x.dtype.itemsize < 4 else np.float64)
    if zero_point is not None:
        values = values - _spread(_as_float(zero_point), x.shape, axis, block).astype(values.dtype)
    y = values * work_scale
    return [y.astype(out_dtype)]


def dynamic_quantize_linear(inputs, attrs, ctx):
    compiled = dynamic_quantize(inputs[0]) if inputs[0].dtype == np.float32 else None
    if compiled is not None:
        return compiled
    x = inputs[0].astype(np.float32)
    # float32 arithmetic throughout, as onnxruntime does: a scale one ulp off flips quantization bins
    low = np.minimum(x.min(), np.float32(0)) if x.size else np.float32(0)
    high = np.maximum(x.max(), np.float32(0)) if x.size else np.float32(0)
    scale = np.float32((high - low) / np.float32(255))
    zero_point = np.uint8(np.clip(np.rint(-low / scale), 0, 255)) if scale else np.uint8(0)
    y = np.clip(np.rint(x / scale) + zero_point, 0, 255).astype(np.uint8) if scale else np.zeros(x.shape, np.uint8)
    return [y, np.array(scale, dtype=np.float32), np.array(zero_point, dtype=np.uint8)]


def _centered(x: np.ndarray, zero_point, axis_for_vector: int | None = None, dtype=np.float64) -> np.ndarray:
    """x - zero_point as floats holding integers: exact for the 8-bit types these ops take, and
    float64 keeps their products' sums exact too (far below 2^53), so float BLAS computes integer
    convolutions exactly (NumPy's integer matmul and convolutions have no BLAS path: ResNet-50 in
    QLinearConv took 4.3 s). float32 operands suit exact_integer_matmul, which chunks K."""
    centered = x.astype(dtype)
    if zero_point is None:
        return centered
    zp = zero_point.astype(dtype)
    if zp.ndim == 1 and zp.size > 1 and axis_for_vector is not None:
        shape = [1] * x.ndim
        shape[axis_for_vector] = -1
        zp = zp.reshape(shape)
    centered -= zp
    return centered


def _weight_side(ctx, b: np.ndarray, zero_point, axis: int) -> tuple[np.ndarray, float]:
    """The B operand centered in float32 and its largest magnitude, kept while the same (constant)
    arrays come back: converting a weight every call cost as much as the product."""
    memo = getattr(ctx, "memo", None)
    cached = memo.get("matmul-integer-b") if memo is not None else None
    if cached is not None and cached[0] is b and cached[1] is zero_point:
        return cached[2], cached[3]
    centered = _centered(b, zero_point, axis, np.float32)
    largest = float(np.abs(centered).max(initial=0.0))
    if memo is not None:
        memo["matmul-integer-b"] = (b, zero_point, centered, largest)
    return centered, largest


def _weight_session(ctx, a: np.ndarray, b: np.ndarray, a_zero, b_zero):
    """onnxruntime's MatMulInteger over the constant weight b (integer_gemm.py: the same exact sums,
    at int8 speed) once b came back the same array, for uint8 a with one zero point; else None."""
    memo = getattr(ctx, "memo", None)
    if memo is None or a.dtype != np.uint8 or b.ndim != 2 or (a_zero is not None and a_zero.size != 1):
        return None
    seen = memo.get("matmul-integer-session")
    if seen is None or seen[0] is not b or seen[1] is not b_zero:  # first sight: maybe not a constant
        memo["matmul-integer-session"] = (b, b_zero, None)
        return None
    if seen[2] is None:
        centered_max = int(np.abs(_centered(b, b_zero, 1, np.float32)).max(initial=0.0))
        usable = integer_gemm.fits_int32(b.shape[0], centered_max) and integer_gemm.is_exact()
        memo["matmul-integer-session"] = seen = (b, b_zero, (usable and integer_gemm.weight_session(b, b_zero)) or False)
    return seen[2] or None


def matmul_integer(inputs, attrs, ctx):
    a, b = inputs[0], inputs[1]
    session = _weight_session(ctx, a, b, arg(inputs, 2), arg(inputs, 3))
    if session is not None:
        return [integer_gemm.run(session, a, 0 if arg(inputs, 2) is None else arg(inputs, 2))]
    a_c = _centered(a, arg(inputs, 2), a.ndim - 2, np.float32)  # per-row zero points
    b_c, b_largest = _weight_side(ctx, b, arg(inputs, 3), b.ndim - 1)  # per-column zero points
    return [exact_integer_matmul(a_c, b_c, b_largest).astype(np.int32)]


def conv_integer(inputs, attrs, ctx):
    x, w = inputs[0], inputs[1]
    x_c = _centered(x, arg(inputs, 2))
    w_c = _centered(w, arg(inputs, 3), axis_for_vector=0)
    return [conv_forward(x_c, w_c, None, attrs).astype(np.int32)]


def qlinear_matmul(inputs, attrs, ctx):
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = inputs[:8]
    session = _weight_session(ctx, a, b, a_zp, b_zp)
    if session is not None:
        acc = integer_gemm.run(session, a, 0 if a_zp is None else a_zp)
    else:
        b_c, b_largest = _weight_side(ctx, b, b_zp, b.ndim - 1)
        acc = exact_integer_matmul(_centered(a, a_zp, a.ndim - 2, np.float32), b_c, b_largest)
    a_factor = _as_float(a_scale).reshape(-1, 1) if a_scale.size > 1 else _as_float(a_scale).reshape(())
    b_factor = _as_float(b_scale).reshape(-1) if b_scale.size > 1 else _as_float(b_scale).reshape(())
    return [_requantize(acc, a_factor, b_factor, y_scale, y_zp)]


def qlinear_conv(inputs, attrs, ctx):
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = inputs[:8]
    bias = arg(inputs, 8)
    acc = conv_forward(_centered(x, x_zp), _centered(w, w_zp, axis_for_vector=0), bias, attrs)
    w_factor = _as_float(w_scale).reshape((-1,) + (1,) * (acc.ndim - 2))
    return [_requantize(acc, _as_float(x_scale).reshape(()), w_factor, y_scale, y_zp)]


def _requantize(acc: np.ndarray, in_scale, w_scale, y_scale, y_zp) -> np.ndarray:
    """The int32 sums to the output's grid as onnxruntime (MLAS) does it: one float32 multiplier
    in_scale * w_scale / y_scale per output channel, times the sum as float32, rounded half to even,
    plus the zero point, saturated. (With round scales many products land on exact halves, where
    another order of the float arithmetic rounds to the neighbouring grid point.)"""
    multiplier = (np.float32(1) * in_scale * w_scale / _as_float(y_scale).reshape(())).astype(np.float32)
    scaled = acc.astype(np.float32) * multiplier
    return quantize(scaled, np.float32(1), y_zp, y_zp.dtype)


KERNELS = {
    ("", "QuantizeLinear"): quantize_linear,
    ("", "DequantizeLinear"): dequantize_linear,
    ("", "DynamicQuantizeLinear"): dynamic_quantize_linear,
    ("", "MatMulInteger"): matmul_integer,
    ("", "ConvInteger"): conv_integer,
    ("", "QLinearMatMul"): qlinear_matmul,
    ("", "QLinearConv"): qlinear_conv,
}
