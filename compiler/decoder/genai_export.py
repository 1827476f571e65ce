"""Decoders exported by onnxruntime-genai's model builder, in the form the decoder path reads.

The builder (`python -m onnxruntime_genai.models.builder`, what most ONNX LLMs on the Hugging Face
hub come from) writes attention as one com.microsoft.GroupQueryAttention per layer: packed QKV,
rotary inside (cos/sin caches, positions from the mask's row sums), past and present KV, a causal
mask implied by the sequence lengths. Its weights are often com.microsoft.MatMulNBits: 4- or 8-bit
blocks with per-block scales. Neither has a paged form of its own, so the build first rewrites:

- MatMulNBits with constant weights -> MatMul by the dequantized float32 weight (+ bias): the plan
  computes what onnxruntime's fp32-accuracy kernel computes from the same blocks; likewise
  GatherBlockQuantized (a quantized embedding table) -> Gather from the dequantized table;
- GroupQueryAttention -> Split of the packed QKV, com.microsoft.RotaryEmbedding of q and k at a new
  `position_ids` input (the runtime feeds each token's position), KV reshaped to (B, kvN, S, H) and
  concatenated to the past (the present), repeat_kv, and MultiHeadAttention with an explicit causal
  (or sliding-window) additive mask built from the mask's shape: the pattern sites.py pages.

Soft-capping (Gemma 2) rides on the MultiHeadAttention node as `softcap` (infc's kernel and the
paged one apply it). What this cannot express is refused with the reason: attention bias, head-sink
or position inputs.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import BadInput
from ..graph import NameGen
from .sites import NOT_RECOGNIZED
from .weight_codes import WeightCodes

MS = "com.microsoft"
NEG_INF = float(np.finfo(np.float32).min)
DEQUANTIZE_BLOCKED_OPSET = 21  # DequantizeLinear's block_size  # the mask's hidden entries (<= -1e30: mask_check.MASKED)


def is_genai_export(model: onnx.ModelProto) -> bool:
    return any(n.domain == MS and n.op_type in ("GroupQueryAttention", "MatMulNBits") for n in model.graph.node)


def unpack(model: onnx.ModelProto, codes: dict | None = None) -> onnx.ModelProto:
    """A copy with MatMulNBits dequantized and GroupQueryAttention unpacked (module docstring).
    `codes`, when given, receives each dequantized weight's name -> its WeightCodes (the plan keeps
    those instead of the float32 weight: decoder/weight_codes.py)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    weights = {t.name: t for t in graph.initializer}
    names = NameGen.of_onnx(graph)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    producers = {o: n for n in model.graph.node for o in n.output}
    nodes, added = [], []
    kv_shapes: dict[str, tuple[int, int]] = {}  # past / present name -> (KV heads, head size)
    positions = None
    for node in graph.node:
        if node.domain == MS and node.op_type == "MatMulNBits":
            nodes += _matmul(node, weights, added, names, codes)
        elif node.domain == MS and node.op_type == "GatherBlockQuantized":
            table = _gather_table(node, weights, producers)  # None: it stays an onnxruntime island
            nodes += [node] if table is None else _gather(node, table, weights, added, names, opset)
        elif node.domain == MS and node.op_type == "GroupQueryAttention":
            if positions is None:
                positions = helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
            nodes += _attention(node, weights, producers, added, names, kv_shapes)
        else:
            nodes.append(node)
    _static_kv_shapes(graph, kv_shapes)
    used = {i for n in nodes for i in n.input}
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept + added)
    if positions is not None and "position_ids" not in {i.name for i in graph.input}:
        graph.input.append(positions)
    if not any(o.domain == MS for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(MS, 1))
    return out


def past_kv_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """Each GroupQueryAttention's past key / value input -> (KV heads, head size), as unpack pins
    them; {} where a head size cannot be told (unpack then says why)."""
    weights = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    shapes = {}
    for node in model.graph.node:
        if node.domain == MS and node.op_type == "GroupQueryAttention" and _input(node, 3) and _input(node, 4):
            attrs = _attrs(node)
            heads, kv_heads = int(attrs["num_heads"]), int(attrs["kv_num_heads"])
            try:
                head_dim = _head_dim(node, weights, producers, heads, kv_heads)
            except BadInput:
                continue
            shapes.update({node.input[3]: (kv_heads, head_dim), node.input[4]: (kv_heads, head_dim)})
    return shapes


def _static_kv_shapes(graph: onnx.GraphProto, kv_shapes: dict) -> None:
    """The builder leaves the KV head size symbolic ('kv_cache_dim'): pin it, and the KV heads."""
    for value in [*graph.input, *graph.output]:
        if value.name in kv_shapes and len(value.type.tensor_type.shape.dim) == 4:
            dims = value.type.tensor_type.shape.dim
            dims[1].dim_value, dims[3].dim_value = kv_shapes[value.name]


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if len(node.input) > index else ""


def _const(added: list, names: NameGen, stem: str, value) -> str:
    name = names(stem)
    added.append(numpy_helper.from_array(np.asarray(value), name))
    return name


def nbits_parts(blocks: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, n: int, k: int,
                bits: int, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MatMulNBits' weight in parts: codes uint8 [N, k_blocks * block_size], scales float32 and zero
    points [N, k_blocks] (uint8 when the model's are packed like B or absent: 2^(bits - 1); float32
    when it gives them as floats). B is [N, k_blocks, blob] uint8, low bits first."""
    k_blocks = -(-k // block_size)
    per_byte = 8 // bits
    mask = (1 << bits) - 1
    raw = blocks.reshape(n, k_blocks, -1).astype(np.uint8)
    codes = np.stack([(raw >> (bits * i)) & mask for i in range(per_byte)], axis=-1).reshape(n, k_blocks, -1)
    codes = codes[:, :, :block_size].reshape(n, k_blocks * block_size)
    scale = scales.reshape(n, k_blocks).astype(np.float32)
    if zero_points is None:
        zero = np.full((n, k_blocks), 1 << (bits - 1), np.uint8)
    elif zero_points.dtype == np.uint8:
        packed = zero_points.reshape(n, -1)
        zero = np.stack([(packed >> (bits * i)) & mask for i in range(per_byte)], axis=-1).reshape(n, -1)[:, :k_blocks]
    else:
        zero = zero_points.reshape(n, k_blocks).astype(np.float32)
    return codes, scale, zero


def dequantize_nbits(blocks: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, n: int, k: int,
                     bits: int, block_size: int) -> np.ndarray:
    """MatMulNBits' weight as float32 [N, K] (nbits_parts): (code - zero point) * scale, per block."""
    return dequantize_parts(*nbits_parts(blocks, scales, zero_points, n, k, bits, block_size), k, block_size)


def dequantize_parts(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray, k: int, block_size: int) -> np.ndarray:
    n = codes.shape[0]
    centered = codes.reshape(n, scale.shape[1], block_size).astype(np.float32) - zero.astype(np.float32)[:, :, None]
    return (centered * scale[:, :, None]).reshape(n, -1)[:, :k]


def _matmul(node, weights, added, names, codes: dict | None) -> list:
    attrs = _attrs(node)
    b_name, s_name, z_name = _input(node, 1), _input(node, 2), _input(node, 3)
    if b_name not in weights or s_name not in weights or (z_name and z_name not in weights):
        raise BadInput(f"MatMulNBits '{node.name}': its weight, scales and zero points must be constants")
    if _input(node, 4):
        raise BadInput(f"MatMulNBits '{node.name}': g_idx (act-order) is not supported")
    n, k, bits, block = int(attrs["N"]), int(attrs["K"]), int(attrs.get("bits", 4)), int(attrs["block_size"])
    if bits not in (2, 4, 8):
        raise BadInput(f"MatMulNBits '{node.name}': {bits}-bit weights are not supported")
    zero = numpy_helper.to_array(weights[z_name]) if z_name else None
    parts = nbits_parts(numpy_helper.to_array(weights[b_name]), numpy_helper.to_array(weights[s_name]), zero,
                        n, k, bits, block)
    weight = dequantize_parts(*parts, k, block)
    w_name = _const(added, names, b_name + "_float", np.ascontiguousarray(weight.T))
    if codes is not None and parts[2].dtype == np.uint8:  # float zero points have no 8-bit form
        codes[w_name] = WeightCodes.of_rows(parts, k, block)
    bias = _input(node, 5)
    if not bias:
        return [helper.make_node("MatMul", [node.input[0], w_name], list(node.output), name=node.name)]
    product = names(node.name + "_product")
    return [helper.make_node("MatMul", [node.input[0], w_name], [product], name=node.name),
            helper.make_node("Add", [product, bias], list(node.output), name=names(node.name + "_bias"))]


def _constant(name: str, weights, producers) -> np.ndarray | None:
    """An initializer's or a Constant node's value."""
    if name in weights:
        return numpy_helper.to_array(weights[name])
    node = producers.get(name)
    if node is not None and node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
        return numpy_helper.to_array(node.attribute[0].t)
    return None


def _gather_table(node, weights, producers) -> np.ndarray | None:
    """GatherBlockQuantized's packed table when it is a constant, or a Reshape of one (tied
    embeddings share the LM head's MatMulNBits blocks); None otherwise (it stays an onnxruntime island)."""
    attrs = _attrs(node)
    if int(attrs.get("gather_axis", 0)) != 0 or int(attrs.get("quantize_axis", 1)) not in (1, -1):
        return None
    name = node.input[0]
    if name in weights:
        table = numpy_helper.to_array(weights[name])
    else:
        reshape = producers.get(name)
        if reshape is None or reshape.op_type != "Reshape" or reshape.input[0] not in weights:
            return None
        target = _constant(reshape.input[1], weights, producers)
        if target is None:
            return None
        source = numpy_helper.to_array(weights[reshape.input[0]])
        shape = [source.shape[i] if d == 0 else int(d) for i, d in enumerate(target.reshape(-1).tolist())]
        table = source.reshape(shape)
    if table.dtype != np.uint8 or table.ndim != 2 or node.input[2] not in weights or (_input(node, 3) and _input(node, 3) not in weights):
        return None
    return table


def _gather(node, packed: np.ndarray, weights, added, names, opset: int) -> list:
    """GatherBlockQuantized -> the rows' codes, scales and zero points gathered, then a blocked
    DequantizeLinear (opset 21 on): the plan keeps the 8-bit codes, not a float32 table; before
    opset 21, or with float zero points, a Gather from the dequantized float32 table."""
    attrs = _attrs(node)
    bits, block = int(attrs.get("bits", 4)), int(attrs["block_size"])
    rows, k = packed.shape[0], packed.shape[1] * (8 // bits)
    blocks = packed.reshape(rows, -1, block * bits // 8)
    zero = numpy_helper.to_array(weights[node.input[3]]) if _input(node, 3) else None
    parts = nbits_parts(blocks, numpy_helper.to_array(weights[node.input[2]]), zero, rows, k, bits, block)
    ids = node.input[1]
    if opset < DEQUANTIZE_BLOCKED_OPSET or parts[2].dtype != np.uint8:
        name = _const(added, names, node.input[0] + "_float", dequantize_parts(*parts, k, block))
        return [helper.make_node("Gather", [name, ids], list(node.output), name=node.name, axis=0)]
    gathered = []
    for part, stem in zip(parts, ("codes", "scales", "zero_points")):
        table = _const(added, names, f"{node.input[0]}_{stem}", np.ascontiguousarray(part))
        gathered.append(helper.make_node("Gather", [table, ids], [names(f"{node.name}_{stem}")], name=names(node.name), axis=0))
    dequantize = helper.make_node("DequantizeLinear", [g.output[0] for g in gathered], list(node.output),
                                  name=names(node.name + "_dequantize"), axis=-1, block_size=block)
    return [*gathered, dequantize]


def _attention(node, weights, producers, added, names, kv_shapes: dict) -> list:
    attrs = _attrs(node)
    heads, kv_heads = int(attrs["num_heads"]), int(attrs["kv_num_heads"])
    softcap = float(attrs.get("softcap", 0.0) or 0.0)
    if bool(_input(node, 1)) != bool(_input(node, 2)):
        raise BadInput(f"{NOT_RECOGNIZED}: GroupQueryAttention '{node.name}' has a key input without a value input")
    if any(_input(node, i) for i in (9, 10, 11)):
        raise BadInput(f"{NOT_RECOGNIZED}: GroupQueryAttention '{node.name}' takes position_ids, attention_bias "
                       "or head_sink inputs")
    packed, past_k, past_v = node.input[0], _input(node, 3), _input(node, 4)
    cos, sin = _input(node, 7), _input(node, 8)
    if not past_k or not past_v or len(node.output) < 3:
        raise BadInput(f"{NOT_RECOGNIZED}: GroupQueryAttention '{node.name}' has no past/present key-value")
    rotary = int(attrs.get("do_rotary", 0))
    if rotary and (cos not in weights or sin not in weights):
        raise BadInput(f"{NOT_RECOGNIZED}: GroupQueryAttention '{node.name}': its rotary caches are not constants")
    out, present_k, present_v = node.output[0], node.output[1], node.output[2]
    head_dim = _head_dim(node, weights, producers, heads, kv_heads)
    scale = float(attrs.get("scale", 0.0) or 0.0) or 1.0 / np.sqrt(head_dim)
    kv_shapes.update({name: (kv_heads, head_dim) for name in (past_k, past_v, present_k, present_v)})
    window = int(attrs.get("local_window_size", -1))
    nodes = []
    stem = node.name or "gqa"

    def make(op, inputs, domain="", **kw):
        output = names(f"{stem}/{op}")
        nodes.append(helper.make_node(op, inputs, [output], name=names(f"{stem}/{op}_node"), domain=domain, **kw))
        return output

    if _input(node, 1):  # separate query, key and value (Qwen3: q and k normalized apart)
        q, k, v = packed, node.input[1], node.input[2]
    else:
        sizes = _const(added, names, f"{stem}/qkv_sizes",
                       np.array([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], np.int64))
        q, k, v = names(f"{stem}/q"), names(f"{stem}/k"), names(f"{stem}/v")
        nodes.append(helper.make_node("Split", [packed, sizes], [q, k, v], name=names(f"{stem}/Split"), axis=2))
    if rotary:
        rotary_dim = 2 * int(weights[cos].dims[-1])
        extra = {"rotary_embedding_dim": rotary_dim} if rotary_dim < head_dim else {}
        common = {"interleaved": int(attrs.get("rotary_interleaved", 0))}
        q = make("RotaryEmbedding", [q, "position_ids", cos, sin], MS, num_heads=heads, **common, **extra)
        k = make("RotaryEmbedding", [k, "position_ids", cos, sin], MS, num_heads=kv_heads, **common, **extra)
    split_heads = _const(added, names, f"{stem}/kv_shape", np.array([0, 0, kv_heads, head_dim], np.int64))
    k_new = make("Transpose", [make("Reshape", [k, split_heads])], perm=[0, 2, 1, 3])
    v_new = make("Transpose", [make("Reshape", [v, split_heads])], perm=[0, 2, 1, 3])
    nodes.append(helper.make_node("Concat", [past_k, k_new], [present_k], name=names(f"{stem}/concat_key"), axis=2))
    nodes.append(helper.make_node("Concat", [past_v, v_new], [present_v], name=names(f"{stem}/concat_value"), axis=2))
    key, value = present_k, present_v
    if heads != kv_heads:  # repeat_kv: (B, kvN, L, H) -> (B, kvN, g, L, H) -> (B, N, L, H)
        axis = _const(added, names, f"{stem}/group_axis", np.array([2], np.int64))
        expand = _const(added, names, f"{stem}/group", np.array([1, 1, heads // kv_heads, 1, 1], np.int64))
        merged = _const(added, names, f"{stem}/heads", np.array([0, heads, -1, head_dim], np.int64))
        key = make("Reshape", [make("Expand", [make("Unsqueeze", [key, axis]), expand]), merged])
        value = make("Reshape", [make("Expand", [make("Unsqueeze", [value, axis]), expand]), merged])
    bias = _causal_bias(make, added, names, stem, q, key, window)
    # softcap is not onnxruntime's MultiHeadAttention attribute: infc's kernel and sites.py read it
    capped = {"softcap": softcap} if softcap > 0 else {}
    nodes.append(helper.make_node("MultiHeadAttention", [q, key, value, "", "", bias], [out], name=names(f"{stem}/MHA"),
                                  domain=MS, num_heads=heads, scale=scale, **capped))
    return nodes


def _head_dim(node, weights, producers, heads: int, kv_heads: int) -> int:
    """The packed QKV's width (N + 2 kvN) * H, read off the projection that makes it (MatMulNBits'
    N, a MatMul weight's columns, through a bias Add); else the rotary cache's (full rotary)."""
    source = producers.get(node.input[0])
    while source is not None and source.op_type == "Add":
        source = producers.get(source.input[0])
    width = None
    if source is not None and source.op_type == "MatMulNBits":
        width = int(_attrs(source)["N"])
    elif source is not None and source.op_type == "MatMul" and _input(source, 1) in weights:
        width = int(weights[source.input[1]].dims[-1])
    parts = heads if _input(node, 1) else heads + 2 * kv_heads  # q alone, or packed QKV
    if width and width % parts == 0:
        return width // parts
    cos = _input(node, 7)
    if cos in weights:
        return 2 * int(weights[cos].dims[-1])
    raise BadInput(f"{NOT_RECOGNIZED}: GroupQueryAttention '{node.name}': cannot tell the head size")


def _causal_bias(make, added, names, stem: str, q: str, key: str, window: int) -> str:
    """[1, 1, S, L] additive mask: 0 where past + i - window < j <= past + i (past = L - S), else lowest."""
    shape_q, shape_k = make("Shape", [q]), make("Shape", [key])
    one = _const(added, names, f"{stem}/one", np.array([1], np.int64))
    two = _const(added, names, f"{stem}/two", np.array([2], np.int64))
    s = make("Gather", [shape_q, one], axis=0)
    length = make("Gather", [shape_k, two], axis=0)
    zero_s = _const(added, names, f"{stem}/zero", np.array(0, np.int64))
    step = _const(added, names, f"{stem}/step", np.array(1, np.int64))
    squeeze0 = _const(added, names, f"{stem}/axis0", np.array([0], np.int64))
    s_scalar, l_scalar = make("Squeeze", [s, squeeze0]), make("Squeeze", [length, squeeze0])
    rows = make("Range", [zero_s, s_scalar, step])
    cols = make("Range", [zero_s, l_scalar, step])
    past = make("Sub", [l_scalar, s_scalar])
    last = make("Unsqueeze", [make("Add", [rows, past]), one])  # [S, 1]: each row's own position
    allowed = make("LessOrEqual", [cols, last])  # [S, L]
    if window > 0:
        first = make("Sub", [last, _const(added, names, f"{stem}/window", np.array(window, np.int64))])
        allowed = make("And", [allowed, make("Greater", [cols, first])])
    zero = _const(added, names, f"{stem}/open", np.array(0.0, np.float32))
    hidden = _const(added, names, f"{stem}/hidden", np.array(NEG_INF, np.float32))
    bias = make("Where", [allowed, zero, hidden])
    return make("Unsqueeze", [bias, _const(added, names, f"{stem}/batch_heads", np.array([0, 1], np.int64))])
