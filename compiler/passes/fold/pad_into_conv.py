"""A zero Pad of the spatial axes folded into the Conv it feeds, as the Conv's own pads.

    x ─► Pad(pads, constant 0) ─► Conv(W, B?, pads=p) ─►      ==>   x ─► Conv(W, B?, pads=p + pads) ─►

Exporters write TensorFlow-style "same" padding (EfficientNet, MobileNet ports, TF-converted
models) as an explicit Pad before an unpadded Conv: a full copy of the activation per convolution,
and the convolution kernels lose their pad-aware paths. Declined for other pad modes or values,
negative pads, pads on the batch or channel axes, and a Conv with SAME_* auto_pad.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import const_value
from ..engine import Match, Rule
from ..pattern import const, op, var


def _pad_amounts(pad: gs.Node) -> np.ndarray | None:
    """Pads as [begin..., end...] over every axis of the input, or None when not constant."""
    if len(pad.inputs) == 1:  # opset < 11: attributes
        pads = pad.attrs.get("pads")
        return None if pads is None else np.asarray(pads, dtype=np.int64)
    pads = const_value(pad.inputs[1])
    if pads is None:
        return None
    pads = np.asarray(pads, dtype=np.int64).reshape(-1)
    axes_input = pad.inputs[3] if len(pad.inputs) > 3 and not pad.inputs[3].is_empty() else None
    if axes_input is None:
        return pads
    axes, rank = const_value(axes_input), pad.inputs[0].shape
    if axes is None or rank is None:
        return None
    rank = len(rank)
    full = np.zeros(2 * rank, dtype=np.int64)
    for k, axis in enumerate(np.asarray(axes).reshape(-1)):
        axis = int(axis) % rank
        full[axis], full[rank + axis] = pads[k], pads[len(pads) // 2 + k]
    return full


def _pad_value(pad: gs.Node) -> float | None:
    if len(pad.inputs) == 1:
        return float(pad.attrs.get("value", 0.0))
    if len(pad.inputs) < 3 or pad.inputs[2].is_empty():
        return 0.0
    value = const_value(pad.inputs[2])
    return None if value is None or np.asarray(value).size != 1 else float(np.asarray(value).reshape(-1)[0])


def _check(m: Match) -> str | None:
    pad, conv = m.node("pad"), m.node("conv")
    if pad.attrs.get("mode", "constant") != "constant":
        return "Pad mode is not constant"
    if _pad_value(pad) != 0.0:
        return "Pad value is not a constant zero"
    pads = _pad_amounts(pad)
    if pads is None:
        return "Pad amounts are not constant"
    rank = len(pads) // 2
    if rank < 3 or len(m.const("w").shape) != rank:
        return "Pad rank differs from the Conv's"
    if (pads < 0).any():
        return "Pad crops (negative pads)"
    if pads[[0, 1, rank, rank + 1]].any():
        return "Pad pads the batch or channel axis"
    if conv.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return "Conv has SAME auto_pad"
    return None


def _rewrite(m: Match):
    pad, conv = m.node("pad"), m.node("conv")
    pads = _pad_amounts(pad)
    rank = len(pads) // 2
    spatial = rank - 2
    own = conv.attrs.get("pads") if conv.attrs.get("auto_pad", "NOTSET") == "NOTSET" else None
    own = list(own) if own is not None else [0] * (2 * spatial)
    added = list(pads[2:rank]) + list(pads[rank + 2:])
    attrs = {k: v for k, v in conv.attrs.items() if k != "auto_pad"}
    attrs["pads"] = [int(a + b) for a, b in zip(own, added)]
    return [gs.Node("Conv", attrs=attrs, inputs=[m["x"], *conv.inputs[1:]], outputs=m.outputs)]


RULES = (
    Rule("fold_pad_into_conv",
         op.Conv(op.Pad(var("x"), name="pad", allow_extra_inputs=True), const("w"), name="conv", allow_extra_inputs=True),
         _rewrite, _check),
)
