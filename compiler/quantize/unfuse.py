"""FusedConv / FusedGemm (com.microsoft, from infc's fusions) back into Conv / Gemm + activation,
for INT8: onnxruntime turns `DQ -> Conv -> Q` into QLinearConv (and `DQ -> Gemm -> Q` into QGemm)
but has no quantized form of the fused contrib ops.

    x ─► FusedConv(W, B?, Z?, activation=A?, activation_params=P) ─► y
      ==>  x ─► Conv(W, B?) ─► [Add(Z)] ─► [A(P)] ─► y
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..fused_activations import ACTIVATION_ATTRS as FUSED_ATTRS, attribute_names

# activation name -> how activation_params become the ONNX op's attributes (Clip: constant inputs)
ACTIVATION_ATTRS = {**{name: attribute_names(name) for name in FUSED_ATTRS}, "Clip": ()}
UNFUSED = {"FusedConv": "Conv", "FusedGemm": "Gemm"}
_ACTIVATION_FIELDS = ("activation", "activation_params", "activation_alpha", "activation_beta", "activation_gamma")


def unfuse_activations(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy with every fused node whose activation we know split in two; and how many."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    model = copy
    nodes, count = [], 0
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        activation = attrs.get("activation", b"")
        activation = activation.decode() if isinstance(activation, bytes) else activation
        has_sum = node.op_type == "FusedConv" and len(node.input) > 3 and bool(node.input[3])
        if node.domain != "com.microsoft" or node.op_type not in UNFUSED or (
                activation not in ACTIVATION_ATTRS and not (has_sum and not activation)):
            nodes.append(node)
            continue
        count += 1
        params = list(attrs.get("activation_params", [])) or [attrs[k] for k in ("activation_alpha", "activation_beta",
                                                                                "activation_gamma") if k in attrs]
        base_inputs = list(node.input[:3]) if node.op_type == "FusedConv" else list(node.input)
        kept = {k: v for k, v in attrs.items() if k not in _ACTIVATION_FIELDS}
        hidden = f"{node.output[0]}/preact"
        nodes.append(helper.make_node(UNFUSED[node.op_type], base_inputs, [hidden], name=node.name, **kept))
        if has_sum:
            summed = node.output[0] if not activation else f"{node.output[0]}/sum"
            nodes.append(helper.make_node("Add", [hidden, node.input[3]], [summed], name=f"{node.name}/sum"))
            hidden = summed
        if activation:  # a residual sum alone (conv_residual.py) has none
            nodes.append(_activation_node(model, activation, params, hidden, node.output[0], f"{node.name}/{activation}"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model, count


def _activation_node(model: onnx.ModelProto, activation: str, params: list, x: str, y: str, name: str) -> onnx.NodeProto:
    if activation == "Clip":
        bounds = []
        for index, value in enumerate(params[:2]):
            bound = f"{name}/{'min' if index == 0 else 'max'}"
            model.graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=np.float32), bound))
            bounds.append(bound)
        return helper.make_node("Clip", [x] + bounds, [y], name=name)
    attrs = dict(zip(ACTIVATION_ATTRS[activation], params))
    return helper.make_node(activation, [x], [y], name=name, **attrs)
