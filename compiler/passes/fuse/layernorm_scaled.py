"""LayerNorm as TensorFlow computes it (Keras' LayerNormalization through tf2onnx): the statistics
are taken, but x is never centered; gamma·rsqrt(var + eps) scales x and the mean, then beta is added.

    x ─┬─► mean ─► Sub(x, ·) ─► Mul(·,·) ─► mean ─► Add(eps) ─► Sqrt ─► Reciprocal ─► Mul(gamma) = s
       │    └─► Neg ─► Mul(·, s) ─► Add(beta) ─┐
       └─► Mul(x, s) ─────────────────────────► Add ─►
      ==>  x ─► LayerNormalization(gamma, beta, axis, epsilon) ─►
"mean" is ReduceMean over the last dims or GlobalAveragePool, which tf2onnx writes for a mean over
the last axis of a rank-3 tensor (it averages every dim after the second).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..engine import Match, Rule
from ..pattern import const, op, var
from .norm_stats import norm_params

x = var("x")


def _per_dims(c: np.ndarray, dims: tuple) -> np.ndarray | None:
    """A constant as one value per normalized element, or None when it varies along other dims."""
    if c.ndim > len(dims):
        if any(d != 1 for d in c.shape[:c.ndim - len(dims)]):
            return None
        c = c.reshape(c.shape[c.ndim - len(dims):])
    try:
        return np.ascontiguousarray(np.broadcast_to(c, dims))
    except ValueError:
        return None


def _params(m: Match):
    params = norm_params(m, ("mean", "var"))
    if isinstance(params, str):
        return params
    axis, eps, dims = params
    gamma, beta = _per_dims(m.const("gamma"), dims), _per_dims(m.const("beta"), dims)
    if gamma is None or beta is None:
        return "gamma or beta is not per normalized element"
    if gamma.dtype != m["x"].dtype or beta.dtype != m["x"].dtype:
        return "gamma or beta has another dtype than the input"
    return axis, eps, gamma, beta


def _check(m: Match) -> str | None:
    params = _params(m)
    return params if isinstance(params, str) else None


def _rewrite(m: Match):
    axis, eps, gamma, beta = _params(m)
    inputs = [m["x"], m.constant("ln_scale", gamma), m.constant("ln_bias", beta)]
    return [gs.Node("LayerNormalization", attrs={"axis": axis, "epsilon": eps}, inputs=inputs, outputs=m.outputs)]


_MEAN = ("ReduceMean", "GlobalAveragePool")
_mean = op.any(*_MEAN)(x, name="mean", allow_extra_inputs=True)
_centered = op.Sub(x, _mean)
_var = op.any(*_MEAN)(op.Mul(_centered, _centered), name="var", allow_extra_inputs=True)
_scale = op.Mul(op.Reciprocal(op.Sqrt(op.Add(_var, const("eps")))), const("gamma"))
RULES = (Rule("layernorm_scaled", op.Add(op.Mul(x, _scale), op.Add(op.Mul(op.Neg(_mean), _scale), const("beta"))),
              _rewrite, _check),)
