"""Does onnxruntime's CPU provider have a native kernel for this node with these input types?
Asked of onnxruntime itself: a one-node model with the node's attributes and the proposed input
types must create a session, and the graph onnxruntime finally runs must hold no Cast it inserted.
(Where the CPU provider lacks an fp16 kernel, which on x86 is nearly everywhere, onnxruntime quietly
wraps the node in Casts to fp32 and merges neighbouring islands, so an fp16 overflow never shows.)
Any failure counts as "no": the node then computes in fp32 between explicit Casts, so a wrong
answer can only cost speed, never a model that does not run or numerics that are not fp16's."""

from __future__ import annotations

import os
import tempfile

import onnx
from onnx import helper

from ..ort_env import require_onnxruntime

_CACHE: dict[bytes, bool] = {}


def _dims(shape):
    return None if shape is None else [d if isinstance(d, (int, str)) else None for d in shape]


def has_cpu_kernel(node: onnx.NodeProto, input_types: list, model_opsets: dict[str, int], ir_version: int) -> bool:
    """`input_types`: per input, (elem_type, shape or None), or None for an absent optional input."""
    probe = onnx.NodeProto()
    probe.CopyFrom(node)
    probe.name = "probe"
    del probe.input[:]
    del probe.output[:]
    inputs = []
    for index, entry in enumerate(input_types):
        if entry is None:
            probe.input.append("")
            continue
        name = f"in{index}"
        probe.input.append(name)
        inputs.append(helper.make_tensor_value_info(name, entry[0], _dims(entry[1])))
    probe.output.extend(f"out{i}" if name else "" for i, name in enumerate(node.output))
    key = probe.SerializeToString() + repr([(i.type.tensor_type.elem_type, str(i.type.tensor_type.shape)) for i in inputs]).encode()
    if key in _CACHE:
        return _CACHE[key]
    graph = helper.make_graph([probe], "probe", inputs, [onnx.ValueInfoProto(name=o) for o in probe.output if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in model_opsets.items()],
                              ir_version=ir_version)
    ort = require_onnxruntime()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    with tempfile.TemporaryDirectory() as folder:
        options.optimized_model_filepath = os.path.join(folder, "resolved.onnx")
        try:
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            resolved = onnx.load(options.optimized_model_filepath)
            _CACHE[key] = [n.op_type for n in resolved.graph.node] == [node.op_type]
        except Exception:  # noqa: BLE001 - any reason means the node cannot run as proposed
            _CACHE[key] = False
    return _CACHE[key]
