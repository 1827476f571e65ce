"""Standard QuantizeLinear / DequantizeLinear ONNX for Conv, MatMul and Gemm with constant weights.

    x ─► Q ─► DQ ─┐
    W_int8 ─► DQ(axis) ─► Conv | MatMul | Gemm ─► Q ─► DQ ─► (every consumer)
    B_int32 ─► DQ ─┘                                   scale_B = scale_x * scale_W[c]

Weights: int8, symmetric, one scale per output channel. Activations: one scale per tensor, uint8
asymmetric by default (onnxruntime's U8S8, its CPU default; a ReLU-like range uses all 256 levels)
or int8 symmetric. onnxruntime's CPU provider turns each DQ -> op -> Q unit into QLinearConv /
QLinearMatMul / QGemm; every consumer of a quantized value reads the DQ output, as its fusions need.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

# op -> which weight axis holds the output channels (Gemm: by transB)
WEIGHT_AXIS = {"Conv": lambda attrs: 0, "MatMul": lambda attrs: 1, "Gemm": lambda attrs: 0 if attrs.get("transB", 0) else 1}
ACTIVATION_TYPES = {"uint8": np.uint8, "int8": np.int8}
INT32_LIMIT = 2 ** 31 - 1


@dataclass
class Target:
    node: onnx.NodeProto
    axis: int  # output-channel axis of the weight (input 1)
    has_bias: bool  # input 2 is a constant 1-D float of the output channel count


def select_targets(model: onnx.ModelProto, constants: dict[str, np.ndarray]) -> tuple[list[Target], Counter]:
    targets, skipped = [], Counter()
    for node in model.graph.node:
        if node.op_type not in WEIGHT_AXIS or node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight = constants.get(node.input[1]) if len(node.input) > 1 else None
        reason = None
        if node.input[0] in constants:
            reason = "the first input is a constant"
        elif weight is None:
            reason = "the weight is not a constant"
        elif node.op_type != "Conv" and weight.ndim != 2:
            reason = "weight is not 2-D"
        elif node.op_type == "Gemm" and (attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0):
            reason = "Gemm with transA, alpha or beta"
        if reason:
            skipped[f"{node.op_type}: {reason}"] += 1
            continue
        axis = WEIGHT_AXIS[node.op_type](attrs)
        bias = constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        targets.append(Target(node, axis, bias is not None and bias.shape == (weight.shape[axis],)))
    return targets, skipped


def weight_per_channel(w: np.ndarray, axis: int, limit: int = 127) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 in [-limit, limit] with one scale per slice along `axis` (weight_range.py)."""
    moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    scale = np.abs(moved).max(axis=1) / float(limit)
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    return np.clip(np.round(w / scale.reshape(shape)), -limit, limit).astype(np.int8), scale


def activation_params(lo: float, hi: float, activation_type: str) -> tuple[np.ndarray, np.ndarray]:
    """(scale, zero point) of one tensor; the range always holds 0 so that zero is exact."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if activation_type == "int8":
        scale = _float32_scale(max(-lo, hi) / 127.0)
        return np.array(scale, np.float32), np.array(0, np.int8)
    scale = _float32_scale((hi - lo) / 255.0)
    return np.array(scale, np.float32), np.array(np.clip(round(-lo / float(scale)), 0, 255), np.uint8)


def _float32_scale(scale: float) -> np.float32:
    """The scale as stored; 1 where that is 0 or subnormal (a range of (sub)denormal values, as an
    all-zero activation gives): QuantizeLinear divides by it."""
    stored = np.float32(scale)
    return stored if stored >= np.finfo(np.float32).tiny else np.float32(1.0)


def activation_names(model: onnx.ModelProto, targets: list[Target]) -> list[str]:
    """Each target's input, and its output unless that is a graph output (names must stay)."""
    outputs = {o.name for o in model.graph.output}
    names = [t.node.input[0] for t in targets] + [t.node.output[0] for t in targets if t.node.output[0] not in outputs]
    return list(dict.fromkeys(names))


def write_qdq(model: onnx.ModelProto, targets: list[Target], constants: dict, act_params: dict,
              weight_limit: int = 127, removed: frozenset | set = frozenset()) -> onnx.ModelProto:
    """`removed`: ids of nodes that leave the graph (clamps their op's output quantization does, clamp_fold.py)."""
    graph, new_nodes, inits = model.graph, [], []
    by_node = {id(t.node): t for t in targets}
    dq_of = {name: f"{name}/dq" for name in act_params}

    quantizers = set()

    def qdq(name):
        scale, zero = act_params[name]
        inits.extend([numpy_helper.from_array(scale, f"{name}/scale"), numpy_helper.from_array(zero, f"{name}/zero")])
        quantize = helper.make_node("QuantizeLinear", [name, f"{name}/scale", f"{name}/zero"], [f"{name}/q"], name=f"{name}/Q")
        quantizers.add(id(quantize))
        return [quantize, helper.make_node("DequantizeLinear", [f"{name}/q", f"{name}/scale", f"{name}/zero"], [dq_of[name]],
                                           name=f"{name}/DQ")]

    for value in graph.input:
        if value.name in act_params:
            new_nodes += qdq(value.name)
    weights_done: dict[tuple, tuple[str, np.ndarray]] = {}
    for node in graph.node:
        if id(node) in removed:
            continue
        target = by_node.get(id(node))
        if target is not None:
            key = (node.input[1], target.axis)
            if key not in weights_done:
                q, scale = weight_per_channel(constants[node.input[1]], target.axis, weight_limit)
                name = f"{node.input[1]}/int8_{target.axis}"
                inits += [numpy_helper.from_array(q, name), numpy_helper.from_array(scale, f"{name}/scale"),
                          numpy_helper.from_array(np.zeros_like(scale, np.int8), f"{name}/zero")]
                new_nodes.append(helper.make_node("DequantizeLinear", [name, f"{name}/scale", f"{name}/zero"], [f"{name}/dq"],
                                                  name=f"{name}/DQ", axis=target.axis))
                weights_done[key] = (f"{name}/dq", scale)
            node.input[1], weight_scale = weights_done[key]
            if target.has_bias and node.input[0] in act_params:
                node.input[2] = _bias_int32(node, constants, act_params[node.input[0]][0] * weight_scale, inits, new_nodes)
        new_nodes.append(node)
        new_nodes += [n for o in node.output if o in act_params for n in qdq(o)]
    for node in new_nodes:
        if id(node) not in quantizers:
            node.input[:] = [dq_of.get(i, i) for i in node.input]
    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(inits)
    return model


def _bias_int32(node, constants, scale: np.ndarray, inits: list, new_nodes: list) -> str:
    bias = constants[node.input[2]]
    scale = scale.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.round(bias / scale)
    if not np.all(np.isfinite(q)) or np.abs(q).max(initial=0) > INT32_LIMIT:
        return node.input[2]  # keep the float bias; the op still runs from the dequantized weight
    name = f"{node.name}/bias_int32"
    inits += [numpy_helper.from_array(q.astype(np.int32), name), numpy_helper.from_array(scale, f"{name}/scale"),
              numpy_helper.from_array(np.zeros(scale.shape, np.int32), f"{name}/zero")]
    new_nodes.append(helper.make_node("DequantizeLinear", [name, f"{name}/scale", f"{name}/zero"], [f"{name}/dq"],
                                      name=f"{name}/DQ", axis=0))
    return f"{name}/dq"
