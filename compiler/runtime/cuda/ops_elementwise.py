"""Device elementwise ops over an array module: arithmetic, comparisons, activations, casts and the
lowering's ElementwiseChain (run op by op here; on CuPy each op is one fused elementwise launch).
Semantics follow the CPU kernels in runtime/kernels/ (ONNX and ORT contrib definitions)."""

from __future__ import annotations

import functools
import math

import numpy as np

from ..kernels.common import np_dtype

SQRT1_2 = 1.0 / math.sqrt(2.0)


def _binary(name):
    def op(inputs, attrs, ctx):
        return [getattr(ctx.xp, name)(inputs[0], inputs[1])]
    return op


def _unary(name):
    def op(inputs, attrs, ctx):
        return [getattr(ctx.xp, name)(inputs[0])]
    return op


def _f(x, value):
    return x.dtype.type(value)


def sigmoid(x, xp):
    return _f(x, 0.5) * xp.tanh(x * _f(x, 0.5)) + _f(x, 0.5)


def gelu_erf(x, ctx):
    return x * (_f(x, 0.5) + _f(x, 0.5) * ctx.erf(x * _f(x, SQRT1_2)))


def gelu_tanh(x, xp):
    return _f(x, 0.5) * x * (_f(x, 1.0) + xp.tanh(_f(x, math.sqrt(2 / math.pi)) * (x + _f(x, 0.044715) * x * x * x)))


def hard_sigmoid(x, xp, alpha=0.2, beta=0.5):
    return xp.clip(x * _f(x, alpha) + _f(x, beta), _f(x, 0), _f(x, 1))


def activate(y, name, params, ctx):
    """ORT's fused activations (FusedConv, FusedGemm): activation_params as in runtime/kernels/conv.py."""
    xp = ctx.xp
    if not name or name == "Identity":
        return y
    if name == "Relu":
        return xp.maximum(y, _f(y, 0))
    if name == "Tanh":
        return xp.tanh(y)
    if name == "Sigmoid":
        return sigmoid(y, xp)
    if name == "LeakyRelu":
        alpha = params[0] if params else 0.01
        return xp.where(y >= 0, y, y * _f(y, alpha))
    if name == "Clip":
        return xp.clip(y, _f(y, params[0]), _f(y, params[1]))
    if name == "HardSigmoid":
        return hard_sigmoid(y, xp, *(params or [0.2, 0.5])[:2])
    raise NotImplementedError(f"fused activation {name}")


# The generated kernels' epilogue activations (templates/common.cuh), for sites that run them as array ops.
EPILOGUE_ACTIVATIONS = {
    "relu": lambda y, ctx: ctx.xp.maximum(y, _f(y, 0)),
    "gelu": gelu_erf,
    "silu": lambda y, ctx: y * sigmoid(y, ctx.xp),
}


def _clip(inputs, attrs, ctx):
    x = inputs[0]
    if ctx.opset < 11:
        low, high = attrs.get("min", -np.inf), attrs.get("max", np.inf)
    else:
        low = inputs[1] if len(inputs) > 1 and inputs[1] is not None else -np.inf
        high = inputs[2] if len(inputs) > 2 and inputs[2] is not None else np.inf
    return [ctx.xp.clip(x, _f(x, _scalar(low)), _f(x, _scalar(high)))]


def _scalar(value) -> float:
    return float(value.item()) if hasattr(value, "item") else float(value)


_clip.host_inputs = (1, 2)


def _cast(inputs, attrs, ctx):
    return [inputs[0].astype(np_dtype(attrs["to"]))]


def _where(inputs, attrs, ctx):
    return [ctx.xp.where(inputs[0], inputs[1], inputs[2])]


UNARY = {
    "Relu": lambda x, a, ctx: ctx.xp.maximum(x, _f(x, 0)),
    "Sigmoid": lambda x, a, ctx: sigmoid(x, ctx.xp),
    "HardSigmoid": lambda x, a, ctx: hard_sigmoid(x, ctx.xp, a.get("alpha", 0.2), a.get("beta", 0.5)),
    "HardSwish": lambda x, a, ctx: x * hard_sigmoid(x, ctx.xp, 1 / 6, 0.5),
    "LeakyRelu": lambda x, a, ctx: ctx.xp.where(x >= 0, x, x * _f(x, a.get("alpha", 0.01))),
    "Gelu": lambda x, a, ctx: gelu_tanh(x, ctx.xp) if a.get("approximate", "none") == "tanh" else gelu_erf(x, ctx),
    "Erf": lambda x, a, ctx: ctx.erf(x),
    "Softplus": lambda x, a, ctx: ctx.xp.logaddexp(x, _f(x, 0)),
}
NUMPY_UNARY = ("tanh", "exp", "log", "sqrt", "negative", "abs", "reciprocal", "floor", "ceil", "sin", "cos",
               "logical_not")
NUMPY_BINARY = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide", "Pow": "power",
                "Max": "maximum", "Min": "minimum", "Equal": "equal", "Less": "less", "Greater": "greater",
                "LessOrEqual": "less_equal", "GreaterOrEqual": "greater_equal", "And": "logical_and",
                "Or": "logical_or"}
ONNX_UNARY_NAMES = {"tanh": "Tanh", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "negative": "Neg", "abs": "Abs",
                    "reciprocal": "Reciprocal", "floor": "Floor", "ceil": "Ceil", "sin": "Sin", "cos": "Cos",
                    "logical_not": "Not"}


def _div(inputs, attrs, ctx):
    a, b = inputs
    if a.dtype.kind in "iu":  # ONNX integer Div truncates toward zero
        return [ctx.xp.trunc(a / b).astype(a.dtype)]
    return [ctx.xp.divide(a, b)]


def _quick_gelu(inputs, attrs, ctx):
    x = inputs[0]
    return [x * sigmoid(x * _f(x, attrs.get("alpha", 1.702)), ctx.xp)]


def _gated(inputs, attrs, ctx):
    """infc.cpu.GatedActivation (compiler/lower_fuse.py): activation of one half times the other."""
    x = inputs[0]
    d = x.shape[-1] // 2
    gate, up = (x[..., :d], x[..., d:]) if attrs.get("gate", 0) == 0 else (x[..., d:], x[..., :d])
    activation = attrs["activation"]
    if activation == "QuickGelu":
        (act,) = _quick_gelu([gate], attrs, ctx)
    else:
        act = gelu_tanh(gate, ctx.xp) if activation == "FastGelu" else gelu_erf(gate, ctx)
    return [act * up]


def _bias_gelu(inputs, attrs, ctx):
    x, bias = inputs
    if ctx.xp is np or x.dtype != np.float32 or bias.dtype != np.float32:  # the stand-in device: array ops
        return [gelu_erf(x + bias, ctx)]
    return [_bias_gelu_kernel()(x, bias)]


@functools.cache
def _bias_gelu_kernel():
    """BiasGelu as one launch: op by op it was five passes over the tensor plus erf's own (about 1 ms for a
    16 x 512 x 4096 activation on the H200, ten times its bytes' time). Same formula as gelu_erf."""
    import cupy  # noqa: PLC0415 - GPU machines only

    return cupy.ElementwiseKernel("float32 x, float32 bias", "float32 y", BIAS_GELU_CUDA, "infc_bias_gelu")


BIAS_GELU_CUDA = f"const float v = x + bias; y = v * (0.5f + 0.5f * erff(v * {SQRT1_2!r}f))"


def _fast_gelu(inputs, attrs, ctx):
    x = inputs[0] if len(inputs) < 2 or inputs[1] is None else inputs[0] + inputs[1]
    return [gelu_tanh(x, ctx.xp)]


def run_unary_or_binary(op: str, args, attrs, ctx):
    if op in UNARY:
        return UNARY[op](args[0], attrs, ctx)
    return ELEMENTWISE[("", op)](args, attrs, ctx)[0]


def _chain(inputs, attrs, ctx):
    """One generated kernel when the plan carries the chain's cubin (ctx.chain), else op by op."""
    if ctx.chain is not None and ctx.chain.may_run(inputs):
        return [ctx.chain(inputs, ctx)]
    results = []
    for op in attrs["ops"]:
        args = [None if a is None else inputs[a] if a >= 0 else results[-1 - a] for a in op["args"]]
        results.append(run_unary_or_binary(op["op"], args, op.get("attrs") or {}, ctx))
    return [results[-1].astype(inputs[0].dtype, copy=False)]


def _unary_op(fn):
    return lambda inputs, attrs, ctx: [fn(inputs[0], attrs, ctx)]


ELEMENTWISE = {
    **{("", onnx): _binary(name) for onnx, name in NUMPY_BINARY.items()},
    ("", "Div"): _div,
    **{("", ONNX_UNARY_NAMES[name]): _unary(name) for name in NUMPY_UNARY},
    **{("", name): _unary_op(fn) for name, fn in UNARY.items()},
    ("", "Clip"): _clip, ("", "Cast"): _cast, ("", "Where"): _where,
    ("com.microsoft", "QuickGelu"): _quick_gelu, ("com.microsoft", "BiasGelu"): _bias_gelu,
    ("com.microsoft", "FastGelu"): _fast_gelu, ("com.microsoft", "Gelu"): _unary_op(UNARY["Gelu"]),
    ("infc.cpu", "ElementwiseChain"): _chain, ("infc.cpu", "GatedActivation"): _gated,
}
