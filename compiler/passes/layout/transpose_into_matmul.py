"""A Transpose that swaps the last two dims of a matmul operand becomes the op's trans flag.

    a ─► Transpose(0.., -1, -2) ─► MatMul(·, b) ─►   ==>   a ─► FusedMatMul(b, transA=1) ─►   (com.microsoft)
    b ─► Transpose(0.., -1, -2) ─► MatMul(a, ·) ─►   ==>   a ─► FusedMatMul(b, transB=1) ─►
      both operands 2-D (opset >= 11, C optional)  ==>   Gemm(a, b, transA/transB) instead: a standard op
    into a Gemm, FusedGemm or FusedMatMul            ==>   the same node with its flag flipped

onnxruntime's FusedMatMul transposes the last two dims of a rank-N operand and broadcasts batch dims
like MatMul; its kernel is taken to be float32 only (as FusedGemm and FusedConv are).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import opset_of
from ..engine import Match, Rule
from ..pattern import ms_op, op, var

_CAPTURE = {0: "a", 1: "b"}
_FLAG = {0: "transA", 1: "transB"}


def _swaps_last_two(t: gs.Node) -> bool:
    shape = t.inputs[0].shape
    perm = t.attrs.get("perm")
    if perm is None:  # ONNX default reverses the dims: a last-two swap only for 2-D
        return shape is not None and len(shape) == 2
    rank = len(perm)
    return rank >= 2 and list(perm) == list(range(rank - 2)) + [rank - 1, rank - 2]


def _becomes_gemm(m: Match) -> bool:
    is_2d = all(t.shape is not None and len(t.shape) == 2 for t in (m["a"], m["b"]))
    return m.root.op == "MatMul" and is_2d and opset_of(m.graph) >= 11


def _check(side: int, m: Match) -> str | None:
    if not _swaps_last_two(m.node("t")):
        return "Transpose does not swap only the last two dims"
    if m.root.attrs.get("transBatchA", 0) or m.root.attrs.get("transBatchB", 0):
        return "FusedMatMul already transposes batch dims"
    dtype = m.outputs[0].dtype or m[_CAPTURE[side]].dtype
    if m.root.op != "MatMul":
        return None
    if dtype is None or np.dtype(dtype).kind != "f":
        return "MatMul is not floating point (Gemm and FusedMatMul are)"
    return None if _becomes_gemm(m) or np.dtype(dtype) == np.float32 else "FusedMatMul runs only float32 on CPU"


def _rewrite(side: int, m: Match):
    root = m.root
    inputs = list(root.inputs)
    inputs[side] = m[_CAPTURE[side]]
    attrs = dict(root.attrs)
    attrs[_FLAG[side]] = 1 - int(attrs.get(_FLAG[side], 0))
    if root.op != "MatMul":
        return [gs.Node(root.op, domain=root.domain, attrs=attrs, inputs=inputs, outputs=m.outputs)]
    if _becomes_gemm(m):
        return [gs.Node("Gemm", attrs=attrs, inputs=inputs, outputs=m.outputs)]
    return [gs.Node("FusedMatMul", domain="com.microsoft", attrs=attrs, inputs=inputs, outputs=m.outputs)]


def _operands(side: int):
    t = op.Transpose(var(_CAPTURE[side]), name="t")
    return (t, var("b")) if side == 0 else (var("a"), t)


_TARGETS = {"matmul": op.MatMul, "gemm": op.Gemm, "fused_matmul": ms_op.FusedMatMul, "fused_gemm": ms_op.FusedGemm}

RULES = tuple(
    Rule(f"transpose_into_{name}_{_FLAG[side]}", build(*_operands(side), allow_extra_inputs=name != "matmul"),
         partial(_rewrite, side), partial(_check, side))
    for name, build in _TARGETS.items() for side in (0, 1)
)
