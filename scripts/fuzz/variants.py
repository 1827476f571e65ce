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


def scales_of(node: onnx.NodeProto) -> str | None:
    """A Resize's or Upsample's scales input (float32 at any opset): (X, roi, scales) from 11, (X, scales)
    at 10 and for Upsample-9."""
    if node.op_type not in ("Resize", "Upsample") or len(node.input) < 2:
        return None
    return node.input[1] if len(node.input) == 2 else node.input[2]


def as_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every float32 tensor as float16, Casts to float32 as Casts to float16; Resize scales stay float32
    (the op's type), values past float16's range are clipped to it as exporters do with finfo.min."""
    half = onnx.ModelProto()
    half.CopyFrom(model)
    float_only = {scales_of(n) for g in _graphs(half.graph) for n in g.node} - {None}
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


# inputs that were attributes before an opset: op -> (the first opset with inputs, ((input index,
# attribute, kind), ...)); "ints" a list, "float" / "int" a scalar. Slice's steps had no attribute
# (a step other than 1 cannot be written before 10)
ATTRIBUTES_BEFORE = {
    "Squeeze": (13, ((1, "axes", "ints"),)), "Unsqueeze": (13, ((1, "axes", "ints"),)),
    "ReduceSum": (13, ((1, "axes", "ints"),)), "Split": (13, ((1, "split", "ints"),)),
    "Slice": (10, ((1, "starts", "ints"), (2, "ends", "ints"), (3, "axes", "ints"), (4, None, "ones"))),
    "Pad": (11, ((1, "pads", "ints"), (2, "value", "float"))), "Clip": (11, ((1, "min", "float"), (2, "max", "float"))),
    "TopK": (10, ((1, "k", "int"),)),
}
# attributes an op gained at an opset, with the default its older form always meant
ATTRIBUTES_SINCE = {("TopK", "largest"): (11, 1), ("TopK", "sorted"): (11, 1), ("DepthToSpace", "mode"): (11, "DCR")}


def _drop_newer_attributes(node, opset: int) -> bool:
    for attr in list(node.attribute):
        first, default = ATTRIBUTES_SINCE.get((node.op_type, attr.name), (0, None))
        if opset < first:
            if onnx.helper.get_attribute_value(attr) not in (default, str(default).encode()):
                return False
            node.attribute.remove(attr)
    return True


# Resize before 11 took (X, scales) and only its mode; before 10 it was Upsample (scales an attribute before 9)
RESIZE_ONLY_AT_10 = {"mode"}


def _attributes_from_inputs(node, opset: int, consts: dict) -> bool:
    """node's constant inputs written as the attributes `opset` had; False where it cannot be."""
    first, moved = ATTRIBUTES_BEFORE[node.op_type]
    if opset >= first:
        return True
    for index, attribute, kind in moved:
        if index >= len(node.input) or not node.input[index]:
            continue
        if node.input[index] not in consts:
            return False
        value = consts[node.input[index]]
        if kind == "ones":
            if not np.all(value == 1):
                return False
            continue
        value = value.tolist() if kind == "ints" else float(value) if kind == "float" else int(value.reshape(-1)[0])
        node.attribute.append(onnx.helper.make_attribute(attribute, value))
    del node.input[1:]
    return True


def _resize_before_11(node, opset: int, consts: dict) -> bool:
    """Resize(X, roi, scales) as opset 10's Resize(X, scales) or, before 10, Upsample."""
    mode = next((a.s.decode() for a in node.attribute if a.name == "mode"), "nearest")
    if mode not in ("nearest", "linear") or len(node.input) < 3 or not node.input[2] or len(node.input) > 3:
        return False  # cubic, or sizes: nothing to write it as
    scales = node.input[2]
    kept = [a for a in node.attribute if a.name in RESIZE_ONLY_AT_10]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.input[:] = [node.input[0], scales]
    if opset < 10:
        node.op_type = "Upsample"
        if opset < 9:  # scales an attribute
            if scales not in consts:
                return False
            node.attribute.append(onnx.helper.make_attribute("scales", consts[scales].astype(float).tolist()))
            del node.input[1:]
    return True


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model)
    ranks = {}
    for graph in _graphs(inferred.graph):
        ranks.update({v.name: len(v.type.tensor_type.shape.dim) for v in [*graph.input, *graph.value_info, *graph.output]
                      if v.type.tensor_type.HasField("shape")})
    return ranks


def _axes_from_the_front(out: onnx.ModelProto, model: onnx.ModelProto) -> bool:
    """Axes counted from the back (-1) came with opset 11: before it they are written from the front,
    with the ranks of the opset-17 model; Slice-10's axes input gets a constant of its own. False where a
    rank is unknown (onnx's Slice-10 inference kept a negative axis' input dim: an empty slice typed as
    full, and onnxruntime reused a buffer of that size, fuzz_graphs --forms old seed 840)."""
    ranks = None
    consts = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    for graph in _graphs(out.graph):
        for node in graph.node:
            attrs = [a for a in node.attribute if a.name in ("axis", "axes")]
            axes_input = node.input[3] if node.op_type == "Slice" and len(node.input) > 3 and node.input[3] else None
            if not any(min(onnx.helper.get_attribute_value(a), default=0) < 0 if a.name == "axes" else a.i < 0
                       for a in attrs) and not (axes_input and consts[axes_input].min(initial=0) < 0):
                continue
            ranks = ranks if ranks is not None else _ranks(model)
            rank = ranks.get(node.input[0])
            if rank is None:
                return False
            for attr in attrs:
                if attr.name == "axis":
                    attr.i += (rank + (node.op_type == "Flatten")) * (attr.i < 0)
                else:
                    width = rank + len(attr.ints) * (node.op_type == "Unsqueeze")
                    attr.ints[:] = [a + width * (a < 0) for a in attr.ints]
            if axes_input:
                name = f"{node.name}/axes"
                graph.initializer.append(numpy_helper.from_array(np.where(consts[axes_input] < 0, consts[axes_input] + rank,
                                                                          consts[axes_input]), name))
                node.input[3] = name
    return True


def older(model: onnx.ModelProto, opset: int) -> onnx.ModelProto | None:
    """The opset-17 model written at an older opset as exporters wrote it there (onnx's converter has
    no adapters down for most ops): before 13 the axes of Squeeze / Unsqueeze / ReduceSum and Split's
    sizes are attributes, Softmax takes an explicit last axis, Resize an empty roi; before 11 Pad's pads
    and value and Clip's bounds, before 10 Slice's starts / ends / axes and TopK's k are attributes,
    Resize is (X, scales) at 10 and Upsample before. None where an op or
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
            if not _drop_newer_attributes(node, opset):
                return None
            if node.op_type in ATTRIBUTES_BEFORE:
                if not _attributes_from_inputs(node, opset, consts):
                    return None
            elif node.op_type == "Resize" and opset < 11:
                if not _resize_before_11(node, opset, consts):
                    return None
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
            elif node.op_type == "Resize" and len(node.input) > 1 and not node.input[1]:
                roi = f"{node.name}/roi"
                graph.initializer.append(numpy_helper.from_array(np.zeros(0, np.float32), roi))
                node.input[1] = roi
    if opset < 11 and not _axes_from_the_front(out, model):
        return None
    for entry in out.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = opset
    try:
        onnx.checker.check_model(out, full_check=True)
    except Exception:  # noqa: BLE001 - an op or attribute the opset lacks
        return None
    return out
