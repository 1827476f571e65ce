"""SiLU (x * sigmoid(x)) between quantized convolutions, quantized as onnxruntime's own quantizer
does, so that its CPU provider runs QLinearSigmoid and QLinearMul and stays in int8 from one
convolution to the next:

    Conv ─► Q ─► DQ ─┬─► Sigmoid ─► Q ─► DQ ─┐
                     └───────────────────────┴─► Mul ─► Q ─► DQ ─► (every consumer)

infc's fusions write SiLU as com.microsoft QuickGelu (alpha 1), which has no quantized form: it is
split back first. Left in float, each SiLU sat between a DequantizeLinear and a QuantizeLinear:
YOLOv8n's 57 of them kept its int8 plan at 0.75x the fp32 plan's time where onnxruntime's quantizer's
model ran in 0.60x.
"""

from __future__ import annotations

import onnx
from onnx import helper


def split_quick_gelu(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy with every QuickGelu of alpha 1 (a SiLU) written as Sigmoid and Mul; and how many."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes, count = [], 0
    for node in copy.graph.node:
        alpha = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "alpha"), 1.702)
        if node.domain != "com.microsoft" or node.op_type != "QuickGelu" or alpha != 1.0:
            nodes.append(node)
            continue
        count += 1
        gate = f"{node.output[0]}/sigmoid"
        nodes += [helper.make_node("Sigmoid", [node.input[0]], [gate], name=f"{node.name}/Sigmoid"),
                  helper.make_node("Mul", [node.input[0], gate], [node.output[0]], name=f"{node.name}/Mul")]
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy, count


def silu_names(model: onnx.ModelProto, quantized: list[str]) -> list[str]:
    """The gate and product of each Mul(x, Sigmoid(x)) whose x is quantized (graph outputs stay float)."""
    is_quantized = set(quantized)
    outputs = {o.name for o in model.graph.output}
    sigmoid_of = {node.output[0]: node.input[0] for node in model.graph.node
                  if node.op_type == "Sigmoid" and node.domain in ("", "ai.onnx")}
    names = []
    for node in model.graph.node:
        if node.op_type != "Mul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        x, gate = list(node.input) if node.input[1] in sigmoid_of else list(node.input)[::-1]
        if sigmoid_of.get(gate) == x and x in is_quantized:
            names += [name for name in (gate, node.output[0]) if name not in outputs and name not in is_quantized]
    return list(dict.fromkeys(names))
