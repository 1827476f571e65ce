"""BatchNormalization folded into the Conv, ConvTranspose or MatMul/Gemm that feeds it.

    x ─► Conv(W, B?) ─► BatchNormalization(scale, bias, mean, var) ─►
      ==>  x ─► Conv(W * s, (B - mean) * s + bias) ─►        s = scale / sqrt(var + eps) per output channel
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..engine import Match, Rule
from ..pattern import const, op, var
from .channel import out_channels, scale_out_channels


def _bn_scale_shift(m: Match):
    bn = m.node("bn")
    eps = bn.attrs.get("epsilon", 1e-5)
    scale = m.const("scale").astype(np.float64) / np.sqrt(m.const("var").astype(np.float64) + eps)
    return scale, m.const("bias").astype(np.float64) - m.const("mean").astype(np.float64) * scale


def _check_bn(m: Match) -> str | None:
    if len([o for o in m.node("bn").outputs if not o.is_empty()]) > 1:
        return "BatchNormalization is in training mode (running stats are outputs)"
    return None


def _check_conv(m: Match) -> str | None:
    conv = m.node("conv")
    if len(conv.inputs) > 2 and not isinstance(conv.inputs[2], gs.Constant):
        return "Conv bias is not a constant"
    if m.const("w").dtype.kind != "f":
        return "Conv weight is not floating point"
    if m.const("scale").size != out_channels(conv.op, m.const("w"), conv.attrs.get("group", 1)):
        return "BatchNormalization channels differ from the Conv output channels"
    return _check_bn(m)


def _fold_into_conv(m: Match):
    conv = m.node("conv")
    scale, shift = _bn_scale_shift(m)
    w = m.const("w")
    bias = np.asarray(conv.inputs[2].values, dtype=np.float64) if len(conv.inputs) > 2 else 0.0
    new_w = scale_out_channels(conv.op, w.astype(np.float64), scale, conv.attrs.get("group", 1)).astype(w.dtype)
    new_b = (bias * scale + shift).astype(w.dtype)
    return [gs.Node(conv.op, attrs=dict(conv.attrs), inputs=[m["x"], m.constant("bn_folded_w", new_w),
                                                           m.constant("bn_folded_b", new_b)], outputs=m.outputs)]


def _check_matmul(m: Match) -> str | None:
    out_shape = m.node("matmul").outputs[0].shape
    w = m.const("w")
    if w.ndim != 2 or out_shape is None or len(out_shape) != 2:
        return "BatchNormalization after a MatMul folds only when the MatMul output is 2-D [N, features]"
    return _check_bn(m)


def _fold_into_matmul(m: Match):
    scale, shift = _bn_scale_shift(m)
    w = m.const("w")
    hidden = m.value("bn_folded_mm", like=m.outputs[0])
    return [
        gs.Node("MatMul", inputs=[m["x"], m.constant("bn_folded_w", (w * scale[None, :]).astype(w.dtype))], outputs=[hidden]),
        gs.Node("Add", inputs=[hidden, m.constant("bn_folded_b", shift.astype(w.dtype))], outputs=m.outputs),
    ]


_STATS = (const("scale"), const("bias"), const("mean"), const("var"))

RULES = (
    Rule("fold_batchnorm_into_conv",
         op.BatchNormalization(op.any("Conv", "ConvTranspose")(var("x"), const("w"), name="conv", allow_extra_inputs=True),
                               *_STATS, name="bn"),
         _fold_into_conv, _check_conv),
    Rule("fold_batchnorm_into_matmul",
         op.BatchNormalization(op.MatMul(var("x"), const("w"), name="matmul"), *_STATS, name="bn"),
         _fold_into_matmul, _check_matmul),
)
