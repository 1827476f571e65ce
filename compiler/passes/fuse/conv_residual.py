"""A residual Add after a Conv (and the activation after the sum) into com.microsoft.FusedConv's Z input.

    x ─► Conv(W, B?) ─► Add(·, z) ─► Relu | Tanh | ... ─►      ==>  x ─► FusedConv(W, B?, Z=z, activation) ─►
    x ─► Conv(W, B?) ─► Add(·, z) ─►                           ==>  x ─► FusedConv(W, B?, Z=z) ─►

onnxruntime's FusedConv computes activation(conv(x) + Z), so the sum and the activation take no
pass of their own over memory (ResNet's bottlenecks: three of every block's four). Z is not
broadcast: its shape must provably equal the convolution's output, dim by dim (the same number or
the same symbol); activations and their parameters as in conv_activation.py.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx_graphsurgeon as gs

from ..engine import Match, Rule
from ..pattern import op, var
from .conv_activation import _params

ACTIVATIONS = ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "HardSigmoid")


def _same_shape(a, b) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(x is not None and x == y for x, y in zip(a, b))


def _check(m: Match, has_act: bool) -> str | None:
    conv = m.node("conv")
    if len(conv.inputs) > 3:
        return "the Conv already has more than three inputs"
    dtype = conv.outputs[0].dtype or conv.inputs[1].dtype
    if dtype is None or np.dtype(dtype) != np.float32 or m["z"].dtype is None or np.dtype(m["z"].dtype) != np.float32:
        return "FusedConv runs only float32 on CPU"
    if not _same_shape(conv.outputs[0].shape, m["z"].shape):
        return "the residual's shape is not provably the convolution's (FusedConv does not broadcast Z)"
    if has_act and _params(m.node("act")) is None:
        return "Clip bounds are not scalar constants"
    readers = m.node("add").outputs[0].outputs
    if not has_act and len(readers) == 1 and readers[0].op in (*ACTIVATIONS, "Clip"):
        return "left to the form with the activation after the sum"
    return None


def _rewrite(m: Match, has_act: bool):
    conv = m.node("conv")
    attrs = dict(conv.attrs)
    if has_act:
        act = m.node("act")
        attrs["activation"] = act.op
        params = _params(act)
        if params:
            attrs["activation_params"] = params
    inputs = list(conv.inputs) + [gs.Variable.empty()] * (3 - len(conv.inputs)) + [m["z"]]
    return [gs.Node("FusedConv", domain="com.microsoft", attrs=attrs, inputs=inputs, outputs=m.outputs)]


def _sum():
    return op.Add(op.Conv(var("x"), var("w"), name="conv", allow_extra_inputs=True), var("z"), name="add")


# The bare sum declines when an activation reads it, which the activation forms then take.
RULES = (
    Rule("fuse_conv_residual", op.any(*ACTIVATIONS)(_sum(), name="act"), partial(_rewrite, has_act=True),
         partial(_check, has_act=True)),
    Rule("fuse_conv_residual", op.Clip(_sum(), name="act", allow_extra_inputs=True), partial(_rewrite, has_act=True),
         partial(_check, has_act=True)),
    Rule("fuse_conv_residual", _sum(), partial(_rewrite, has_act=False), partial(_check, has_act=False)),
)
