"""RMSNorm written out into one node; the weight Mul that follows folds in with layernorm's rule.

    x ─┬─► Pow(2)|Mul(x,x) ─► ReduceMean ─► Add(eps) ─► Sqrt ─┐
       └─► Div(x, std) | Mul(x, Reciprocal(std) | Div(1, std)) ◄┘ ─► [Mul(weight)] ─►
      ==>  x ─► RMSNormalization(scale, axis, epsilon) ─►        (opset >= 23)
           x ─► SimplifiedLayerNormalization(scale, ...) ─►      (before; onnxruntime's op in the default domain)

torch's `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w` exports as Sqrt + Reciprocal
(dynamo) or Sqrt + Div(1, ·) (TorchScript).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import opset_of
from ..engine import Match, Rule
from ..pattern import const, op, var
from .norm_affine import SCALE_RULE
from .norm_stats import divided_by, norm_params


def _check(m: Match) -> str | None:
    params = norm_params(m, ("var",))
    return params if isinstance(params, str) else None


def _rewrite(m: Match):
    axis, eps, dims = norm_params(m, ("var",))
    ones = m.constant("rms_scale", np.ones(dims, m["x"].dtype or np.float32))
    kind = "RMSNormalization" if opset_of(m.graph) >= 23 else "SimplifiedLayerNormalization"
    return [gs.Node(kind, attrs={"axis": axis, "epsilon": eps}, inputs=[m["x"], ones], outputs=m.outputs)]


x = var("x")
_STDS = tuple(op.Sqrt(op.Add(op.ReduceMean(sq, name="var", allow_extra_inputs=True), const("eps")))
              for sq in (op.Pow(x, const("two")), op.Mul(x, x)))
RULES = tuple(Rule("rmsnorm", p, _rewrite, _check) for std in _STDS for p in divided_by(x, std)) + (SCALE_RULE,)
