"""onnxruntime's Attention (packed QKV weights; transformers optimizer, BERT family) into a GEMM and
MultiHeadAttention.

    x ─► Attention(W[D, q+k+v], bias?, mask_index?, -, attention_bias?) ─► y
      ==>  x ─► MatMul(W) ─► [Add(bias)] ─► Split(q, k, v) ─► MultiHeadAttention(q, k, v, -, mask, bias) ─► y
infc has no kernel for the packed op (it ran as an onnxruntime island, and --no-fallback refused it);
the projection then fuses into a tuned GEMM and attention runs on infc's kernel. onnxruntime reads a
1-D [batch] mask (key lengths) and a 2-D [batch, keys] mask (0 = masked, filled with
mask_filter_value) the same way in both ops (checked exactly against onnxruntime in the test); the
other mask forms (1-D [2*batch] or [3*batch+2], 3-D, 4-D), past state and rotary are left alone.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import CONTRIB_DOMAIN, opset_of
from ..engine import Match, Rule
from ..pattern import ms_op, var
from .embed_layernorm import is_read

_BIAS, _MASK, _PAST, _ATTENTION_BIAS, _PAST_LENGTH = range(2, 7)
_MHA_ATTRS = ("num_heads", "mask_filter_value", "scale", "unidirectional")


def _input(m: Match, index: int) -> gs.Tensor | None:
    inputs = m.root.inputs
    return inputs[index] if index < len(inputs) and not inputs[index].is_empty() else None


def _sizes(m: Match) -> list[int] | None:
    sizes = m.root.attrs.get("qkv_hidden_sizes")
    if sizes:
        return [int(s) for s in sizes]
    weights = m["w"]
    width = weights.shape[-1] if weights.shape and isinstance(weights.shape[-1], int) else None
    return [width // 3] * 3 if width and width % 3 == 0 else None


def _is_key_lengths(m: Match, mask: gs.Tensor) -> bool:
    """A 1-D mask is [batch] key lengths only when provably so: EmbedLayerNormalization's mask_index
    is (this pass runs before that op is expanded), and a declared [batch] (x's batch dim, the same
    number or symbol) is."""
    producer = mask.inputs[0] if mask.inputs else None
    if producer is not None and producer.op == "EmbedLayerNormalization" and producer.domain == CONTRIB_DOMAIN:
        return len(producer.outputs) > 1 and producer.outputs[1] is mask
    batch = m["x"].shape[0] if m["x"].shape else None
    return mask.shape is not None and len(mask.shape) == 1 and batch is not None and mask.shape[0] == batch


def _check(m: Match) -> str | None:
    attrs = m.root.attrs
    if attrs.get("do_rotary", 0) or attrs.get("past_present_share_buffer", 0):
        return "rotary or a shared past/present buffer"
    if _input(m, _PAST) is not None or _input(m, _PAST_LENGTH) is not None or (
            len(m.outputs) > 1 and not m.outputs[1].is_empty() and is_read(m, m.outputs[1])):
        return "past / present state"
    sizes = _sizes(m)
    if sizes is None or len(sizes) != 3 or sizes[0] != sizes[1]:
        return "Q, K, V widths are not provable (or Q and K differ)"
    if any(s % attrs["num_heads"] for s in sizes):
        return "a Q, K or V width is not a multiple of num_heads"
    if m["x"].dtype is not None and np.dtype(m["x"].dtype) not in (np.dtype(np.float32), np.dtype(np.float16)):
        return "input is not float32 or float16"
    mask = _input(m, _MASK)
    if mask is not None:
        rank = len(mask.shape) if mask.shape is not None else None
        if rank == 2:
            return None
        if not _is_key_lengths(m, mask):
            return "mask_index is not provably [batch] key lengths or a [batch, keys] mask"
    return None


def _rewrite(m: Match):
    x, names, sizes = m["x"], m.fresh, _sizes(m)
    dtype = x.dtype
    qkv = gs.Variable(names("qkv"), dtype=dtype)
    nodes = [gs.Node("MatMul", inputs=[x, m["w"]], outputs=[qkv])]
    if _input(m, _BIAS) is not None:
        biased = gs.Variable(names("qkv"), dtype=dtype)
        nodes.append(gs.Node("Add", inputs=[qkv, _input(m, _BIAS)], outputs=[biased]))
        qkv = biased
    q, k, v = (gs.Variable(names(part), dtype=dtype) for part in ("q", "k", "v"))
    split = np.array(sizes, np.int64)
    if opset_of(m.graph) >= 13:
        nodes.append(gs.Node("Split", inputs=[qkv, m.constant("qkv_sizes", split)], outputs=[q, k, v], attrs={"axis": -1}))
    else:
        nodes.append(gs.Node("Split", inputs=[qkv], outputs=[q, k, v], attrs={"axis": -1, "split": sizes}))
    empty = gs.Variable.empty
    mask, attention_bias = _input(m, _MASK) or empty(), _input(m, _ATTENTION_BIAS) or empty()
    attrs = {k: m.root.attrs[k] for k in _MHA_ATTRS if k in m.root.attrs}
    nodes.append(gs.Node("MultiHeadAttention", domain=CONTRIB_DOMAIN, inputs=[q, k, v, empty(), mask, attention_bias],
                         outputs=[m.outputs[0]], attrs=attrs))
    return nodes


RULES = (Rule("expand_packed_attention", ms_op.Attention(var("x"), var("w"), allow_extra_inputs=True), _rewrite, _check),)
