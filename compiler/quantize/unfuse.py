"""FusedConv / FusedGemm (com.microsoft, from infc's fusions) back into Conv / Gemm + activation,
for INT8: onnxruntime turns `DQ -> Conv -> Q` into QLinearConv (and `DQ -> Gemm -> Q` into QGemm)
but has no quantized form of the fused contrib ops. The plain form itself is unfused_form.py.
"""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

from ..unfused_form import is_fused, unfused_nodes


def unfuse_activations(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy with every fused node whose activation has an ONNX op split apart; and how many."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes, count = [], 0
    for node in copy.graph.node:
        unfused = None
        if is_fused(node.op_type, node.domain):
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            unfused = unfused_nodes(node.op_type, list(node.input), node.output[0], attrs, node.name)
        if unfused is None:
            nodes.append(node)
            continue
        count += 1
        plain, constants = unfused
        nodes += plain
        copy.graph.initializer.extend(numpy_helper.from_array(value, key) for key, value in constants.items())
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy, count
