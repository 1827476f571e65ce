"""A 1-D bias Add before a GELU, into onnxruntime's GELU with a bias input.

    x ─► Add(bias[H]) ─► Gelu ─►  ==>  x ─► com.microsoft.BiasGelu(x, bias) ─►   (erf GELU)
    x ─► Add(bias[H]) ─► FastGelu | Gelu(approximate="tanh") ─►  ==>  com.microsoft.FastGelu(x, bias) ─►
onnxruntime broadcasts the bias over the last dim only, so it must be 1-D of x's last dim: then
x + bias keeps x's shape and the fused node's output shape is the Add's.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import CONTRIB_DOMAIN, is_float
from ..engine import Match, Rule
from ..pattern import const, ms_op, op, var


def _check(m: Match) -> str | None:
    bias, shape = m.const("bias"), m["x"].shape
    if bias.ndim != 1 or not shape or shape[-1] != bias.shape[0]:
        return "bias is not 1-D over the input's last dim"
    if not is_float(m["x"]) or m["x"].dtype != bias.dtype:
        return "input and bias dtypes differ"
    if m.root.attrs.get("approximate", "none") not in ("none", "tanh"):
        return "unknown GELU approximation"
    if not _is_tanh(m) and bias.dtype == np.float64:
        return "onnxruntime has no CPU BiasGelu for double"
    return None


def _is_tanh(m: Match) -> bool:
    return m.root.op == "FastGelu" or m.root.attrs.get("approximate") == "tanh"


def _rewrite(m: Match):
    return [gs.Node("FastGelu" if _is_tanh(m) else "BiasGelu", domain=CONTRIB_DOMAIN, inputs=[m["x"], m["bias"]],
                    outputs=m.outputs)]


def _biased():
    return op.Add(var("x"), const("bias"))


RULES = tuple(Rule("bias_gelu", gelu(_biased()), _rewrite, _check) for gelu in (op.Gelu, ms_op.Gelu, ms_op.FastGelu))
