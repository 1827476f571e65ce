"""SiLU (Swish) written as x * sigmoid(x), into one node.

    x ─┬─► Sigmoid ─► Mul ─►     ==>   x ─► com.microsoft.QuickGelu(alpha=1) ─►
       └────────────►┘

QuickGelu computes x * sigmoid(alpha * x), so alpha=1 is SiLU exactly. ONNX Swish (opset 24) would
be the standard op, but onnxruntime 1.31 has a CPU kernel for it at opset 24 only (none at 25+),
and the SwiGLU fusion and the runtime's gated-GEMM epilogue key on this one form.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ...graph import CONTRIB_DOMAIN, is_float
from ..engine import Match, Rule
from ..pattern import op, var


def _check(m: Match) -> str | None:
    return None if is_float(m["x"]) else "input is not floating point"


def _rewrite(m: Match):
    return [gs.Node("QuickGelu", domain=CONTRIB_DOMAIN, attrs={"alpha": 1.0}, inputs=[m["x"]], outputs=m.outputs)]


RULES = (Rule("silu", op.Mul(var("x"), op.Sigmoid(var("x"))), _rewrite, _check),)
