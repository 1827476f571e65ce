"""A FusedConv with a residual input (Z) as onnxruntime is given it: Conv, Add, activation.

    x ─► FusedConv(W, B?, Z=z, activation=A?) ─► y      ==>  x ─► Conv(W, B?) ─► Add(·, z) ─► [A] ─► y

infc's conv_residual fusion writes the sum into FusedConv's Z, which saves infc's own kernels a
pass over memory. onnxruntime keeps such a node in NCHW unless Z is already in its blocked NCHWc
layout (the output of another NCHWc convolution): EfficientFormer's 14 MLP convolutions, whose
residual comes from a pooling block, ran as NCHW FusedConv in the plan's session, where the same
model as exported gave onnxruntime Conv + Add and it blocked all 33 convolutions (its NCHWc
transformer adds the sum into the convolution itself wherever it can). So every session infc
builds for onnxruntime (a tactic run, the whole-model variant) gets the sum in the form the
exporter wrote, and onnxruntime fuses it as it would for the user.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..fused_activations import ACTIVATION_ATTRS as FUSED_ATTRS, attribute_names

if TYPE_CHECKING:  # the runtime loads plans without onnx (tests/runtime/test_executor.py); sessions import it
    import onnx

# FusedConv's activation -> the attributes its activation_params become (Clip: constant inputs)
ACTIVATION_ATTRS = {**{name: attribute_names(name) for name in FUSED_ATTRS}, "Clip": ()}
_ACTIVATION_FIELDS = ("activation", "activation_params")


def has_sum(op: str, domain: str, inputs: list[str]) -> bool:
    """A com.microsoft.FusedConv with a residual input whose activation, if any, has an ONNX op."""
    return op == "FusedConv" and domain == "com.microsoft" and len(inputs) > 3 and bool(inputs[3])


def conv_sum_nodes(inputs: list[str], output: str, attrs: dict, name: str = "") -> list[onnx.NodeProto] | None:
    """The Conv, Add and activation nodes (and Clip's bound constants) that compute the FusedConv
    `attrs` (plain values, as decoded) over `inputs`; None when its activation has no form here."""
    from onnx import helper, numpy_helper  # noqa: PLC0415
    activation = attrs.get("activation") or ""
    activation = activation.decode() if isinstance(activation, bytes) else activation
    if activation and activation not in ACTIVATION_ATTRS:
        return None
    params = [float(p) for p in np.ravel(attrs.get("activation_params", []))]
    conv_attrs = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in attrs.items() if k not in _ACTIVATION_FIELDS}
    conv_out, sum_out = f"{output}::conv", (f"{output}::sum" if activation else output)
    nodes = [helper.make_node("Conv", list(inputs[:3]), [conv_out], name=f"{name}::conv", **conv_attrs),
             helper.make_node("Add", [conv_out, inputs[3]], [sum_out], name=f"{name}::sum")]
    if activation == "Clip":
        bounds = [f"{output}::clip_min", f"{output}::clip_max"]
        nodes += [helper.make_node("Constant", [], [bound], name=f"{name}::{bound}", value=numpy_helper.from_array(np.array(value, np.float32)))
                  for bound, value in zip(bounds, params[:2])]
        nodes.append(helper.make_node("Clip", [sum_out, *bounds[:len(params[:2])]], [output], name=f"{name}::clip"))
    elif activation:
        nodes.append(helper.make_node(activation, [sum_out], [output], name=f"{name}::act",
                                      **dict(zip(ACTIVATION_ATTRS[activation], params))))
    return nodes


def with_conv_sums_unfused(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model (a copy when anything changes) with every FusedConv residual sum in the exporter's form."""
    if not any(has_sum(n.op_type, n.domain, list(n.input)) for n in model.graph.node):
        return model
    import onnx  # noqa: PLC0415
    from onnx import helper  # noqa: PLC0415

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes = []
    for node in copy.graph.node:
        unfused = None
        if has_sum(node.op_type, node.domain, list(node.input)):
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            unfused = conv_sum_nodes(list(node.input), node.output[0], attrs, node.name or node.output[0])
        nodes += unfused or [node]
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy
