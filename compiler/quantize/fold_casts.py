"""Fold Cast and DequantizeLinear nodes whose inputs are all constants into fp32 constants, before a
reduced-precision graph is lowered for the CPU; and DequantizeLinear alone before an fp32 one (a
model another tool quantized to QDQ stores its weights as int8: its plan computes in float32 from
the dequantized weights, which the tuners then see as constants).

An emulated node reads its weight as `Cast(W_fp16 -> fp32)` and an int8 node as
`DequantizeLinear(W_int8, scale)`; folded, the GEMM or Conv sees a constant again, so the lowering's
fusions and the GEMM tuner treat it as in an fp32 plan. The values are exactly the rounded /
dequantized ones (computed by the runtime's own Cast and DequantizeLinear kernels), so the plan's
numerics are the graph's; the price is that such weights are stored as fp32 in the plan.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..runtime.kernels import kernel_for
from ..runtime.kernels.common import KernelContext
from .model_parts import drop_unused

FOLDABLE = {"Cast", "DequantizeLinear"}


def fold_constant_casts(model: onnx.ModelProto, ops=FOLDABLE) -> tuple[onnx.ModelProto, dict[str, int]]:
    """A copy with the foldable nodes (of `ops`) replaced by initializers; and how many of each op."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    constants = {t.name: t for t in graph.initializer}
    opset = next((o.version for o in copy.opset_import if o.domain in ("", "ai.onnx")), 17)
    kept, added, counts = [], [], {}
    for node in graph.node:
        is_foldable = node.op_type in ops and node.domain in ("", "ai.onnx") and len(node.output) == 1
        if not is_foldable or not all(not name or name in constants for name in node.input):
            kept.append(node)
            continue
        inputs = [numpy_helper.to_array(constants[name]) if name else None for name in node.input]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        (value,) = kernel_for("", node.op_type)(inputs, attrs, KernelContext(opset))
        if value.dtype.kind != "f" or value.dtype.itemsize < 2 or value.dtype.name not in ("float16", "float32", "float64"):
            kept.append(node)  # e.g. a bfloat16 result: leave it to the runtime
            continue
        tensor = numpy_helper.from_array(np.ascontiguousarray(value), node.output[0])
        constants[node.output[0]] = tensor
        added.append(tensor)
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(added)
    drop_unused(graph)
    return copy, counts
