"""onnxruntime's fused contrib ops, as infc's fusions write them, back in the plain ONNX form:

    x ─► FusedConv(W, B?, Z?, activation=A?, activation_params=P) ─► y
      ==>  x ─► Conv(W, B?) ─► [Add(·, Z)] ─► [A(P)] ─► y
    x ─► FusedGemm(a, b, c?, activation=A?, activation_alpha/beta/gamma) ─► y  ==>  Gemm ─► [A] ─► y

Two users need it: INT8 (onnxruntime has quantized forms of Conv and Gemm, none of the fused ops)
and every onnxruntime session infc builds (a FusedConv with a residual sum stays in NCHW there,
where Conv + Add is blocked to NCHWc: runtime/conv_sum_form.py). Clip's bounds are inputs of the
ONNX op, so they come back as constants for the caller to place (initializers in a whole model,
Constant nodes in a one-node session). onnx is imported where nodes are built: the runtime loads
plans without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .fused_activations import ACTIVATION_ATTRS as FUSED_ATTRS, attribute_names

if TYPE_CHECKING:
    import onnx

BASE_OP = {"FusedConv": "Conv", "FusedGemm": "Gemm"}
# activation -> the ONNX attributes its parameters become (Clip: constant inputs instead)
ACTIVATION_ATTRS = {**{name: attribute_names(name) for name in FUSED_ATTRS}, "Clip": ()}
# FusedConv carries activation_params; FusedGemm activation_alpha / beta / gamma
_ACTIVATION_FIELDS = ("activation", "activation_params", "activation_alpha", "activation_beta", "activation_gamma")


def is_fused(op: str, domain: str) -> bool:
    return domain == "com.microsoft" and op in BASE_OP


def has_sum(op: str, domain: str, inputs: list[str]) -> bool:
    """A com.microsoft.FusedConv with a residual input Z."""
    return op == "FusedConv" and domain == "com.microsoft" and len(inputs) > 3 and bool(inputs[3])


def unfused_nodes(op: str, inputs: list[str], output: str, attrs: dict,
                  name: str = "") -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]] | None:
    """The plain nodes computing the fused `op` with `attrs` (plain values, as decoded) over
    `inputs`, and the constants they read by name (Clip's bounds); None when the activation has no
    ONNX form here."""
    from onnx import helper  # noqa: PLC0415

    activation = attrs.get("activation") or ""
    activation = activation.decode() if isinstance(activation, bytes) else activation
    if activation and activation not in ACTIVATION_ATTRS:
        return None
    params = [float(p) for p in np.ravel(attrs.get("activation_params", []))] or [
        float(attrs[k]) for k in ("activation_alpha", "activation_beta", "activation_gamma") if k in attrs]
    base_attrs = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in attrs.items() if k not in _ACTIVATION_FIELDS}
    name = name or output
    summed = has_sum(op, "com.microsoft", inputs)
    steps = [(BASE_OP[op], list(inputs[:3]) if op == "FusedConv" else list(inputs), "base", base_attrs)]
    if summed:
        steps.append(("Add", [None, inputs[3]], "sum", {}))
    constants = {}
    if activation == "Clip":
        bounds = {f"{output}::clip_{end}": np.array(value, np.float32) for end, value in zip(("min", "max"), params[:2])}
        constants.update(bounds)
        steps.append(("Clip", [None, *bounds], "clip", {}))
    elif activation:
        steps.append((activation, [None], "act", dict(zip(ACTIVATION_ATTRS[activation], params))))
    nodes, previous = [], None
    for index, (step_op, step_inputs, role, step_attrs) in enumerate(steps):
        result = output if index == len(steps) - 1 else f"{output}::{role}"
        step_inputs = [previous if arg is None else arg for arg in step_inputs]
        nodes.append(helper.make_node(step_op, step_inputs, [result], name=f"{name}::{role}", **step_attrs))
        previous = result
    return nodes, constants


def constant_nodes(constants: dict[str, np.ndarray]) -> list[onnx.NodeProto]:
    from onnx import helper, numpy_helper  # noqa: PLC0415
    return [helper.make_node("Constant", [], [key], name=key, value=numpy_helper.from_array(value))
            for key, value in constants.items()]
