"""Dynamically quantized decoders (onnxruntime's quantize_dynamic: transformers.js' model_quantized.onnx)
served batch-invariant: each GEMM's activations quantized per row, at integer speed.

    x ─► DynamicQuantizeLinear ─► x_q, x_scale, x_zero
    MatMulInteger(x_q, W_q, x_zero, W_zero) ─► Cast(float) ─► Mul(·, Mul(x_scale, W_scale)) ─► y
    ==>  MatMul(x, (W_q - W_zero) * W_scale) ─► y          (W's codes kept: decoder/weight_codes.py,
                                                             each row of x quantized on its own)
    com.microsoft.DynamicQuantizeMatMul(x, W_q, W_scale, W_zero[, bias])  ==>  the same (+ bias)

DynamicQuantizeLinear picks one scale for all of x: over a step's whole batch of tokens, so a
token's logits would depend on the tokens beside it (and on how a prompt is chunked). The fold
writes a float32 MatMul by the exactly dequantized weight and keeps the codes, marked as codes whose
activations the model quantizes (WeightCodes.row_quantized): the plan's GEMM step then quantizes
each row of x as DynamicQuantizeLinear would quantize that row alone and multiplies exact integers
(runtime/row_quantized_gemm.py), onnxruntime's int8 kernels doing the sums. The dequantized weight
is what a device plan computes with (its GEMMs stay float32). A
DynamicQuantizeLinear that something else reads is refused with the reason.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import BadInput
from ..graph import NameGen
from .genai_export import MS, _constant, _input
from .sites import NOT_RECOGNIZED
from .weight_codes import WeightCodes


def has_dynamic_quantization(model: onnx.ModelProto) -> bool:
    return any(n.op_type == "DynamicQuantizeLinear" or (n.domain == MS and n.op_type == "DynamicQuantizeMatMul")
               for n in model.graph.node)


def fold_dynamic_quantization(model: onnx.ModelProto, codes: dict) -> onnx.ModelProto:
    """A copy with each dynamically quantized MatMul on a constant weight made a float32 MatMul by
    the dequantized weight; `codes` receives each such weight's name -> its WeightCodes."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    weights = {t.name: t for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    names = NameGen.of_onnx(graph)
    replaced, dropped, added = {}, set(), []  # id(node) -> its replacement; nodes folded away
    for node in graph.node:
        if node.op_type == "MatMulInteger":
            fold = _matmul_integer(node, weights, producers, consumers)
            if fold is None:
                continue
            x, w_codes, w_scale, w_zero, tail, y = fold
            bias = None
        elif node.domain == MS and node.op_type == "DynamicQuantizeMatMul":
            x, w_codes, w_scale, w_zero = node.input[0], _value(node, 1, weights, producers), \
                _value(node, 2, weights, producers), _value(node, 3, weights, producers)
            if w_codes is None or w_scale is None or (_input(node, 3) and w_zero is None):
                continue
            tail, y, bias = [], node.output[0], _input(node, 4) or None
        else:
            continue
        parts = _codes(w_codes, w_scale, w_zero)
        if parts is None:
            continue
        weight = names(f"{node.input[1]}_dequantized")
        added.append(numpy_helper.from_array(parts.dequantized(), weight))
        codes[weight] = parts
        product = names(f"{node.name}_float") if bias else y
        nodes = [helper.make_node("MatMul", [x, weight], [product], name=names(node.name or "matmul"))]
        if bias:
            nodes.append(helper.make_node("Add", [product, bias], [y], name=names(f"{node.name}_bias")))
        replaced[id(node)] = nodes
        dropped.update(id(n) for n in tail)
    nodes = []
    for node in graph.node:
        if id(node) in replaced:
            nodes += replaced[id(node)]
        elif id(node) not in dropped:
            nodes.append(node)
    _drop_dead(nodes, {o.name for o in graph.output})
    left = next((n for n in nodes if n.op_type == "DynamicQuantizeLinear"), None)
    if left is not None:
        reader = next((c for c in nodes if set(c.input) & set(left.output)), left)
        raise BadInput(f"{NOT_RECOGNIZED}: DynamicQuantizeLinear '{left.name}' is read by '{reader.name}' ({reader.op_type}), "
                       "not a MatMulInteger on a constant weight: one activation scale over a whole step's tokens would "
                       "make each token's logits depend on the batch")
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for n in nodes for i in n.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept + added)
    return out


def _value(node, index: int, weights, producers) -> np.ndarray | None:
    name = _input(node, index)
    return _constant(name, weights, producers) if name else None


def _matmul_integer(node, weights, producers, consumers):
    """(x, W codes, W scale, W zero, the nodes folded away, y) when `node` is the pattern above."""
    quantize = producers.get(node.input[0])
    if quantize is None or quantize.op_type != "DynamicQuantizeLinear" or _input(node, 2) not in ("", quantize.output[2]):
        return None
    w_codes, w_zero = _value(node, 1, weights, producers), _value(node, 3, weights, producers)
    if w_codes is None or (_input(node, 3) and w_zero is None):
        return None
    cast = _only_reader(node.output[0], consumers)
    if cast is None or cast.op_type != "Cast" or helper.get_attribute_value(cast.attribute[0]) != TensorProto.FLOAT:
        return None
    mul = _only_reader(cast.output[0], consumers)
    if mul is None or mul.op_type != "Mul":
        return None
    scales = producers.get(next((i for i in mul.input if i != cast.output[0]), ""))
    if scales is None or scales.op_type != "Mul" or quantize.output[1] not in scales.input:
        return None
    w_scale = _value(scales, 1 - list(scales.input).index(quantize.output[1]), weights, producers)
    if w_scale is None:
        return None
    return quantize.input[0], w_codes, w_scale, w_zero, [cast, mul], mul.output[0]


def _only_reader(name: str, consumers: dict):
    readers = consumers.get(name, [])
    return readers[0] if len(readers) == 1 else None


def _codes(w_codes: np.ndarray, w_scale: np.ndarray, w_zero: np.ndarray | None) -> WeightCodes | None:
    """W [K, N] 8-bit codes with a scale and zero point per tensor or per column (N): one block of K."""
    if w_codes.ndim != 2 or w_codes.dtype not in (np.int8, np.uint8):
        return None
    k, n = w_codes.shape
    zero = np.zeros((), w_codes.dtype) if w_zero is None else w_zero
    if w_scale.size not in (1, n) or zero.size not in (1, n) or zero.dtype != w_codes.dtype:
        return None
    scale = np.broadcast_to(w_scale.astype(np.float32).reshape(1, -1), (1, n))
    zero = np.broadcast_to(zero.reshape(1, -1), (1, n))
    return WeightCodes(np.ascontiguousarray(w_codes), np.ascontiguousarray(scale), np.ascontiguousarray(zero), k,
                       row_quantized=True)


def _drop_dead(nodes: list, outputs: set[str]) -> None:
    """Removes, in place, nodes none of whose outputs is read (the quantizers and scale products
    the folded GEMMs no longer use)."""
    while True:
        read = {i for n in nodes for i in n.input} | outputs | _subgraph_reads(nodes)
        dead = [i for i, n in enumerate(nodes) if not any(o in read for o in n.output if o)]
        if not dead:
            return
        for i in reversed(dead):
            del nodes[i]


def _subgraph_reads(nodes: list) -> set[str]:
    reads = set()
    for node in nodes:
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs):
                reads |= {i for n in sub.node for i in n.input} | _subgraph_reads(list(sub.node))
    return reads
