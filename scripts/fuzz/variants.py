"""Whole-model variants of a built graph: another opset (older ones as opset 11 / 13 exporters wrote
them, opset 23 where the graph holds LATE ops), and the model natively in float16 as `model.half()`
exports are."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.version_converter
from onnx import TensorProto, numpy_helper

from .graph import LATE

HALF_MAX = float(np.finfo(np.float16).max)


def converted(model: onnx.ModelProto, opset: int) -> onnx.ModelProto | None:
    """The model at `opset`, or None where onnx's converter has no adapter (LayerNormalization has no
    version before 17) or the result does not check."""
    try:
        out = onnx.version_converter.convert_version(model, opset)
        if opset >= 23 or any(o.domain == LATE for o in out.opset_import):
            out = _late_ops_to_default(out)
        onnx.checker.check_model(out, full_check=True)
        return out
    except Exception:  # noqa: BLE001 - the converter raises bare RuntimeErrors
        return None


def _late_ops_to_default(model: onnx.ModelProto) -> onnx.ModelProto:
    for graph in _graphs(model.graph):
        for node in graph.node:
            if node.domain == LATE:
                node.domain = ""
    kept = [o for o in model.opset_import if o.domain != LATE]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return model


def _graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)


def as_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every float32 tensor as float16, Casts to float32 as Casts to float16; Resize scales stay float32
    (the op's type), values past float16's range are clipped to it as exporters do with finfo.min."""
    half = onnx.ModelProto()
    half.CopyFrom(model)
    float_only = {n.input[2] for g in _graphs(half.graph) for n in g.node if n.op_type == "Resize" and len(n.input) > 2}
    # Range has no float16 form: a float arange stays float32 and is cast after it, as .half() exports do
    ranges = [n for g in _graphs(half.graph) for n in g.node if n.op_type == "Range"]
    float_only |= {i for n in ranges for i in n.input}
    for graph in _graphs(half.graph):
        del graph.value_info[:]  # what the converter inferred in float32; onnxruntime infers again
        for value in [*graph.input, *graph.output]:
            if value.type.tensor_type.elem_type == TensorProto.FLOAT:
                value.type.tensor_type.elem_type = TensorProto.FLOAT16
        for index, tensor in enumerate(graph.initializer):
            if tensor.data_type == TensorProto.FLOAT and tensor.name not in float_only:
                array = np.clip(numpy_helper.to_array(tensor), -HALF_MAX, HALF_MAX).astype(np.float16)
                graph.initializer[index].CopyFrom(numpy_helper.from_array(array, tensor.name))
        for node in graph.node:
            for attr in node.attribute:
                if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT and \
                        node.output[0] not in float_only:
                    attr.i = TensorProto.FLOAT16
        for index in reversed(range(len(graph.node))):
            node = graph.node[index]
            if node.op_type == "Range" and any(i in float_only and _is_float_range(graph, node) for i in node.input):
                out = node.output[0]
                node.output[0] = f"{out}/f32"
                graph.node.insert(index + 1, onnx.helper.make_node("Cast", [node.output[0]], [out], to=TensorProto.FLOAT16))
    return half


def _is_float_range(graph: onnx.GraphProto, node: onnx.NodeProto) -> bool:
    start = next((t for t in graph.initializer if t.name == node.input[0]), None)
    return start is not None and start.data_type == TensorProto.FLOAT


AXES_AS_ATTRIBUTE = {"Squeeze": "axes", "Unsqueeze": "axes", "ReduceSum": "axes", "Split": "split"}  # inputs since 13


def older(model: onnx.ModelProto, opset: int) -> onnx.ModelProto | None:
    """The opset-17 model written at an older opset as exporters wrote it there (onnx's converter has
    no adapters down for most ops): before 13 the axes of Squeeze / Unsqueeze / ReduceSum and Split's
    sizes are attributes, Softmax takes an explicit last axis, Resize an empty roi. None where an op or
    attribute the graph uses did not exist yet (LayerNormalization before 17, HardSwish before 14,
    per-axis DequantizeLinear before 13): the checker at the target opset says so."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    consts = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    ranks = None
    for graph in _graphs(out.graph):
        for node in graph.node:
            if opset >= 13:
                continue
            if node.op_type in AXES_AS_ATTRIBUTE and len(node.input) > 1 and node.input[1]:
                if node.input[1] not in consts:
                    return None
                node.attribute.append(onnx.helper.make_attribute(AXES_AS_ATTRIBUTE[node.op_type],
                                                                 consts[node.input[1]].tolist()))
                del node.input[1]
            elif node.op_type in ("Softmax", "LogSoftmax"):
                axis = next((a for a in node.attribute if a.name == "axis"), None)
                if axis is None:
                    node.attribute.append(onnx.helper.make_attribute("axis", -1))
                elif axis.i != -1:  # before 13 Softmax flattens at its axis: the same only for the last one
                    if ranks is None:
                        inferred = onnx.shape_inference.infer_shapes(model)
                        ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in
                                 [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]}
                    if ranks.get(node.input[0], 0) - 1 != axis.i:
                        return None
            elif node.op_type == "Resize" and not node.input[1]:
                roi = f"{node.name}/roi"
                graph.initializer.append(numpy_helper.from_array(np.zeros(0, np.float32), roi))
                node.input[1] = roi
    for entry in out.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = opset
    try:
        onnx.checker.check_model(out, full_check=True)
    except Exception:  # noqa: BLE001 - an op or attribute the opset lacks
        return None
    return out
