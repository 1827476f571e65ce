"""Conv and the activation after it, into onnxruntime's com.microsoft.FusedConv (float32 CPU kernel).

    x ─► Conv(W, B?) ─► Relu | Tanh | Sigmoid | LeakyRelu | HardSigmoid | Clip ─►
      ==>  x ─► FusedConv(W, B?, activation="<op>", activation_params=[...]) ─►

activation_params as onnxruntime's ConvActivationFusion writes them: LeakyRelu [alpha], HardSigmoid
[alpha, beta], Clip [min, max] (an omitted bound is -/+FLT_MAX; a non-constant one declines). Declined
with a reason: SiLU (Conv ─┬─► Sigmoid ─► Mul) has no FusedConv kernel; HardSwish (the op or its
x * HardSigmoid(x) form) is a FusedConv activation only from onnxruntime 1.31 on, and infc's optimized
models must run on every onnxruntime it supports (>= 1.20).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import const_value
from ..engine import Match, Rule
from ..pattern import op, var

FLT_MAX = float(np.finfo(np.float32).max)
# Attributes FusedConv takes as activation_params, in order, with their ONNX defaults.
_PARAMS = {"LeakyRelu": (("alpha", 0.01),), "HardSigmoid": (("alpha", 0.2), ("beta", 0.5))}


def _clip_bounds(clip: gs.Node) -> list[float] | None:
    if len(clip.inputs) == 1:  # opset < 11 keeps the bounds as attributes
        return [float(clip.attrs.get("min", -FLT_MAX)), float(clip.attrs.get("max", FLT_MAX))]
    bounds = []
    for index, default in ((1, -FLT_MAX), (2, FLT_MAX)):
        tensor = clip.inputs[index] if len(clip.inputs) > index else None
        value = None if tensor is None or tensor.is_empty() else const_value(tensor)
        if tensor is not None and not tensor.is_empty() and (value is None or value.size != 1):
            return None
        bounds.append(default if value is None else float(value.reshape(-1)[0]))
    return bounds


def _params(act: gs.Node) -> list[float] | None:
    if act.op == "Clip":
        return _clip_bounds(act)
    return [float(act.attrs.get(name, default)) for name, default in _PARAMS.get(act.op, ())]


def _check(m: Match) -> str | None:
    conv = m.node("conv")
    dtype = conv.outputs[0].dtype or conv.inputs[1].dtype
    if dtype is None or np.dtype(dtype) != np.float32:
        return "FusedConv runs only float32 on CPU"
    if _params(m.node("act")) is None:
        return "Clip bounds are not scalar constants"
    return None


def _rewrite(m: Match):
    conv, act = m.node("conv"), m.node("act")
    attrs = dict(conv.attrs, activation=act.op)
    params = _params(act)
    if params:
        attrs["activation_params"] = params
    return [gs.Node("FusedConv", domain="com.microsoft", attrs=attrs, inputs=list(conv.inputs), outputs=m.outputs)]


def _conv():
    return op.Conv(var("x"), var("w"), name="conv", allow_extra_inputs=True)


_SHARED = _conv()  # one Conv feeding both arms of a diamond
_NO_HARDSWISH = "FusedConv HardSwish needs onnxruntime >= 1.31"

RULES = (
    Rule("fuse_conv_activation", op.any("Relu", "Tanh", "Sigmoid", "LeakyRelu", "HardSigmoid")(_conv(), name="act"),
         _rewrite, _check),
    Rule("fuse_conv_clip", op.Clip(_conv(), name="act", allow_extra_inputs=True), _rewrite, _check),
    Rule("fuse_conv_hardswish", op.HardSwish(_conv()), _rewrite, lambda m: _NO_HARDSWISH),
    Rule("fuse_conv_hardswish", op.Mul(_SHARED, op.HardSigmoid(_SHARED)), _rewrite, lambda m: _NO_HARDSWISH),
    Rule("fuse_conv_silu", op.Mul(_SHARED, op.Sigmoid(_SHARED)), _rewrite, lambda m: "FusedConv has no SiLU activation"),
)
