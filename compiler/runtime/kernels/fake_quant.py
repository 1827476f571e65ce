"""`infc.cpu.FakeQuantize`: a QuantizeLinear whose only reader is a DequantizeLinear, in one pass.

QDQ models (onnxruntime's quantize_static and other quantizers) quantize every activation and
dequantize it right away; a plan computes in float32 (docs/quantization.md), so the pair only rounds
each value to its quantization grid:

    x ─► QuantizeLinear(s, z) ─► q (int8) ─► DequantizeLinear(s', z') ─► y      ══►   x ─► FakeQuantize(s, z, s', z') ─► y

As two steps that is five NumPy passes and an int32 temporary for the first and three for the
second (ResNet-50 in QDQ: 60 ms of its 140). Fused, per element: q = clip(rint(x / s) + z) and
y = (q - z') * s', in float32, exactly as the two kernels compute it (quant.py), NaN included (it
quantizes to the type's lowest value, as NumPy's int conversion gives). Per-tensor scales and zero
points of int8 / uint8 only; anything else keeps the two kernels.

The CPU executor fuses at load (`fuse_fake_quantize`), so plans keep the standard steps.
"""

# ruff: noqa: PLR0124, PLR1730 - `v != v` is the NaN test numba compiles; min()/max() would not keep a NaN

from __future__ import annotations

import numpy as np

from ..jit import jit
from .common import KernelContext, arg
from .quant import dequantize_linear, quantize_linear

OP, DOMAIN = "FakeQuantize", "infc.cpu"
QUANTIZE, DEQUANTIZE = ("", "QuantizeLinear"), ("", "DequantizeLinear")
RANGES = {np.dtype(np.int8): (-128.0, 127.0), np.dtype(np.uint8): (0.0, 255.0)}


@jit
def _round_trip(x, scale, zero, low, high, dq_scale, dq_zero, y):
    xs, ys = x.ravel(), y.ravel()
    for i in range(xs.shape[0]):
        v = np.rint(xs[i] / scale)
        if v != v:  # NaN: NumPy's int conversion gives INT_MIN, which the clip takes to the lowest value
            v = low
        else:
            v += zero
            if v < low:
                v = low
            elif v > high:
                v = high
        ys[i] = (v - dq_zero) * dq_scale


def fake_quantize(inputs, attrs, ctx: KernelContext):
    """inputs: x, the Quantize's scale and zero point, the Dequantize's scale and zero point."""
    x, scale, zero, dq_scale, dq_zero = inputs[0], inputs[1], arg(inputs, 2), arg(inputs, 3), arg(inputs, 4)
    kernel = _round_trip.get()
    if kernel is not None and _scalar_params(x, scale, zero, dq_scale, dq_zero):
        low, high = RANGES[zero.dtype]
        f32 = np.float32
        y = np.empty(x.shape, np.float32)
        kernel(np.ascontiguousarray(x), f32(scale.reshape(-1)[0]), f32(zero.reshape(-1)[0]), f32(low), f32(high),
               f32(dq_scale.reshape(-1)[0]), f32(dq_zero.reshape(-1)[0]), y)
        return [y]
    q = quantize_linear([x, scale, zero], attrs["quantize"], ctx)[0]
    return dequantize_linear([q, dq_scale, dq_zero], attrs["dequantize"], ctx)


def _scalar_params(x, scale, zero, dq_scale, dq_zero) -> bool:
    return (x.dtype == np.float32 and zero is not None and dq_zero is not None and zero.dtype in RANGES
            and dq_zero.dtype == zero.dtype and scale.dtype == np.float32 and dq_scale.dtype == np.float32
            and scale.size == zero.size == dq_scale.size == dq_zero.size == 1)


def fuse_fake_quantize(steps: list[dict], keep: set[str]) -> list[dict]:
    """The program with each QuantizeLinear -> DequantizeLinear pair (the quantized value read by the
    Dequantize alone, and not in `keep`) merged into one step."""
    readers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        for name in step["inputs"]:
            if name:
                readers.setdefault(name, []).append(index)
    merged: dict[int, dict | None] = {}
    for index, step in enumerate(steps):
        if ((step.get("domain") or ""), step["op"]) != QUANTIZE or step["outputs"][0] in keep or step.get("tactic"):
            continue  # (a pair the build gave to onnxruntime runs in its session: runtime/vendor_op.py)
        q = step["outputs"][0]
        if len(readers.get(q, [])) != 1:
            continue
        reader = steps[readers[q][0]]
        if ((reader.get("domain") or ""), reader["op"]) != DEQUANTIZE or reader["inputs"][0] != q or reader.get("tactic"):
            continue
        pad = lambda names: list(names[:3]) + [""] * (3 - len(names[:3]))  # noqa: E731
        merged[index] = {"op": OP, "domain": DOMAIN, "name": f"{step.get('name', '')}+{reader.get('name', '')}",
                         "inputs": pad(step["inputs"]) + pad(reader["inputs"])[1:], "outputs": list(reader["outputs"]),
                         "attrs": {"quantize": dict(step.get("attrs") or {}), "dequantize": dict(reader.get("attrs") or {})}}
        merged[readers[q][0]] = None
    return [merged.get(i, step) for i, step in enumerate(steps) if merged.get(i, step) is not None]


KERNELS = {(DOMAIN, OP): fake_quantize}
