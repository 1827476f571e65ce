"""A Relu / Clip(0, hi) right after a quantized Conv, MatMul or Gemm, folded into that op's output
quantization, as onnxruntime's own quantizer does:

    Conv ─► Q ─► DQ ─► Clip(0, 6) ─► Q ─► DQ        becomes        Conv ─► Q ─► DQ
            (the Conv's range)       (the Clip's)                          (the Clip's range)

With uint8 activations whose zero point is 0, QuantizeLinear already saturates every negative value
to code 0 (dequantized: 0, the clamp's low end), and a range whose top (255 * scale) is at most the
clamp's high end saturates everything above it there, as the Clip followed by the same quantization
does (the clamp's top quantizes to code 255: high / scale >= 254.51): the same codes, one rounding fewer. Kept, the activation stays an fp32 op
between a DequantizeLinear and a QuantizeLinear, which splits onnxruntime's int8 units: MobileNetV2's
35 ReLU6 ran in float with 35 more Q/DQ pairs, and the QDQ model took 29 ms where onnxruntime's own
quantizer's took 14.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from .qdq import Target

UINT8_TOP = 255


def clamps_after(model: onnx.ModelProto, targets: list[Target], constants: dict[str, np.ndarray]) -> dict[str, tuple]:
    """{target output: (the target's node, the activation node, its high end)} for each target whose output is read only
    by a Relu, or by a Clip whose low end is the constant 0 (and high end a constant or absent)."""
    readers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in model.graph.output}
    found = {}
    for target in targets:
        name = target.node.output[0]
        nodes = readers.get(name, [])
        if name in outputs or len(nodes) != 1 or nodes[0].domain not in ("", "ai.onnx") or nodes[0].output[0] in outputs:
            continue
        high = _clamp_high(nodes[0], constants)
        if high is not None:
            found[name] = (target.node, nodes[0], high)
    return found


def _clamp_high(node: onnx.NodeProto, constants: dict) -> float | None:
    """The high end of a clamp at 0 (inf for Relu); None for anything else."""
    if node.op_type == "Relu":
        return math.inf
    if node.op_type != "Clip" or len(node.input) < 2 or node.attribute:  # opset < 11: bounds as attributes
        return None
    low = constants.get(node.input[1]) if node.input[1] else None
    high = constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if low is None or low.size != 1 or float(low) != 0.0:
        return None
    if len(node.input) > 2 and node.input[2] and (high is None or high.size != 1):
        return None
    return math.inf if high is None else float(high)


def fold_clamps(clamps: dict[str, tuple], params: dict[str, tuple]) -> set[int]:
    """Rewires each target whose clamp its output quantization already computes to write the
    activation's output itself; drops the target's own output from `params`. Returns the ids of the
    activation nodes that leave the graph."""
    removed = set()
    for name, (target_node, node, high) in clamps.items():
        scale, zero = params.get(node.output[0], (None, None))
        if scale is None or zero.dtype != np.uint8 or int(zero) != 0 or high / float(scale) < UINT8_TOP - 0.49:
            continue  # int8 symmetric codes keep negatives; a range past the clamp's top is not clamped there
        target_node.output[0] = node.output[0]
        params.pop(name, None)
        removed.add(id(node))
    return removed

