"""A constant Mul/Add after a normalization folds into its scale/bias.

    LayerNormalization(x, s, b?) ─► Mul(c) ─►  ==>  LayerNormalization(x, s·c, b·c) ─►  (gamma)
    LayerNormalization(x, s, b?) ─► Add(c) ─►  ==>  LayerNormalization(x, s, b + c) ─►  (beta)
The scale rule also takes SimplifiedLayerNormalization and RMSNormalization (RMSNorm's gamma).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import const_value
from ..engine import Match, Rule
from ..pattern import const, op, var

x = var("x")


def _folded(m: Match):
    """The constant as a factor over the normalized dims, or None when it varies elsewhere."""
    norm, c, scale = m.node("ln"), m.const("c"), m.const("scale")
    rank = len(norm.outputs[0].shape or ())
    k = rank - norm.attrs.get("axis", -1) % rank if rank else 0
    lead, tail = c.shape[:max(c.ndim - k, 0)], c.shape[max(c.ndim - k, 0):]
    fits = len(tail) <= scale.ndim and all(t in (1, d) for t, d in zip(tail[::-1], scale.shape[::-1]))
    fits = fits and c.ndim <= rank and c.dtype == scale.dtype and all(d == 1 for d in lead)  # no widened output
    return c.reshape(tail) if k and fits else None


def _check_affine(m: Match) -> str | None:
    if not all(isinstance(t, gs.Constant) for t in m.node("ln").inputs[2:] if not t.is_empty()):
        return "norm bias is not a constant"
    return None if _folded(m) is not None else "constant is not per normalized element"


def _absorb(m: Match):
    norm, c, s = m.node("ln"), _folded(m), m.const("scale")
    biases = [const_value(t) for t in norm.inputs[2:3] if not t.is_empty()]
    b = biases[0] if biases else np.zeros_like(s)
    s, b = (s * c, b * c) if m.root.op == "Mul" else (s, b + c)
    inputs = [m["x"], m.constant("norm_scale", s)] + [m.constant("norm_bias", b)] * bool(biases or m.root.op == "Add")
    return [gs.Node(norm.op, attrs=dict(norm.attrs), inputs=inputs, outputs=m.outputs)]


def _normed(*ops):
    return op.any(*ops)(x, const("scale"), name="ln", allow_extra_inputs=True)


SCALE_RULE = Rule("norm_scale", op.Mul(_normed("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"),
                                       const("c")), _absorb, _check_affine)
BIAS_RULE = Rule("norm_bias", op.Add(_normed("LayerNormalization"), const("c")), _absorb, _check_affine)
RULES = (SCALE_RULE, BIAS_RULE)
