"""Constant matmul weights stored in the order they are read: trans flags on constants go away.

    x ─► Gemm | FusedGemm (W const, transB=1) ─►       ==>   x ─► Gemm | FusedGemm (Wᵀ, transB=0) ─►
    x ─► FusedMatMul (W const, transB=1) ─►             ==>   x ─► FusedMatMul (Wᵀ, transB=0) ─►
      ... and when no flag is left (alpha 1)            ==>   x ─► MatMul(Wᵀ) ─►   (a standard op again)
    the same for a constant A with transA=1

The choice: every constant GEMM weight is stored [K, N] row-major, the layout MatMul reads. One layout
per weight means one tuning key and no per-call transpose in generated kernels, and a FusedMatMul whose
only flag sat on a constant returns to plain MatMul. onnxruntime prepacks either layout, so this is
neutral there. A Transpose of a constant feeding a MatMul needs nothing here: constant folding
folds it, and a Transpose turned into a flag by `transpose_into_matmul` is undone by these rules.
A weight other nodes also read is left alone (declined), so no weight is ever stored twice. Patterns
cannot test attributes, so every GEMM with a constant operand is visited; one without the flag is
declined as not applicable (nothing to do, not counted as a rejection).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx_graphsurgeon as gs

from ..engine import NOT_APPLICABLE, Match, Rule
from ..pattern import const, ms_op, op, var

_FLAG = {0: "transA", 1: "transB"}


def _check(side: int, m: Match) -> str | None:
    if not int(m.root.attrs.get(_FLAG[side], 0)):
        return NOT_APPLICABLE
    if m.const("w").ndim < 2:
        return "weight is not at least 2-D"
    if len(m["w"].outputs) > 1:
        return "weight is shared with other nodes"
    if m.root.attrs.get("transBatchA", 0) or m.root.attrs.get("transBatchB", 0):
        return "FusedMatMul transposes batch dims"
    return None


def _rewrite(side: int, m: Match):
    root = m.root
    inputs = list(root.inputs)
    inputs[side] = m.constant("pretransposed_w", np.swapaxes(m.const("w"), -1, -2))
    attrs = {k: v for k, v in root.attrs.items() if k != _FLAG[side]}
    is_plain = not any(int(attrs.get(flag, 0)) for flag in _FLAG.values()) and float(attrs.get("alpha", 1.0)) == 1.0
    if root.op == "FusedMatMul" and is_plain and not attrs.get("transBatchA", 0) and not attrs.get("transBatchB", 0):
        return [gs.Node("MatMul", inputs=inputs, outputs=m.outputs)]
    return [gs.Node(root.op, domain=root.domain, attrs=attrs, inputs=inputs, outputs=m.outputs)]


def _operands(side: int):
    return (const("w"), var("other")) if side == 0 else (var("other"), const("w"))


_TARGETS = {"gemm": op.Gemm, "fused_gemm": ms_op.FusedGemm, "fused_matmul": ms_op.FusedMatMul}

RULES = tuple(
    Rule(f"pretranspose_{name}_{_FLAG[side]}", build(*_operands(side), allow_extra_inputs=True),
         partial(_rewrite, side), partial(_check, side))
    for name, build in _TARGETS.items() for side in (0, 1)
)
