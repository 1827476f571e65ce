"""Activations (ONNX and ORT contrib), Clip, Dropout (inference) and the softmax family.

Float32 stays float32: constants are Python scalars, which NumPy treats as weak types. The GELU
family on float32 runs as one compiled pass when numba is there (jit_activation.py, same formulas);
the NumPy code here is the path without it and for other dtypes.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import BadInput
from .common import arg, clip_into, norm_axis, to_compute
from .elementwise import erf, erf_f32
from .jit_activation import ERF_FORM, QUICK_FORM, TANH_FORM, gated, gelu
from .jit_attention import softmax_last as compiled_softmax_last

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _float_kernel(fn):
    """`fn(x, attrs)` on float data; float16 and exotic dtypes computed in float32 and cast back."""
    def kernel(inputs, attrs, ctx):
        x = inputs[0]
        result = fn(x.astype(np.float32) if x.dtype == np.float16 else to_compute(x), attrs)
        return [result if result.dtype == x.dtype else result.astype(x.dtype)]
    return kernel


def sigmoid(x):
    # tanh form: no overflow for large |x|; one allocation, the rest in place
    y = np.multiply(x, 0.5)
    np.tanh(y, out=y)
    y *= 0.5
    y += 0.5
    return y


def hard_sigmoid(x, alpha=0.2, beta=0.5):
    y = np.multiply(x, alpha)
    y += beta
    return clip_into(y, 0.0, 1.0, y)


def hard_swish(x):
    y = hard_sigmoid(x, 1 / 6, 0.5)
    y *= x
    return y


def relu(inputs, attrs, ctx):
    x = inputs[0]
    if x.dtype.kind == "V":
        return [np.maximum(x.astype(np.float32), 0).astype(x.dtype)]
    out = ctx.out[0] if ctx is not None and ctx.out else None
    if out is not None and out.shape == x.shape and out.dtype == x.dtype:
        return [np.maximum(x, 0, out=out)]
    return [np.maximum(x, 0)]


relu.accepts_out = True


def leaky_relu(x, attrs):
    alpha = attrs.get("alpha", 0.01)
    return np.maximum(x, x * alpha) if 0 <= alpha <= 1 else np.where(x >= 0, x, x * alpha)


def prelu(inputs, attrs, ctx):
    x, slope = inputs
    return [np.where(x < 0, x * slope, x).astype(x.dtype, copy=False)]


def gelu_erf(x):
    compiled = gelu(x, None, ERF_FORM)
    if compiled is not None:
        return compiled
    if x.dtype == np.float32:  # x * (0.5 + 0.5 * erf(x / sqrt(2)))
        y = erf_f32(x, 0.5, 1.0 / math.sqrt(2.0))
        y += 0.5
        y *= x
        return y
    y = erf(x * (1.0 / math.sqrt(2.0)))
    y += 1.0
    y *= x
    y *= 0.5
    return y


def gelu_tanh(x):
    compiled = gelu(x, None, TANH_FORM)
    if compiled is not None:
        return compiled
    inner = x * x
    inner *= 0.044715 * _SQRT_2_OVER_PI
    inner += _SQRT_2_OVER_PI
    inner *= x
    y = np.tanh(inner, out=inner)
    y += 1.0
    y *= x
    y *= 0.5
    return y


def clip(inputs, attrs, ctx):
    x = inputs[0]
    if ctx.opset < 11 and len(inputs) == 1:
        low, high = attrs.get("min", -np.inf), attrs.get("max", np.inf)
    else:
        low, high = arg(inputs, 1), arg(inputs, 2)
    work = to_compute(x)
    if low is not None:
        work = np.maximum(work, np.asarray(low, dtype=work.dtype) if work.dtype.kind != "f" else low)
    if high is not None:
        work = np.minimum(work, np.asarray(high, dtype=work.dtype) if work.dtype.kind != "f" else high)
    return [np.asarray(work).astype(x.dtype, copy=False)]


def dropout(inputs, attrs, ctx):
    # Inference semantics (training_mode false or ratio 0): identity with an all-true mask.
    x = inputs[0]
    training = arg(inputs, 2)
    if training is not None and bool(training) and float(arg(inputs, 1) if arg(inputs, 1) is not None else 0.5) > 0:
        raise BadInput("Dropout runs in training mode (training_mode true): its output is random, and plans run "
                       "inference only")
    return [x, np.ones(x.shape, dtype=bool)]


def _softmax_axis(x, attrs, ctx, default_new=-1):
    if ctx.opset >= 13:
        axis = attrs.get("axis", default_new)
        return x, axis + x.ndim if axis < 0 else axis, x.shape
    axis = norm_axis(attrs.get("axis", 1), x.ndim)  # older opsets flatten to 2-D at `axis`
    return x.reshape(math.prod(x.shape[:axis]), -1), 1, x.shape


_EXP_CLAMP = 80.0  # exp(80) ~ 5.5e34: no float32 overflow, even summed over 6000 columns
_FAST_LOW, _FAST_HIGH = 1e-20, 5e34  # row sums outside mean a clamped or an underflowing row


def softmax_last(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of float32/float64 data, as a new array; rows that are all -inf
    give zeros. Fast path: exp without subtracting the row max (NumPy's max over a short axis costs
    more than the whole rest), clamped at 80 so nothing overflows; when a row sum shows a clamped
    value or an underflow, everything is redone the classic way. Row sums through einsum (per-row,
    so batch invariant, and faster than np.add.reduce on short rows)."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    e = np.minimum(rows, _EXP_CLAMP)
    np.exp(e, out=e)
    total = np.einsum("ij->i", e)
    if total.size and not (total.min() >= _FAST_LOW and total.max() < _FAST_HIGH):
        peak = np.maximum.reduce(rows, axis=-1, keepdims=True)
        np.maximum(peak, np.finfo(e.dtype).min, out=peak)  # all -inf rows: exp gives zeros, not NaN
        np.subtract(rows, peak, out=e)
        np.exp(e, out=e)
        total = np.einsum("ij->i", e)
        np.maximum(total, np.finfo(e.dtype).tiny, out=total)
    e /= total.reshape(-1, 1)
    return e.reshape(x.shape)


def softmax(inputs, attrs, ctx):
    x, axis, shape = _softmax_axis(to_compute(inputs[0]), attrs, ctx)
    if axis == x.ndim - 1 and x.dtype in (np.float32, np.float64) and x.size:
        compiled = compiled_softmax_last(x)
        return [(compiled if compiled is not None else softmax_last(x)).reshape(shape)]
    e = np.subtract(x, np.maximum.reduce(x, axis=axis, keepdims=True))
    np.exp(e, out=e)
    e /= np.add.reduce(e, axis=axis, keepdims=True)
    if e.shape != shape:
        e = e.reshape(shape)
    return [e if e.dtype == inputs[0].dtype else e.astype(inputs[0].dtype)]


def log_softmax(inputs, attrs, ctx):
    x, axis, shape = _softmax_axis(to_compute(inputs[0]), attrs, ctx)
    shifted = x - x.max(axis=axis, keepdims=True)
    shifted -= np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    return [shifted.reshape(shape).astype(inputs[0].dtype, copy=False)]


def hardmax(inputs, attrs, ctx):
    x, axis, shape = _softmax_axis(to_compute(inputs[0]), attrs, ctx)
    y = np.zeros_like(x)
    np.put_along_axis(y, np.expand_dims(np.argmax(x, axis=axis), axis), 1, axis=axis)
    return [y.reshape(shape).astype(inputs[0].dtype, copy=False)]


def quick_gelu(x, alpha):
    compiled = gelu(x, None, QUICK_FORM, alpha)
    if compiled is not None:
        return compiled
    return x * sigmoid(x * alpha)


def fast_gelu(inputs, attrs, ctx):
    x, bias = inputs[0], arg(inputs, 1)
    compiled = gelu(x, bias, TANH_FORM)
    if compiled is not None:
        return [compiled]
    return [gelu_tanh(x + bias if bias is not None else x).astype(x.dtype, copy=False)]


def bias_gelu(inputs, attrs, ctx):
    compiled = gelu(inputs[0], inputs[1], ERF_FORM)
    if compiled is not None:
        return [compiled]
    x = inputs[0] + inputs[1]
    if x.dtype == np.float32:  # x * (0.5 + 0.5 * erf(x / sqrt(2))), the last product in place
        y = erf_f32(x, 0.5, 1.0 / math.sqrt(2.0))
        y += 0.5
        return [np.multiply(x, y, out=x)]
    return [gelu_erf(x).astype(inputs[0].dtype, copy=False)]


def swiglu(inputs, attrs, ctx):
    # The gate is rounded to the input dtype before the products (as the ONNX function body does).
    a, b = inputs
    work = to_compute(a)
    gate = (1 / (1 + np.exp(-attrs.get("alpha", 1.0) * work))).astype(a.dtype)
    return [(to_compute(a * gate) * to_compute(b)).astype(a.dtype, copy=False)]


FLOAT_FUNCTIONS = {
    "LeakyRelu": leaky_relu,
    "Elu": lambda x, a: np.where(x < 0, (np.exp(x) - 1) * a.get("alpha", 1.0), x),
    "Selu": lambda x, a: np.where(x <= 0, (np.exp(x) - 1) * a.get("alpha", 1.6732632423543772),
                                  x) * a.get("gamma", 1.0507009873554805),
    "Celu": lambda x, a: np.maximum(x, 0) + np.minimum(0, (np.exp(x / a.get("alpha", 1.0)) - 1) * a.get("alpha", 1.0)),
    "Gelu": lambda x, a: gelu_tanh(x) if a.get("approximate", "none") == "tanh" else gelu_erf(x),
    "HardSigmoid": lambda x, a: hard_sigmoid(x, a.get("alpha", 0.2), a.get("beta", 0.5)),
    "HardSwish": lambda x, a: hard_swish(x),
    "Sigmoid": lambda x, a: sigmoid(x),
    "Tanh": lambda x, a: np.tanh(x),
    "Softplus": lambda x, a: np.logaddexp(x, 0),
    "Softsign": lambda x, a: x / (np.abs(x) + 1),
    "Mish": lambda x, a: x * np.tanh(np.logaddexp(x, 0)),
    "ThresholdedRelu": lambda x, a: np.where(x > a.get("alpha", 1.0), x, 0),
    "Shrink": lambda x, a: np.where(x < -a.get("lambd", 0.5), x + a.get("bias", 0.0),
                                    np.where(x > a.get("lambd", 0.5), x - a.get("bias", 0.0), 0)),
    "Swish": lambda x, a: x * sigmoid(x * a.get("alpha", 1.0)),
}
CONTRIB_FUNCTIONS = {
    "Gelu": lambda x, a: gelu_erf(x),
    "QuickGelu": lambda x, a: quick_gelu(x, a.get("alpha", 1.702)),
}

GATED_FORMS = {"QuickGelu": QUICK_FORM, "FastGelu": TANH_FORM, "Gelu": ERF_FORM}  # com.microsoft ops


def gated_activation(inputs, attrs, ctx):
    """`infc.cpu.GatedActivation` (compiler/lower_fuse.py): Split in two halves along the last axis ->
    activation of the `gate` half (attrs: activation, one of GATED_FORMS, its alpha) -> Mul by the
    other half, in one pass over the packed projection; otherwise the two steps' own kernels."""
    packed, activation, gate_first = inputs[0], attrs["activation"], attrs.get("gate", 0) == 0
    alpha = attrs.get("alpha", 1.702 if activation == "QuickGelu" else 1.0)
    fused = gated(packed, gate_first, GATED_FORMS[activation], alpha)
    if fused is not None:
        return [fused]
    d = packed.shape[-1] // 2
    halves = (packed[..., :d], packed[..., d:])
    gate, up = halves if gate_first else halves[::-1]
    act_attrs = {"alpha": alpha} if activation == "QuickGelu" else {}
    (act,) = KERNELS[("com.microsoft", activation)]([np.ascontiguousarray(gate)], act_attrs, ctx)
    return [np.multiply(act, up)]


KERNELS = {
    ("infc.cpu", "GatedActivation"): gated_activation,
    **{("", name): _float_kernel(fn) for name, fn in FLOAT_FUNCTIONS.items()},
    **{("com.microsoft", name): _float_kernel(fn) for name, fn in CONTRIB_FUNCTIONS.items()},
    ("", "Relu"): relu,
    ("", "PRelu"): prelu,
    ("", "Clip"): clip,
    ("", "Dropout"): dropout,
    ("", "Softmax"): softmax,
    ("", "LogSoftmax"): log_softmax,
    ("", "Hardmax"): hardmax,
    ("", "SwiGLU"): swiglu,
    ("com.microsoft", "FastGelu"): fast_gelu,
    ("com.microsoft", "BiasGelu"): bias_gelu,
}
