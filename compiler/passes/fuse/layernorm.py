"""LayerNorm written out (ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div) into LayerNormalization.

    x ─┬─► ReduceMean ─► Sub(x, ·) ─┬─► Pow(2)|Mul(·,·) ─► ReduceMean ─► Add(eps) ─► Sqrt ─┐
       └────────────────►┘          └─► Div(·, std) | Mul(·, Reciprocal(std) | Div(1, std)) ◄┘ ─►
      ==>  x ─► LayerNormalization(scale=1, axis, epsilon) ─►
    LayerNormalization(x, s, b?) ─► Mul(c) ─►  ==>  LayerNormalization(x, s·c, b·c) ─►  (gamma)
    LayerNormalization(x, s, b?) ─► Add(c) ─►  ==>  LayerNormalization(x, s, b + c) ─►  (beta)
The reduced axes must be the last dims; onnxruntime runs LayerNormalization in the default domain
at every opset. The scale rule also takes RMSNorm's ops, so rmsnorm.py reuses it.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import const_value, is_scalar_const
from ..engine import Match, Rule
from ..pattern import const, op, var
from .gelu import is_float

x = var("x")


def divided_by(numer, std):
    return (op.Div(numer, std, name="norm"), op.Mul(numer, op.Reciprocal(std), name="norm"),
            op.Mul(numer, op.Div(const("one"), std), name="norm"))


def _suffix_axis(node: gs.Node, rank: int | None) -> int | None:
    """ReduceMean axes (attribute before opset 18, input after) as one LayerNorm-style axis < 0."""
    axes = node.attrs.get("axes", const_value(node.inputs[1]) if len(node.inputs) > 1 else None)
    if node.attrs.get("keepdims", 1) != 1 or (axes is None and (len(node.inputs) > 1 or rank is None
                                                                 or node.attrs.get("noop_with_empty_axes", 0))):
        return None
    axes = sorted(a - rank if a >= 0 and rank else a for a in (range(rank) if axes is None else np.ravel(axes)))
    return axes[0] if axes == list(range(-len(axes), 0)) else None


def norm_params(m: Match, reduce_names: tuple[str, ...]):
    """(axis, epsilon, normalized dims) of a written-out norm, or a reason to decline."""
    shape = m["x"].shape
    axes = {_suffix_axis(m.node(n), len(shape) if shape is not None else None) for n in reduce_names}
    if not is_float(m["x"]) or shape is None:
        return "input is not floating point or its rank is unknown"
    if len(axes) != 1 or None in axes or -min(axes) > len(shape):
        return "reduced axes are not the same last dims"
    dims = shape[min(axes):]
    if not all(isinstance(d, int) for d in dims):
        return "normalized dims are not static"
    eps = const_value(m["eps"])
    if eps.size != 1 or not 0 <= float(eps.ravel()[0]) < 1 or ("two" in m.values and not is_scalar_const(m["two"], 2.0, 0)):
        return "not a mean of squares plus a small epsilon"
    if "one" in m.values and not is_scalar_const(m["one"], 1.0, 0):
        return "numerator constant is not 1"
    return min(axes), float(eps.ravel()[0]), tuple(dims)


def _check(m: Match) -> str | None:
    params = norm_params(m, ("mean", "var"))
    return params if isinstance(params, str) else None


def _rewrite(m: Match):
    axis, eps, dims = norm_params(m, ("mean", "var"))
    ones = m.constant("ln_scale", np.ones(dims, m["x"].dtype or const_value(m["eps"]).dtype))
    return [gs.Node("LayerNormalization", attrs={"axis": axis, "epsilon": eps}, inputs=[m["x"], ones], outputs=m.outputs)]


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
_mean = op.ReduceMean(x, name="mean", allow_extra_inputs=True)
_centered = op.Sub(x, _mean)
_STDS = tuple(op.Sqrt(op.Add(op.ReduceMean(sq, name="var", allow_extra_inputs=True), const("eps")))
              for sq in (op.Pow(_centered, const("two")), op.Mul(_centered, _centered)))
RULES = tuple(Rule("layernorm", p, _rewrite, _check) for std in _STDS for p in divided_by(_centered, std)) + (
    SCALE_RULE, Rule("norm_bias", op.Add(_normed("LayerNormalization"), const("c")), _absorb, _check_affine))
