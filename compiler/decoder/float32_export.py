"""Half-precision decoder exports (model.half() before torch.onnx.export) served in float32.

Decoder plans compute in float32 with a float32 KV cache, as onnxruntime's CPU provider effectively
does for float16 (it has few float16 kernels and casts around the rest). A float16 or bfloat16
export is rewritten before anything else looks at it: its weights and constants widened exactly
(float16's extremes, the masks' stand-ins for infinities, become float32's), every Cast to a half
type made a Cast to float32, and its inputs, outputs and value types float32.
The model's arithmetic is then its float32 counterpart: logits differ from the half model's own
run by the half roundings it no longer makes (larger than float32's: the greedy tokens agree where
the half model's top two logits are not within its rounding), and they come out float32.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

HALF = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}
# attributes that name an element type (Cast's `to`, EyeLike's and the Random ops' `dtype`)
TYPE_ATTRIBUTES = ("to", "dtype")


def half_kind(model: onnx.ModelProto) -> str | None:
    """'float16' or 'bfloat16' when the model's outputs are of that type, or when its float weights
    are (a conversion that kept float32 inputs and outputs casts around a half graph:
    onnxconverter-common's convert_float_to_float16(keep_io_types=True)); else None."""
    kinds = [HALF[o.type.tensor_type.elem_type] for o in model.graph.output if o.type.tensor_type.elem_type in HALF]
    if kinds:
        return kinds[0]
    floats = [t.data_type for t in model.graph.initializer if t.data_type in (*HALF, TensorProto.FLOAT)]
    halves = [HALF[k] for k in floats if k in HALF]
    return halves[0] if floats and len(halves) > len(floats) // 2 else None


def as_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model with every half-precision type, weight and constant made float32."""
    widened = onnx.ModelProto()
    widened.CopyFrom(model)
    _widen_graph(widened.graph)
    return widened


def _float32_tensor(tensor: TensorProto) -> TensorProto:
    half = numpy_helper.to_array(tensor)  # bfloat16 too (onnx reads it through ml_dtypes)
    values = half.astype(np.float32)
    if tensor.data_type == TensorProto.FLOAT16:
        # float16's extremes stand for -inf and +inf in an export's masks (torch.finfo(float16).min):
        # float32's own extremes keep that meaning (a score plus -65504 is no longer hidden in float32)
        limit = np.finfo(np.float16).max
        values[half == -limit] = np.finfo(np.float32).min
        values[half == limit] = np.finfo(np.float32).max
    return numpy_helper.from_array(values, tensor.name)


def _widen_type(type_proto: onnx.TypeProto) -> None:
    which = type_proto.WhichOneof("value")
    if which == "tensor_type" and type_proto.tensor_type.elem_type in HALF:
        type_proto.tensor_type.elem_type = TensorProto.FLOAT
    elif which in ("sequence_type", "optional_type"):
        _widen_type(getattr(type_proto, which).elem_type)


def _widen_graph(graph: onnx.GraphProto) -> None:
    for index, tensor in enumerate(graph.initializer):
        if tensor.data_type in HALF:
            graph.initializer[index].CopyFrom(_float32_tensor(tensor))
    for value in [*graph.input, *graph.output, *graph.value_info]:
        _widen_type(value.type)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.name in TYPE_ATTRIBUTES and attribute.type == onnx.AttributeProto.INT and attribute.i in HALF:
                attribute.i = TensorProto.FLOAT
            elif attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type in HALF:
                attribute.t.CopyFrom(_float32_tensor(attribute.t))
            elif attribute.type == onnx.AttributeProto.GRAPH:
                _widen_graph(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    _widen_graph(subgraph)
