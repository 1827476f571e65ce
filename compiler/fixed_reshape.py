"""A sample run that onnxruntime fails too, in a Reshape to a constant shape: the model was
exported for one set of shapes (tf2onnx's TFLite graphs write every Reshape with the batch of 1
baked in, so editing the input's batch dim to a dim_param does not make them batch-dynamic), and no
inputs will make it run at the profile's: say so instead of asking for representative inputs."""

from __future__ import annotations

import re

import onnx
from onnx import numpy_helper

_RESHAPE_FAILED = re.compile(r"running Reshape node\. Name:'([^']+)'")


def fixed_reshape_hint(model: onnx.ModelProto, reason: str) -> str | None:
    """What to do when `reason` (onnxruntime's) is a Reshape whose target shape is a constant; else None."""
    found = _RESHAPE_FAILED.search(reason)
    if found is None:
        return None
    node = next((n for n in model.graph.node if n.op_type == "Reshape" and n.name == found.group(1)), None)
    if node is None or len(node.input) < 2:
        return None
    shape = _constant(model, node.input[1])
    if shape is None:
        return None
    return (f"Reshape '{node.name}' has the constant target shape {shape}, fixed when the model was exported: "
            "profile only the shapes it was exported for, or export it again with dynamic dims")


def _constant(model: onnx.ModelProto, name: str) -> list[int] | None:
    for tensor in model.graph.initializer:
        if tensor.name == name:
            return numpy_helper.to_array(tensor).astype(int).tolist()
    for node in model.graph.node:
        if node.op_type == "Constant" and name in node.output:
            value = next((a for a in node.attribute if a.name == "value"), None)
            return numpy_helper.to_array(value.t).astype(int).tolist() if value is not None else None
    return None
