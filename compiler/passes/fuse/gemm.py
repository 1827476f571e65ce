"""MatMul + bias into Gemm; Gemm + activation into onnxruntime's com.microsoft.FusedGemm.

    A[M,K] ─► MatMul(B[K,N] const) ─► Add(bias [N] | [1,N] | scalar, const) ─►   ==>   A ─► Gemm(B, bias) ─►
    A ─► Gemm(B, C?) ─► Relu | Sigmoid | Tanh | LeakyRelu | HardSigmoid | Elu | Selu | ... ─►
      ==>  A ─► FusedGemm(B, C?, activation="<op>", activation_<attr>=...) ─►

Gemm is 2-D: a rank-3+ A (transformer linears) is declined, not reshaped. FusedGemm carries the
activation's attributes as activation_<name>, as onnxruntime's GemmActivationFusion does, with ONNX
defaults written out (its CPU kernel fails on a missing alpha). That kernel is float32 only and has no
Clip or HardSwish.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...fused_activations import ACTIVATION_ATTRS, FUSED_GEMM_ACTIVATIONS
from ...graph import opset_of
from ..engine import Match, Rule
from ..pattern import const, op, var

# The activations onnxruntime's FusedGemm runs, with their attributes' ONNX defaults.
_ACTIVATIONS = {name: dict(ACTIVATION_ATTRS[name]) for name in FUSED_GEMM_ACTIVATIONS}


def _check_bias(m: Match) -> str | None:
    a_shape, b, bias = m["a"].shape, m.const("b"), m.const("bias")
    if a_shape is None:
        return "A rank unknown"
    if len(a_shape) != 2:
        return f"A is rank {len(a_shape)}; Gemm needs 2-D"
    if b.ndim != 2 or b.dtype.kind != "f":
        return "B is not a 2-D floating-point constant"
    if bias.dtype != b.dtype:
        return "bias and B dtypes differ"
    if bias.ndim > 2 or (bias.ndim == 2 and bias.shape[0] != 1) or (bias.size != 1 and bias.shape[-1] != b.shape[1]):
        return "bias does not broadcast along the last dim"
    if opset_of(m.graph) < 7:
        return "Gemm broadcasts C from opset 7"
    return None


def _to_gemm(m: Match):
    return [gs.Node("Gemm", inputs=[m["a"], m["b"], m["bias"]], outputs=m.outputs)]


def _check_activation(m: Match) -> str | None:
    gemm = m.node("gemm")
    dtype = gemm.outputs[0].dtype or gemm.inputs[0].dtype
    if dtype is None or np.dtype(dtype) != np.float32:
        return "FusedGemm runs only float32 on CPU"
    return None


def _to_fused_gemm(m: Match):
    gemm, act = m.node("gemm"), m.root
    attrs = dict(gemm.attrs, activation=act.op)
    attrs.update({f"activation_{name}": float(act.attrs.get(name, default)) for name, default in _ACTIVATIONS[act.op].items()})
    return [gs.Node("FusedGemm", domain="com.microsoft", attrs=attrs, inputs=list(gemm.inputs), outputs=m.outputs)]


def _gemm():
    return op.Gemm(var("a"), var("b"), name="gemm", allow_extra_inputs=True)


RULES = (
    Rule("fuse_matmul_bias_gemm", op.Add(op.MatMul(var("a"), const("b")), const("bias")), _to_gemm, _check_bias),
    Rule("fuse_gemm_activation", op.any(*_ACTIVATIONS)(_gemm()), _to_fused_gemm, _check_activation),
    Rule("fuse_gemm_activation", op.any("Clip", "HardSwish")(_gemm()), _to_fused_gemm,
         lambda m: f"FusedGemm has no {m.root.op} activation"),
)
