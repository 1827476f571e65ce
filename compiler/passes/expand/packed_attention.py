"""onnxruntime's Attention (packed QKV weights; transformers optimizer, BERT family) and its quantized
form QAttention (quantize_dynamic of that) into a GEMM and MultiHeadAttention.

    x ─► Attention(W[D, q+k+v], bias?, mask_index?, -, attention_bias?) ─► y
      ==>  x ─► MatMul(W) ─► [Add(bias)] ─► Split(q, k, v) ─► MultiHeadAttention(q, k, v, -, mask, bias) ─► y
    x_q ─► QAttention(W_q, bias, x_scale, W_scale, mask_index?, x_zero, W_zero?) ─► y
      ==>  MatMulInteger(x_q, W_q, x_zero, W_zero) ─► Cast ─► Mul(x_scale * W_scale) ─► Add(bias) ─► Split ─► ...
         (onnxruntime's QAttention scales its int32 sums the same way: acc * (x_scale * W_scale) + bias)
infc has no kernel for the packed op (it ran as an onnxruntime island, and --no-fallback refused it);
the projection then fuses into a tuned GEMM and attention runs on infc's kernel. onnxruntime reads a
1-D [batch] mask (key lengths) and a 2-D [batch, keys] mask (0 = masked, filled with
mask_filter_value) the same way in both ops (checked exactly against onnxruntime in the test); the
other mask forms (1-D [2*batch] or [3*batch+2], 3-D, 4-D), past state and rotary are left alone.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import CONTRIB_DOMAIN, const_value, opset_of
from ..engine import Match, Rule
from ..pattern import ms_op, var
from .embed_layernorm import is_read

# where each operand sits, per op (absent: the op has no such input)
_OPERANDS = {
    "Attention": {"bias": 2, "mask": 3, "past": 4, "attention_bias": 5, "past_length": 6},
    "QAttention": {"bias": 2, "x_scale": 3, "w_scale": 4, "mask": 5, "x_zero": 6, "w_zero": 7, "past": 8},
}
_EMBEDDINGS = ("EmbedLayerNormalization", "QEmbedLayerNormalization")
_MHA_ATTRS = ("num_heads", "mask_filter_value", "scale", "unidirectional")


def _operand(m: Match, name: str) -> gs.Tensor | None:
    inputs, index = m.root.inputs, _OPERANDS[m.root.op].get(name, len(m.root.inputs))
    return inputs[index] if index < len(inputs) and not inputs[index].is_empty() else None


def _sizes(m: Match) -> list[int] | None:
    sizes = m.root.attrs.get("qkv_hidden_sizes")
    if sizes:
        return [int(s) for s in sizes]
    weights = m["w"]
    width = weights.shape[-1] if weights.shape and isinstance(weights.shape[-1], int) else None
    return [width // 3] * 3 if width and width % 3 == 0 else None


def _is_key_lengths(m: Match, mask: gs.Tensor) -> bool:
    """A 1-D mask is [batch] key lengths (not [2 * batch] end and start positions) when provably so:
    EmbedLayerNormalization's mask index is (this pass runs before that op is expanded), and so is a
    declared [batch] (x's batch dim, the same number or symbol). The transformers optimizer's mask
    index for models without an embedding fusion (RoBERTa) is ReduceSum(raw mask [batch, keys],
    axis 1): one length per row of the model's own mask, whose shape inference often loses the symbol."""
    producer = mask.inputs[0] if mask.inputs else None
    if producer is not None and producer.op in _EMBEDDINGS and producer.domain == CONTRIB_DOMAIN:
        return len(producer.outputs) > 1 and producer.outputs[1] is mask
    if producer is not None and producer.op == "ReduceSum" and _sums_rows(producer):
        return True
    batch = m["x"].shape[0] if m["x"].shape else None
    return mask.shape is not None and len(mask.shape) == 1 and batch is not None and mask.shape[0] == batch


def _sums_rows(reduce: gs.Node) -> bool:
    """ReduceSum(2-D, axes=[1] or [-1], keepdims=0)."""
    data = reduce.inputs[0]
    axes = reduce.attrs.get("axes") if len(reduce.inputs) < 2 else const_value(reduce.inputs[1])
    return (data.shape is not None and len(data.shape) == 2 and axes is not None and np.size(axes) == 1
            and int(np.reshape(axes, -1)[0]) in (1, -1) and reduce.attrs.get("keepdims", 1) == 0)


def _check(m: Match) -> str | None:
    attrs = m.root.attrs
    if attrs.get("do_rotary", 0) or attrs.get("past_present_share_buffer", 0):
        return "rotary or a shared past/present buffer"
    if _operand(m, "past") is not None or _operand(m, "past_length") is not None or (
            len(m.outputs) > 1 and not m.outputs[1].is_empty() and is_read(m, m.outputs[1])):
        return "past / present state"
    sizes = _sizes(m)
    if sizes is None or len(sizes) != 3 or sizes[0] != sizes[1]:
        return "Q, K, V widths are not provable (or Q and K differ)"
    if any(s % attrs["num_heads"] for s in sizes):
        return "a Q, K or V width is not a multiple of num_heads"
    if m.root.op == "QAttention":
        if _operand(m, "x_scale") is None or _operand(m, "w_scale") is None or _operand(m, "bias") is None:
            return "a scale or the bias is missing"
    elif m["x"].dtype is not None and np.dtype(m["x"].dtype) not in (np.dtype(np.float32), np.dtype(np.float16)):
        return "input is not float32 or float16"
    mask = _operand(m, "mask")
    if mask is not None:
        rank = len(mask.shape) if mask.shape is not None else None
        if rank == 2:
            return None
        if not _is_key_lengths(m, mask):
            return "mask_index is not provably [batch] key lengths or a [batch, keys] mask"
    return None


def _rewrite(m: Match):
    x, names, sizes = m["x"], m.fresh, _sizes(m)
    if m.root.op == "QAttention":
        dtype = np.float32
        nodes, qkv = _dequantized_projection(m)
    else:
        dtype = x.dtype
        qkv = gs.Variable(names("qkv"), dtype=dtype)
        nodes = [gs.Node("MatMul", inputs=[x, m["w"]], outputs=[qkv])]
    if _operand(m, "bias") is not None:
        biased = gs.Variable(names("qkv"), dtype=dtype)
        nodes.append(gs.Node("Add", inputs=[qkv, _operand(m, "bias")], outputs=[biased]))
        qkv = biased
    q, k, v = (gs.Variable(names(part), dtype=dtype) for part in ("q", "k", "v"))
    split = np.array(sizes, np.int64)
    if opset_of(m.graph) >= 13:
        nodes.append(gs.Node("Split", inputs=[qkv, m.constant("qkv_sizes", split)], outputs=[q, k, v], attrs={"axis": -1}))
    else:
        nodes.append(gs.Node("Split", inputs=[qkv], outputs=[q, k, v], attrs={"axis": -1, "split": sizes}))
    empty = gs.Variable.empty
    mask, attention_bias = _operand(m, "mask") or empty(), _operand(m, "attention_bias") or empty()
    attrs = {k: m.root.attrs[k] for k in _MHA_ATTRS if k in m.root.attrs}
    nodes.append(gs.Node("MultiHeadAttention", domain=CONTRIB_DOMAIN, inputs=[q, k, v, empty(), mask, attention_bias],
                         outputs=[m.outputs[0]], attrs=attrs))
    return nodes


def _dequantized_projection(m: Match):
    names = m.fresh
    acc, wide, scale, qkv = (gs.Variable(names(h), dtype=d) for h, d in (
        ("qkv_int", np.int32), ("qkv_float", np.float32), ("qkv_scale", np.float32), ("qkv", np.float32)))
    zeros = [_operand(m, "x_zero") or gs.Variable.empty()] + ([_operand(m, "w_zero")] if _operand(m, "w_zero") else [])
    return [gs.Node("MatMulInteger", inputs=[m["x"], m["w"], *zeros], outputs=[acc]),
            gs.Node("Cast", inputs=[acc], outputs=[wide], attrs={"to": 1}),  # onnx TensorProto.FLOAT
            gs.Node("Mul", inputs=[_operand(m, "x_scale"), _operand(m, "w_scale")], outputs=[scale]),
            gs.Node("Mul", inputs=[wide, scale], outputs=[qkv])], qkv


RULES = tuple(Rule("expand_packed_attention", pattern(var("x"), var("w"), allow_extra_inputs=True), _rewrite, _check)
              for pattern in (ms_op.Attention, ms_op.QAttention))
