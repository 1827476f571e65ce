"""The float64 reference: the model with its float32 values in float64, ops onnxruntime has no float64
kernel for run in float32 between Casts. A finding is an error well past what onnxruntime's own
float32 run makes against it."""

from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graph import F32
from .variants import scales_of


def as_double(model: onnx.ModelProto) -> onnx.ModelProto:
    # a model in float16 throughout is widened whole; in a float32 model a Cast to float16 is a
    # rounding the model means, kept
    """The model in float64: onnxruntime's float32 reference carries its own rounding (1 + tanh(-5)
    is 0 in float32), so a finding is an error well past what onnxruntime's float32 run makes."""
    double = onnx.ModelProto()
    double.CopyFrom(model)
    graph = double.graph
    widened = (TensorProto.FLOAT, TensorProto.FLOAT16) if _is_float16_model(model) else (TensorProto.FLOAT,)
    _value_types_to_double(graph, widened)
    float_only = {scales_of(n) for n in graph.node} - {None}  # Resize / Upsample scales stay float32
    for index, tensor in enumerate(graph.initializer):
        if tensor.data_type in widened and tensor.name not in float_only:
            graph.initializer[index].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64),
                                                                      tensor.name))
    _decompose_instance_norms(double)
    return double


def _is_float16_model(model: onnx.ModelProto) -> bool:
    return model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16


def _value_types_to_double(graph: onnx.GraphProto, widened: tuple) -> None:
    """Declared float values and Casts to them as float64, in subgraphs too."""
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.tensor_type.elem_type in widened:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i in widened:
                attr.i = TensorProto.DOUBLE
            if attr.type == onnx.AttributeProto.GRAPH:
                _value_types_to_double(attr.g, widened)


def _decompose_instance_norms(model: onnx.ModelProto) -> None:
    """InstanceNormalization as float64 primitives: onnxruntime has no float64 kernel for it, and its
    float32 one is far off on constant rows of large values (1e8 normalized to 0, not to the bias)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in [*inferred.graph.input, *inferred.graph.value_info]}
    nodes = []
    for node in model.graph.node:
        if node.op_type != "InstanceNormalization" or ranks.get(node.input[0], 0) < 3:  # rank unknown: left whole
            nodes.append(node)
            continue
        x, scale, bias = node.input
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        rank, stem = ranks[x], node.output[0]
        axes = list(range(2, rank))
        channel = numpy_helper.from_array(np.array([-1] + [1] * (rank - 2), np.int64), f"{stem}/channel")
        epsilon = numpy_helper.from_array(np.array(eps, np.float64), f"{stem}/eps")
        model.graph.initializer.extend([channel, epsilon])
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        if opset >= 18:  # axes an input
            model.graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), f"{stem}/axes"))

        def reduce_mean(x_in, out):
            if opset >= 18:
                return helper.make_node("ReduceMean", [x_in, f"{stem}/axes"], [out])
            return helper.make_node("ReduceMean", [x_in], [out], axes=axes)

        nodes += [reduce_mean(x, f"{stem}/mean"),
                  helper.make_node("Sub", [x, f"{stem}/mean"], [f"{stem}/centered"]),
                  helper.make_node("Mul", [f"{stem}/centered", f"{stem}/centered"], [f"{stem}/square"]),
                  reduce_mean(f"{stem}/square", f"{stem}/var"),
                  helper.make_node("Add", [f"{stem}/var", epsilon.name], [f"{stem}/var_eps"]),
                  helper.make_node("Sqrt", [f"{stem}/var_eps"], [f"{stem}/std"]),
                  helper.make_node("Div", [f"{stem}/centered", f"{stem}/std"], [f"{stem}/normed"]),
                  helper.make_node("Reshape", [scale, channel.name], [f"{stem}/scale"]),
                  helper.make_node("Reshape", [bias, channel.name], [f"{stem}/bias"]),
                  helper.make_node("Mul", [f"{stem}/normed", f"{stem}/scale"], [f"{stem}/scaled"]),
                  helper.make_node("Add", [f"{stem}/scaled", f"{stem}/bias"], list(node.output))]
        for index, made in enumerate(nodes[-11:]):
            made.name = f"{stem}/decomposed_{index}"
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def run_double(model: onnx.ModelProto, feeds_by_level: dict) -> tuple[dict | None, int]:
    """as_double's outputs at each level, and how many ops ran in float32: an op onnxruntime has no
    float64 kernel for (Conv, Erf, InstanceNormalization, ...) computes in float32 between casts, the
    rest in float64. Its own rounding then stays in the reference (onnxruntime's InstanceNormalization
    over one element is not exactly its bias)."""
    from infc.compiler.verify import ort_session

    double = as_double(model)
    names = [o.name for o in model.graph.output]
    for in_float32 in range(64):
        try:
            session = ort_session(double)
            return {level: session.run(names, {k: v.astype(np.float64) if v.dtype in (F32, np.float16) else v for k, v in feeds.items()})
                    for level, feeds in feeds_by_level.items()}, in_float32
        except Exception as exc:  # noqa: BLE001 - onnxruntime names the node it has no kernel for
            found = re.search(r"Could not find an implementation for (\w+)\(\d+\) node with name '([^']*)'", str(exc)) \
                or re.search(r"Type 'tensor\(double\)' of \w+ parameter \(\S+\) of operator \((\w+)\) in node \(([^)]*)\)",
                             str(exc))  # the op's type constraints leave out float64 (QuantizeLinear, Range)
            if not found:
                return None, 0
            op, name = found.groups()
            # a node onnxruntime made expanding a function op has no name: the ops it comes from
            nodes = [name] if name else [n.name for n in double.graph.node if n.op_type in (op, *EXPANDED_FROM.get(op, ()))]
            for each in nodes:
                _in_float32(double, each)
    return None, 0


EXPANDED_FROM = {"HardSigmoid": ("HardSwish",)}  # onnxruntime runs HardSwish as its function body


def _in_float32(model: onnx.ModelProto, node_name: str) -> None:
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.input, *inferred.graph.value_info,
                                                            *inferred.graph.output]}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    nodes = []
    for node in model.graph.node:
        if node.name != node_name:
            nodes.append(node)
            continue
        original = list(node.input)
        for index, name in enumerate(original):
            if types.get(name) == TensorProto.DOUBLE:
                if name not in original[:index]:  # Mean(a, a, a) casts a once
                    nodes.append(helper.make_node("Cast", [name], [f"{name}/f32/{node_name}"], to=TensorProto.FLOAT))
                node.input[index] = f"{name}/f32/{node_name}"
        # its float outputs back to float64; integer ones (QuantizeLinear's) as they are
        outputs = [o for o in node.output if types.get(o, TensorProto.DOUBLE) in (TensorProto.DOUBLE, TensorProto.FLOAT)]
        node.output[:] = [f"{o}/f32" if o in outputs else o for o in node.output]
        nodes.append(node)
        nodes += [helper.make_node("Cast", [f"{o}/f32"], [o], to=TensorProto.DOUBLE) for o in outputs]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
