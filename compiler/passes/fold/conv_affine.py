"""Per-channel Add/Sub/Mul/Div by constants folded into the Conv or ConvTranspose that feeds them.

    x ─► Conv(W, B?) ─► Add(c) ─►   ==>   x ─► Conv(W, B + c) ─►
    x ─► Conv(W, B?) ─► Mul(c) ─►   ==>   x ─► Conv(W * c, B * c) ─►     (c over output channels)
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..engine import Match, Rule
from ..pattern import const, op, var
from .channel import out_channels, per_channel, scale_out_channels


def _conv_parts(m: Match):
    conv = m.node("conv")
    w = m.const("w")
    num_out = out_channels(conv.op, w, conv.attrs.get("group", 1))
    b = np.asarray(conv.inputs[2].values) if len(conv.inputs) > 2 else np.zeros(num_out, w.dtype)
    c = per_channel(m.const("c"), len(m.outputs[0].shape) if m.outputs[0].shape is not None else None, num_out)
    return conv, w, b, c


def _check(m: Match) -> str | None:
    conv, w, _, c = _conv_parts(m)
    if len(conv.inputs) > 2 and not isinstance(conv.inputs[2], gs.Constant):
        return "Conv bias is not a constant"
    if m.outputs[0].shape is None:
        return "output rank unknown"
    if c is None:
        return "constant is not one value per output channel"
    if m.const("c").dtype != w.dtype:
        return "constant dtype differs from the weight dtype"
    if m.root.op == "Div" and np.any(c == 0):
        return "division by zero in constant"
    return None


def _rewrite(m: Match):
    conv, w, b, c = _conv_parts(m)
    group = conv.attrs.get("group", 1)
    new_w, new_b = {
        "Add": lambda: (w, b + c),
        "Sub": lambda: (w, b - c),
        "Mul": lambda: (scale_out_channels(conv.op, w, c, group), b * c),
        "Div": lambda: (scale_out_channels(conv.op, w, 1 / c, group), b / c),
    }[m.root.op]()
    return [gs.Node(conv.op, attrs=dict(conv.attrs), inputs=[m["x"], m.constant("conv_w", new_w.astype(w.dtype)),
                                                           m.constant("conv_b", new_b.astype(w.dtype))], outputs=m.outputs)]


def _conv():
    return op.any("Conv", "ConvTranspose")(var("x"), const("w"), name="conv", allow_extra_inputs=True)


RULES = tuple(
    Rule(f"fold_{kind.lower()}_into_conv", op.any(kind)(_conv(), const("c")), _rewrite, _check)
    for kind in ("Add", "Sub", "Mul", "Div")
)
