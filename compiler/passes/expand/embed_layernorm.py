"""onnxruntime's EmbedLayerNormalization (transformers optimizer, BERT family) and its quantized form
(QEmbedLayerNormalization, from quantize_dynamic: uint8 tables and norm parameters) into their parts.

    ids ─► EmbedLayerNormalization(segment_ids?, word, position, segment?, gamma, beta, mask?, position_ids?)
                ─► output, mask_index?, embedding_sum?
      ==>  Gather(word, ids) + (Gather(position, position_ids) | position[:S]) [+ Gather(segment, segment_ids)]
                ─► LayerNormalization(gamma, beta) ─► output       (the sum is embedding_sum)
           mask ─► Equal(1) ─► Cast(int32) ─► ReduceSum(axis 1) ─► mask_index   (onnxruntime counts ones)
infc has no kernel for the fused op (it ran as an onnxruntime island, and --no-fallback refused it);
its parts have kernels, and the mask index is the 1-D [batch] key-length form Attention and
MultiHeadAttention read. Attention expansion (packed_attention.py) relies on that shape. The quantized
form's tables become DequantizeLinear of constants, which constant folding turns into float tables
((code - zero point) * scale, as onnxruntime dequantizes them).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import opset_of
from ..engine import Match, Rule
from ..pattern import ms_op, var

_WORD, _POSITION, _SEGMENT, _GAMMA, _BETA, _MASK, _POSITION_IDS = range(2, 9)
_QUANTIZED_SCALES, _QUANTIZED_ZERO_POINTS = 8, 13  # QEmbedLayerNormalization: per table, in table order


def _present(inputs, index: int) -> gs.Tensor | None:
    return inputs[index] if index < len(inputs) and not inputs[index].is_empty() else None


def _input(m: Match, index: int) -> gs.Tensor | None:
    if m.root.op == "QEmbedLayerNormalization" and index == _POSITION_IDS:
        return None  # its input 8 is the first scale
    return _present(m.root.inputs, index)


def is_read(m: Match, tensor: gs.Tensor) -> bool:
    return bool(tensor.outputs) or tensor in m.graph.outputs


def _output(m: Match, index: int) -> gs.Tensor | None:
    outputs = m.outputs
    return outputs[index] if index < len(outputs) and not outputs[index].is_empty() and is_read(m, outputs[index]) else None


def _check(m: Match) -> str | None:
    if any(_input(m, i) is None for i in (_WORD, _POSITION, _GAMMA, _BETA)):
        return "a required embedding or norm parameter is missing"
    if (_input(m, 1) is None) != (_input(m, _SEGMENT) is None):
        return "segment ids without a segment table (or the reverse)"
    if _output(m, 1) is not None:
        if _input(m, _MASK) is None:
            return "mask_index is read but no mask is given"
        if m.root.attrs.get("mask_index_type", 1) != 1:
            return "mask_index_type is not 1 (key lengths)"
    return None


def _check_quantized(m: Match) -> str | None:
    for table in range(_WORD, _BETA + 1):
        if _input(m, table) is not None and _present(m.root.inputs, _QUANTIZED_SCALES + table - _WORD) is None:
            return "a quantized table has no scale"
    return _check(m)


def _tables(m: Match, nodes: list) -> dict[int, gs.Tensor]:
    """Input index -> float table: the inputs themselves, or the quantized form's dequantized codes."""
    tables = {i: _input(m, i) for i in range(_WORD, _BETA + 1) if _input(m, i) is not None}
    if m.root.op != "QEmbedLayerNormalization":
        return tables
    for index, codes in list(tables.items()):
        scale = m.root.inputs[_QUANTIZED_SCALES + index - _WORD]
        zero_point = _present(m.root.inputs, _QUANTIZED_ZERO_POINTS + index - _WORD)
        tables[index] = gs.Variable(m.fresh("dequantized"), dtype=np.float32)
        nodes.append(gs.Node("DequantizeLinear", inputs=[codes, scale] + ([zero_point] if zero_point is not None else []),
                             outputs=[tables[index]]))
    return tables


def _rewrite(m: Match):
    ids, names, opset = m["ids"], m.fresh, opset_of(m.graph)
    nodes = []
    tables = _tables(m, nodes)

    def add(op, inputs, hint, attrs=None, dtype=None, shape=None, outputs=None):
        out = outputs or [gs.Variable(names(hint), dtype=dtype, shape=shape)]
        nodes.append(gs.Node(op, inputs=inputs, outputs=out, attrs=attrs or {}))
        return out[0]

    word = tables[_WORD]
    total = add("Gather", [word, ids], "word", dtype=word.dtype)
    position_ids = _input(m, _POSITION_IDS)
    if position_ids is not None:
        position = add("Gather", [tables[_POSITION], position_ids], "position", dtype=word.dtype)
    else:  # positions 0..S-1: the table's first S rows, broadcast over the batch
        shape = add("Shape", [ids], "ids_shape", dtype=np.int64)
        length = add("Gather", [shape, m.constant("seq_axis", np.array([1], np.int64))], "seq_len", dtype=np.int64)
        position = add("Slice", [tables[_POSITION], m.constant("zero", np.array([0], np.int64)), length,
                                 m.constant("row_axis", np.array([0], np.int64))], "position", dtype=word.dtype)
    total = add("Add", [total, position], "embed", dtype=word.dtype)
    if _input(m, _SEGMENT) is not None:
        segment = add("Gather", [tables[_SEGMENT], _input(m, 1)], "segment", dtype=word.dtype)
        total = add("Add", [total, segment], "embed", dtype=word.dtype, outputs=[_output(m, 2)] if _output(m, 2) else None)
    elif _output(m, 2) is not None:
        total = add("Identity", [total], "embed", outputs=[_output(m, 2)])
    add("LayerNormalization", [total, tables[_GAMMA], tables[_BETA]], "norm",
        attrs={"axis": -1, "epsilon": float(m.root.attrs.get("epsilon", 1e-12))}, outputs=[m.outputs[0]])
    mask_index = _output(m, 1)
    if mask_index is not None:
        ones = add("Equal", [_input(m, _MASK), m.constant("one", np.array(1, np.int32))], "mask_ones", dtype=bool)
        ones = add("Cast", [ones], "mask_ones", attrs={"to": 6}, dtype=np.int32)  # onnx TensorProto.INT32
        axes = m.constant("seq_axis", np.array([1], np.int64))
        reduce_args = ({"keepdims": 0}, [ones, axes]) if opset >= 13 else ({"keepdims": 0, "axes": [1]}, [ones])
        mask_index.dtype = np.int32
        if ids.shape is not None and mask_index.shape is None:
            mask_index.shape = [ids.shape[0]]
        add("ReduceSum", reduce_args[1], "mask_index", attrs=reduce_args[0], outputs=[mask_index])
    return nodes


RULES = (Rule("expand_embed_layernorm", ms_op.EmbedLayerNormalization(var("ids"), allow_extra_inputs=True), _rewrite, _check),
         Rule("expand_embed_layernorm", ms_op.QEmbedLayerNormalization(var("ids"), allow_extra_inputs=True), _rewrite,
              _check_quantized))
