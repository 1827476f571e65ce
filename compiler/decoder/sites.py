"""Finding each layer's attention and the KV cache around it in an optimized decoder graph.

    past_key_values.i.key ─► Concat(axis=2) ◄─ k_new (B, kvN, S, H)        (the same for the value)
                               ├─► present.i.key (graph output)           (an export without a KV
                               ▼                                           cache: k_new alone)
                 [Unsqueeze(2) ─► Expand ─► Reshape]      repeat_kv, only with grouped KV heads
                               ▼
    q ─► com.microsoft.MultiHeadAttention(q (B,S,N*H), k, v, attention_bias=mask)
         or ONNX Attention(q (B,N,S,H) or (B,S,N*H), k, v, mask, softcap=c?)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ..errors import BadInput
from .latent_kv import LatentCache, find_latent_caches

NOT_RECOGNIZED = "not a recognized decoder"
ATTENTION_OPS = {("com.microsoft", "MultiHeadAttention"), ("", "Attention")}
REPEAT_KV_OPS = {"Unsqueeze", "Expand", "Reshape", "Identity"}


@dataclass
class Site:
    node: gs.Node
    q: gs.Tensor
    k_new: gs.Tensor
    v_new: gs.Tensor
    past: tuple[gs.Tensor, ...]  # the past K and V graph inputs; () for an export without a KV cache
    present: tuple[gs.Tensor, ...]  # the Concats' outputs; ()
    num_heads: int
    kv_num_heads: int
    head_dim: int
    scale: float
    bias: gs.Tensor | None  # the additive (or boolean) mask; mask_check.py proves it causal
    softcap: float = 0.0  # scores -> softcap * tanh(scores / softcap) before the mask, when > 0
    window: int = 0  # a sliding window: each query sees its last `window` keys (mask_check.py finds it)
    alibi_slopes: tuple[float, ...] | None = None  # per query head: + slope * (key - query position)
    sinks: tuple[float, ...] | None = None  # per query head: a logit that joins each row's softmax (gpt-oss)
    value_dim: int = 0  # the value head size where it differs from the key's (latent_kv.py: DeepSeek's MLA)
    latent: LatentCache | None = None  # K/V computed from cached latents: k_new/v_new are the whole K/V

    @property
    def q_is_4d(self) -> bool:
        return self.node.op == "Attention" and len(self.q.shape or ()) == 4


def _producer(t: gs.Tensor) -> gs.Node | None:
    return t.inputs[0] if len(t.inputs) == 1 else None


def _kv_source(t: gs.Tensor, graph_inputs: set[int]) -> tuple[gs.Node | gs.Tensor | None, str | None]:
    """Walk from an attention's key/value up through repeat_kv to the past-KV Concat, or (an export
    without a KV cache) to the new tokens' (B, kvN, S, H) key/value itself."""
    node, source = _producer(t), t
    while node is not None and node.op in REPEAT_KV_OPS:
        if node.op == "Unsqueeze" and _unsqueeze_axes(node) not in ([2], None):
            return None, "repeat_kv does not insert the group axis after the KV heads"
        source, node = node.inputs[0], _producer(node.inputs[0])
    if node is not None and node.op == "Concat" and len(node.inputs) == 2 and id(node.inputs[0]) in graph_inputs:
        if node.attrs.get("axis") not in (2, -2):
            return None, "past-KV Concat is not over the sequence axis"
        return node, None
    if any(id(i) in graph_inputs for i in (node.inputs if node is not None and node.op == "Concat" else [])):
        return None, "key/value is not a Concat of a past-KV graph input and the new tokens"
    if source.shape is None or len(source.shape) != 4:
        return None, "key/value is neither a Concat of a past-KV graph input and the new tokens nor 4-D (B, kvN, S, H)"
    return source, None  # no KV cache in the graph: attention over the sequence's own tokens


def _unsqueeze_axes(node: gs.Node) -> list[int] | None:
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and isinstance(node.inputs[1], gs.Constant):
        axes = np.asarray(node.inputs[1].values).reshape(-1).tolist()
    return [int(a) for a in axes] if axes is not None else None


def _static(dim) -> int | None:
    return int(dim) if isinstance(dim, (int, np.integer)) and dim > 0 else None


def _num_heads(q: gs.Tensor, key: gs.Tensor, out: gs.Tensor, head_dim: int | None) -> int | None:
    """Query heads of a 4-D Attention: dim 1 of q, of the repeated key, or of the output."""
    for t in (q, key, out):
        if t.shape is not None and len(t.shape) == 4 and _static(t.shape[1]):
            return _static(t.shape[1])
    hidden = _static(q.shape[-1]) if q.shape is not None and len(q.shape) == 3 else None
    return hidden // head_dim if hidden and head_dim and hidden % head_dim == 0 else None


def site_of(node: gs.Node, graph_inputs: set[int], latent: LatentCache | None = None) -> tuple[Site | None, str | None]:
    """`latent`: latent_kv.py's finding that the attention's K/V are computed from cached latents."""
    inputs = [None if t.is_empty() else t for t in node.inputs] + [None] * 8
    if node.op == "MultiHeadAttention" and any(inputs[i] is not None for i in (3, 4, 6, 7)):
        return None, "MultiHeadAttention has a QKV bias, key padding or past inputs"
    if node.op == "Attention" and inputs[4] is not None:
        return None, "Attention has past inputs"
    softcap = max(0.0, float(node.attrs.get("softcap", 0.0)))  # ONNX: none unless positive
    if node.attrs.get("is_causal", 0):  # ONNX aligns it to the upper left: wrong once there is a past
        return None, "Attention has is_causal set"
    if len([o for o in node.outputs if not o.is_empty()]) != 1:
        return None, "attention has present or score outputs"
    k_source, reason = _kv_source(inputs[1], graph_inputs)
    v_source, v_reason = _kv_source(inputs[2], graph_inputs)
    if reason or v_reason:
        return None, reason or v_reason
    if isinstance(k_source, gs.Node) != isinstance(v_source, gs.Node):
        return None, "one of key and value has a past-KV input, the other not"
    if isinstance(k_source, gs.Node):  # past K/V concatenated with the new tokens'
        past, present = (k_source.inputs[0], v_source.inputs[0]), (k_source.outputs[0], v_source.outputs[0])
        k_new, v_new = k_source.inputs[1], v_source.inputs[1]
    else:  # no KV cache: attention over the step's own tokens, which paging extends to the cached ones
        past, present, k_new, v_new = (), (), k_source, v_source
    if latent is not None:
        past, present = latent.past, latent.present
    shape = list((past[0] if past and latent is None else k_new).shape or [])
    kv_heads, head_dim = (_static(shape[1]), _static(shape[3])) if len(shape) == 4 else (None, None)
    v_shape = list((past[1] if past and latent is None else v_new).shape or [])
    value_dim = (_static(v_shape[3]) if len(v_shape) == 4 else None) or head_dim  # unknown: the key's, as always
    if value_dim and head_dim and value_dim > head_dim:  # the pools hold one head size: a narrower value is padded to the key's
        return None, f"value heads ({value_dim}) are wider than key heads ({head_dim})"
    q = inputs[0]
    num_heads = node.attrs.get("num_heads") or node.attrs.get("q_num_heads") or _num_heads(q, inputs[1], node.outputs[0], head_dim)
    if not (kv_heads and head_dim and num_heads) or num_heads % kv_heads:
        return None, "head counts or head size are not static"
    scale = node.attrs.get("scale") or 1.0 / np.sqrt(head_dim)
    bias = inputs[5] if node.op == "MultiHeadAttention" else inputs[3]
    sinks = tuple(float(x) for x in node.attrs["sinks"]) if node.attrs.get("sinks") else None  # attention_sinks.py
    if sinks is not None and len(sinks) != num_heads:
        return None, "attention sinks are not one per query head"
    site = Site(node, q, k_new, v_new, past, present, int(num_heads), kv_heads, head_dim, float(scale), bias, softcap,
                sinks=sinks, value_dim=value_dim if value_dim != head_dim else 0, latent=latent)
    return site, None


def past_shape(t: gs.Tensor, site: Site, num_past: int) -> list[int]:
    """A past-KV input's shape with `num_past` positions: its own static dims where it has them (a
    latent cache's differ from the attention's heads), else the site's."""
    shape = list(t.shape) if t.shape is not None and len(t.shape) == 4 else [None] * 4
    return [1, _static(shape[1]) or site.kv_num_heads, num_past, _static(shape[3]) or site.head_dim]


def _reads_past_concats(node: gs.Node, graph_inputs: set[int]) -> bool:
    return all(isinstance(_kv_source(t, graph_inputs)[0], gs.Node) for t in node.inputs[1:3])


SCORE_PRODUCTS = {"MatMul", "FusedMatMul", "Gemm", "Einsum"}
CHAIN_DEPTH = 8  # ops walked back from an unfused Softmax to the Q·K product


def _to_product(t: gs.Tensor, depth: int) -> list[str] | None:
    """Ops from the Q·K product to `t` (shortest path through first inputs and others), or None."""
    node = _producer(t)
    if node is None or depth == 0:
        return None
    if node.op in SCORE_PRODUCTS:
        return [node.op]
    paths = [p for p in (_to_product(i, depth - 1) for i in node.inputs if not isinstance(i, gs.Constant)) if p]
    return min(paths, key=len) + [node.op] if paths else None


def unfused_scores(graph: gs.Graph) -> str | None:
    """What the first Softmax that reads a product reads, as `MatMul -> Mul -> Add -> Softmax`:
    shows the user which form of attention was not recognized (an extra Add is a position bias)."""
    for node in graph.nodes:
        chain = _to_product(node.inputs[0], CHAIN_DEPTH) if node.op == "Softmax" else None
        if chain:
            rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
            return f"Softmax '{node.name}' reads {' -> '.join(chain)} -> Softmax{f' ({rank}-D scores)' if rank else ''}"
    return None


def find_sites(graph: gs.Graph, fusion_rejections: dict[str, int]) -> list[Site]:
    """Every attention of the decoder, in graph order; a decoder that is not recognized fails here."""
    graph.toposort()
    graph_inputs = {id(t) for t in graph.inputs}
    nodes = [n for n in graph.nodes if ((n.domain or "").replace("ai.onnx", ""), n.op) in ATTENTION_OPS]
    if not nodes:
        reasons = "; ".join(f"{r} (x{n})" for r, n in fusion_rejections.items()) or "no attention pattern found"
        scores = unfused_scores(graph)
        hint = (f"; {scores}, where infc pages MatMul -> scale -> [soft-cap] -> [mask] -> Softmax on 4-D (B, N, S, T) "
                "scores (with an ALiBi position bias in the mask or not)") if scores else ""
        if not any(n.op == "Softmax" for n in graph.nodes):  # nothing to page: a state carried token to token
            raise BadInput("not a recognized decoder: no attention node fused: the model has no Softmax at all (not "
                           "a transformer; a recurrent or state-space decoder as Mamba, RWKV or xLSTM carries a state "
                           "from token to token, which a paged KV cache of attention keys and values cannot hold)")
        raise BadInput(f"not a recognized decoder: no attention node fused: {reasons}{hint}")
    above = _inputs_above(graph)
    for node in nodes:
        _refuse_cross_attention(node, above)
    # MLA: K/V computed from cached latents are recomputed from the new tokens' (latent_kv.py)
    latent = find_latent_caches(graph, nodes, lambda node: _reads_past_concats(node, graph_inputs))
    sites = []
    for node in nodes:
        site, reason = site_of(node, graph_inputs, latent.get(id(node)))
        if site is None:
            raise BadInput(f"not a recognized decoder: attention '{node.name}': {reason}")
        sites.append(site)
    if len({bool(site.past) for site in sites}) > 1:
        raise BadInput("not a recognized decoder: some attention layers read a past-KV input and others not")
    return sites


# Ops whose output reads only their input's shape: a dynamo export reshapes the encoder's keys with
# the batch size of the decoder's input_ids, which is no data of theirs.
SHAPE_ONLY_OPS = {"Shape", "Size"}


def _inputs_above(graph: gs.Graph) -> dict[int, frozenset[str]]:
    """For each tensor (by id), the graph inputs whose values it is computed from (not through their
    shapes alone); the graph is in topological order."""
    above = {id(t): frozenset([t.name]) for t in graph.inputs}
    for node in graph.nodes:
        inputs = () if node.op in SHAPE_ONLY_OPS else node.inputs
        found = frozenset().union(*(above.get(id(t), frozenset()) for t in inputs))
        for out in node.outputs:
            above[id(out)] = found
    return above


def _refuse_cross_attention(node: gs.Node, above: dict[int, frozenset[str]]) -> None:
    """An attention whose keys share no graph input with its queries attends to another sequence: the
    cross-attention of an encoder-decoder's decoder (to encoder states or their cached keys). Paging
    assumes keys of the tokens being decoded, so such a graph is refused here, by what it is, instead
    of by whichever later check it happens to fail."""
    q, k = node.inputs[0], node.inputs[1]
    q_from, k_from = above.get(id(q), frozenset()), above.get(id(k), frozenset())
    if k_from and not (q_from & k_from):
        raise BadInput(f"not a recognized decoder: attention '{node.name}' is cross-attention (its keys come from "
                       f"{', '.join(sorted(repr(n) for n in k_from))}, its queries from none of them), as in an "
                       "encoder-decoder model's decoder; decoder plans page decoder-only models: build without a "
                       "decode: section for a one-shot plan")
