"""LayerNorm written out (ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div) into LayerNormalization.

    x ─┬─► ReduceMean ─► Sub(x, ·) ─┬─► Pow(2)|Mul(·,·) ─► ReduceMean ─► Add(eps) ─► Sqrt ─┐
       └────────────────►┘          └─► Div(·, std) | Mul(·, Reciprocal(std) | Div(1, std)) ◄┘ ─►
      ==>  x ─► LayerNormalization(scale=1, axis, epsilon) ─►
The reduced axes must be the last dims; onnxruntime runs LayerNormalization in the default domain
at every opset. A following constant Mul/Add (gamma, beta) folds in by norm_affine.py's rules.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import const_value
from ..engine import Match, Rule
from ..pattern import const, op, var
from . import layernorm_scaled, norm_affine
from .norm_stats import divided_by, norm_params

x = var("x")


def _check(m: Match) -> str | None:
    params = norm_params(m, ("mean", "var"))
    return params if isinstance(params, str) else None


def _rewrite(m: Match):
    axis, eps, dims = norm_params(m, ("mean", "var"))
    ones = m.constant("ln_scale", np.ones(dims, m["x"].dtype or const_value(m["eps"]).dtype))
    return [gs.Node("LayerNormalization", attrs={"axis": axis, "epsilon": eps}, inputs=[m["x"], ones], outputs=m.outputs)]


_mean = op.ReduceMean(x, name="mean", allow_extra_inputs=True)
_centered = op.Sub(x, _mean)
_STDS = tuple(op.Sqrt(op.Add(op.ReduceMean(sq, name="var", allow_extra_inputs=True), const("eps")))
              for sq in (op.Pow(_centered, const("two")), op.Mul(_centered, _centered)))
RULES = tuple(Rule("layernorm", p, _rewrite, _check) for std in _STDS for p in divided_by(_centered, std)) + \
    layernorm_scaled.RULES + norm_affine.RULES
