"""Residual Add (+ optional 1-D bias Add) feeding a norm, into onnxruntime's Skip*Normalization.

    input ─► [Add(bias)] ─► Add ─┬─► LayerNormalization(gamma, beta?) ─►
    skip ───────────────────────►┘└─► (the sum, still read by the next residual Add)
      ==>  com.microsoft.SkipLayerNormalization(input, skip, gamma, beta, bias)
               ─► output, -, -, input_skip_bias_sum
    SimplifiedLayerNormalization / RMSNormalization  ==>  SkipSimplifiedLayerNormalization
onnxruntime's rules: input 2-D or 3-D; skip of the same shape, or [1, S, H] / [S, H] against a 3-D
input; the output takes the input's shape, so which operand is the full one must be provable.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import CONTRIB_DOMAIN, const_value
from ..engine import Match, Rule
from ..pattern import const, op, var

_FUSED = {"LayerNormalization": "SkipLayerNormalization", "SimplifiedLayerNormalization": "SkipSimplifiedLayerNormalization",
          "RMSNormalization": "SkipSimplifiedLayerNormalization"}
# onnxruntime's Skip* kernels take float, float16 and bfloat16 only (no double); bfloat16 is untested here.
_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


def _skip_fits(inp, skip) -> bool:
    """Dims are equal only when provably so: the same number or the same symbol."""
    if inp is None or skip is None or len(inp) not in (2, 3) or len(skip) not in (2, 3) or len(skip) > len(inp):
        return False
    same = all(a is not None and a == b for a, b in zip(inp[-2:], skip[-2:]))
    return same and (len(skip) < len(inp) or len(inp) == 2 or skip[0] == 1 or (inp[0] is not None and inp[0] == skip[0]))


def _check(m: Match) -> str | None:
    ln, gamma = m.node("ln"), m.const("gamma")
    extra = [t for t in ln.inputs[2:] if not t.is_empty()]
    if any(o.outputs or o in m.graph.outputs for o in ln.outputs[1:] if not o.is_empty()):
        return "norm statistics outputs are used"
    if any(not isinstance(t, gs.Constant) for t in extra) or ln.attrs.get("axis", -1) not in (-1, len(ln.outputs[0].shape or ()) - 1):
        return "norm is not over the last dim with constant parameters"
    hidden = gamma.shape[-1] if gamma.ndim == 1 else None
    params = [gamma] + [const_value(t) for t in extra] + ([m.const("bias")] if "bias" in m.values else [])
    if hidden is None or any(p.shape != (hidden,) or p.dtype != gamma.dtype for p in params):
        return "gamma, beta or bias is not 1-D over the hidden dim"
    if m["input"].dtype is None or np.dtype(m["input"].dtype) not in _DTYPES or m["skip"].dtype != m["input"].dtype:
        return "input and skip are not both float32 or float16"
    if not _skip_fits(m["input"].shape, m["skip"].shape):
        return "input and skip shapes are not provably what onnxruntime accepts"
    return None if m["input"].shape[-1] == hidden else "hidden dim differs from gamma"


def _rewrite(m: Match):
    ln, total = m.node("ln"), m.exposed["add"][0]
    kind = _FUSED[ln.op]
    beta = [t for t in ln.inputs[2:3] if not t.is_empty()] or [gs.Variable.empty()]
    norm_inputs = [m["gamma"]] + beta * (kind == "SkipLayerNormalization")
    bias = [m["bias"]] if "bias" in m.values else []
    is_sum_read = len(total.outputs) > 1 or total in m.graph.outputs
    outputs = [m.outputs[0]] + ([gs.Variable.empty(), gs.Variable.empty(), total] if is_sum_read else [])
    inputs = [m["input"], m["skip"]] + norm_inputs + bias
    while inputs[-1].is_empty():
        inputs.pop()
    return [gs.Node(kind, domain=CONTRIB_DOMAIN, attrs={"epsilon": float(ln.attrs.get("epsilon", 1e-5))},
                    inputs=inputs, outputs=outputs)]


def _rules(norm_op):
    residuals = (op.Add(op.Add(var("input"), const("bias")), var("skip"), name="add"),
                 op.Add(var("input"), var("skip"), name="add"))
    return tuple(Rule("skip_layernorm", norm_op(r, const("gamma"), name="ln", allow_extra_inputs=True), _rewrite, _check,
                      exposed=("add",)) for r in residuals)


RULES = _rules(op.LayerNormalization) + _rules(op.any("SimplifiedLayerNormalization", "RMSNormalization"))
