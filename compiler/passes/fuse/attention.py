"""Scaled dot-product attention, written out, into one node.

  q (B,N,S,H) ─► Mul(√s)? ─► MatMul ─► Mul|Div(scale)? ─► softcap? ─► Where(cond, ·, fill)? ─► Add(mask)? ─┐
  kt (B,N,H,T) ─► Mul(√s)? ───┘         softcap: Mul(Tanh(Div(·, c)), c)  (Gemma 2)                    │
    ┌─ Where(IsNaN(p), 0, p)? (torch's SDPA export) ◄─ p ◄─ Softmax ◄─────────────────────────────────────┘
    └─► MatMul ◄─ v (B,N,T,H)
    ─► ctx ─► Reshape(to ctx's own shape)? ─► Transpose(0,2,1,3) ─► Reshape(B, S, N*H) ─►
                                               or Transpose(2,0,1,3) ─► Reshape(S*B or S, B, N*H): torch's MHA
  opset >= 23 ==> ctx = Attention(q, k, v, bias, softcap=c)                 ONNX op, 4-D in and out
  opset <  23 ==> com.microsoft MultiHeadAttention(q as (B,S,N*H), k, v, attention_bias=bias) ─►
  k = kt transposed back; scale: the graph's; bias: the graph's own mask made additive (exact for any
  mask). Past K/V stay the graph's Concats; grouped KV heads arrive repeated by the graph's repeat_kv,
  or as one head the MatMuls broadcast (multi-query), which MultiHeadAttention gets expanded.
  The scale: the product of the graph's factors (torch's SDPA export scales q and kt by √scale each,
  DeBERTa divides kt alone).
  The NaN guard zeroes rows masked entirely by -inf: ORT's Attention gives zeros there by itself,
  MultiHeadAttention gives NaN, so its output gets the same guard.
  MultiHeadAttention has no softcap: below opset 23 a soft-capped attention stays unfused (as one whose
  context Reshape is not provably (B, N, S, H)), but for PAGED_RULES, which a decoder build runs
  (decoder/pipeline.py): they write the ONNX Attention at any opset, since that node is replaced by
  infc.PagedAttention before anything runs it.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ...graph import CONTRIB_DOMAIN, opset_of
from ..engine import NOT_APPLICABLE, Match, Rule
from ..pattern import const, op, var
from .attention_builder import Builder, shape_of, transposed
from .attention_layout import (
    head_dims,
    is_broadcast_head,
    keeps_leading_dims,
    merged_heads,
    reads_merged,
    reshapes_to_own_shape,
    unflattened_transpose,
)
from .attention_mask import attention_bias

SCALES = ("scale", "q_scale", "k_scale")
# The context's Transpose from (B, N, S, H): to (B, S, N, H), or to (S, B, N, H) as torch's
# multi_head_attention_forward has it (sequence first; torchvision's ViT, nn.Transformer, CLIP)
BSNH, SBNH = [0, 2, 1, 3], [2, 0, 1, 3]
CONTEXT_PERMS = (BSNH, SBNH)


def _scale(m: Match) -> float | None:
    product = 1.0
    for name in (n for n in SCALES if n in m.values):
        value, is_div = m.const(name), m.node(name).op == "Div"
        if value.size != 1 or not value.all():
            return None
        product *= float(value.reshape(-1)[0]) ** (-1 if is_div else 1)
    return product


def _softcap(m: Match) -> float | None:
    """c of the soft-cap c * tanh(x / c) (or tanh(x * (1/c)) * c): the outer factor, a positive scalar
    that the inner one provably inverts up to its float32 rounding."""
    inner, outer, is_div = m.const("cap_in"), m.const("cap_out"), m.node("cap_in").op == "Div"
    if inner.size != 1 or outer.size != 1 or not float(outer.reshape(-1)[0]) > 0 or not inner.all():
        return None
    cap, inverse = float(outer.reshape(-1)[0]), float(inner.reshape(-1)[0]) ** (1 if is_div else -1)
    return cap if abs(inverse - cap) <= 1e-6 * cap else None


def _scores(m: Match):
    return m.node("qk").outputs[0]


def _check(target: str, m: Match) -> str | None:
    opset, softmax, fill = opset_of(m.graph), m.node("softmax"), m.const("fill") if "fill" in m.values else None
    if target != "paged" and (target == "onnx") != (opset >= 23):
        return "ONNX Attention needs opset 23" if target == "onnx" else "opset 23 takes the ONNX Attention op"
    if "cap_in" in m.values and _softcap(m) is None:
        return "soft-cap is not c * tanh(x / c) with one positive scalar c"
    if "cap_in" in m.values and target == "mha":
        return "MultiHeadAttention has no softcap (ONNX Attention, opset 23, has)"
    if shape_of(softmax.outputs[0], 3) is not None:  # heads merged into the batch: attention_seq_first's form, or
        return NOT_APPLICABLE  # explain_unfused_attention names it when nothing fuses it
    if softmax.attrs.get("axis", -1 if opset >= 13 else 1) not in (-1, 3) or shape_of(softmax.outputs[0], 4) is None:
        return "Softmax is not over the last axis of 4-D scores"
    dtype, has_mask = np.dtype(softmax.outputs[0].dtype), "mask" in m.values or "cond" in m.values
    if dtype != np.float32 and (dtype != np.float16 or target != "mha" and has_mask):  # see attention_mask
        return "scores are not float32 (or float16 without a mask for ONNX Attention)"
    if _scale(m) is None or not np.isfinite(_scale(m)):
        return "scale is not a finite nonzero scalar"
    if fill is not None and not (fill.size == 1 and float(fill.reshape(-1)[0]) <= -1e30):  # fill + score == fill
        return "Where fill value is not -inf or <= -1e30"
    nan_fill = m.const("nan_fill") if "nan_fill" in m.values else None
    if nan_fill is not None and not (nan_fill.size == 1 and float(nan_fill.reshape(-1)[0]) == 0):
        return "Softmax NaN guard does not write zeros"
    if target == "mha" and list(m.node("to_bsnh").attrs.get("perm", [])) not in CONTEXT_PERMS:
        return "context is not transposed to (B, S, N, H) or (S, B, N, H)"
    dims = head_dims(m["q"], m["kt"], m["v"], _scores(m))
    if dims is None:
        return "Q, K, V are not 4-D with known, equal head counts and sizes"
    queries = [m["q"]] + ([m.node("q_scale").outputs[0]] if "q_scale" in m.values else [])
    (batch, _, seq, hq), (n, hv) = shape_of(m["q"], 4) or [None] * 4, dims
    if target == "mha" and hv != hq:  # LeViT: onnxruntime refuses 4-D key and value of different shapes
        return "value head size differs from the query/key head size (MultiHeadAttention's 4-D key and value must match)"
    if "heads_shape" in m.values and not reshapes_to_own_shape(m.node("unmerge"), [batch, n, seq, hv], {2: queries}):
        return "context Reshape does not provably keep its (B, N, S, H) shape"
    return None


def _rewrite(target: str, m: Match):
    b, (n, hv), dtype = Builder(m), head_dims(m["q"], m["kt"], m["v"], _scores(m)), m.outputs[0].dtype
    is_onnx = target in ("onnx", "paged")
    key, value = unflattened_transpose(m["kt"]) or transposed(b, m["kt"], [0, 1, 3, 2]), m["v"]
    q = m["q"] if is_onnx else merged_heads(b, m["q"])
    bias = attention_bias(b, m, (q, 2 if is_onnx else 1), (key, 2), is_onnx)
    if is_onnx:  # the ONNX op takes fewer K/V heads than query heads as they are
        capped = {"softcap": _softcap(m)} if "cap_in" in m.values else {}
        b("Attention", q, key, value, *[bias] if bias is not None else [], out=m.outputs[0], scale=_scale(m), **capped)
        return b.nodes
    # MultiHeadAttention wants N K/V heads: one broadcast head is expanded (sites.py reads through it)
    key, value = (b("Expand", t, b.const([1, n, 1, 1]), dtype=t.dtype) if is_broadcast_head(t, n) else t
                  for t in (key, value))
    merge, to_ctx = m.node("merge"), m.node("to_bsnh")
    perm, ctx = list(to_ctx.attrs["perm"]), to_ctx.outputs[0]  # the context as the graph lays it out
    is_direct = perm == BSNH and keeps_leading_dims(merge, 3)
    is_guarded, out = "nan_fill" in m.values, m.outputs[0] if is_direct else None
    y = b("MultiHeadAttention", q, key, value, None, None, bias, domain=CONTRIB_DOMAIN, num_heads=n,
          scale=_scale(m), out=None if is_guarded else out, dtype=dtype)
    if is_guarded:
        y = b("Where", b("IsNaN", y, dtype=np.bool_), m["nan_fill"], y, out=out, dtype=dtype)
    # Not provably (B, S, N*H): the graph's own Reshape stays, exact whatever its shape input holds.
    src = y if is_direct or perm == BSNH and reads_merged(merge) else ctx
    matched = {id(x) for x in m.nodes}
    is_read = {name: any(id(c) not in matched for c in m.exposed[name][0].outputs) or
               any(t is m.exposed[name][0] for t in m.graph.outputs) for name in m.exposed}
    if perm == SBNH:  # y (B, S, N*H) back to the graph's sequence-first context
        b("Transpose", b("Reshape", y, b.const([0, 0, n, hv]), dtype=dtype), perm=[1, 0, 2, 3], out=ctx)
    elif src is ctx or is_read["to_bsnh"] or is_read.get("pv"):  # e.g. for Shape nodes
        b("Reshape", y, b.const([0, 0, n, hv]), out=ctx)
    if is_read.get("pv"):  # the context as (B, N, S, H), read by the shape of the Reshape matched around it
        b("Transpose", ctx, perm=[perm.index(axis) for axis in range(4)], out=m.exposed["pv"][0])
    if not is_direct:
        b("Reshape", src, m["shape"], out=m.outputs[0], **dict(merge.attrs))
    return b.nodes


def _pattern(target: str, scaled: str, mask: str, is_nan_guarded: bool, is_unmerged: bool = False,
             is_capped: bool = False, has_sinks: bool = False):
    """scaled: "scores" (Mul|Div after the MatMul), "split" (Mul on q and on kt), "keys" (Mul|Div on kt
    alone: DeBERTa's bmm(q, kᵀ / scale)) or "none". has_sinks: attention_sinks.py's sink column."""
    q, kt = var("q"), var("kt")
    if scaled == "split":
        q, kt = op.Mul(q, const("q_scale"), name="q_scale"), op.Mul(kt, const("k_scale"), name="k_scale")
    if scaled == "keys":
        kt = op.any("Mul", "Div")(kt, const("k_scale"), name="k_scale")
    s = op.MatMul(q, kt, name="qk")
    s = op.any("Mul", "Div")(s, const("scale"), name="scale") if scaled == "scores" else s
    if is_capped:
        s = op.Mul(op.Tanh(op.any("Div", "Mul")(s, const("cap_in"), name="cap_in")), const("cap_out"), name="cap_out")
    s = op.Where(var("cond"), s, const("fill")) if "where" in mask else s
    s = op.Add(s, var("mask")) if "add" in mask else s
    if has_sinks:  # one more score column per head, shifted by the row's peak (a no-op for Softmax)
        joined = op.Concat(s, op.Expand(const("sinks"), var("sinks_shape"), name="sinks"), name="joined")
        s = op.Sub(joined, op.ReduceMax(joined, name="peak", allow_extra_inputs=True), name="shift")
    p = op.Softmax(s, name="softmax")
    p = op.Slice(p, const("sink_starts"), const("sink_ends"), const("sink_axes"), name="drop_sink",
                 allow_extra_inputs=True) if has_sinks else p
    p = op.Where(op.IsNaN(p), const("nan_fill"), p) if is_nan_guarded else p
    ctx = op.MatMul(p, var("v"), name="pv")
    ctx = op.Reshape(ctx, var("heads_shape"), name="unmerge") if is_unmerged else ctx
    return ctx if target != "mha" else op.Reshape(op.Transpose(ctx, name="to_bsnh"), var("shape"), name="merge")


# ONNX Attention replaces only ctx; the unmerging Reshape (torch's SDPA export) is left as it is.
RULES = tuple(
    Rule(f"attention_{target}", _pattern(target, scaled, mask, is_guarded, is_unmerged, is_capped),
         partial(_rewrite, target), partial(_check, target), exposed=("to_bsnh", "pv") if target == "mha" else ())
    for target, is_unmerged in (("onnx", False), ("mha", True), ("mha", False))
    for scaled in ("scores", "split", "keys", "none") for mask in ("where_add", "add", "where", "none")
    for is_guarded in (False, True) for is_capped in (False, True) if not (is_capped and scaled in ("split", "keys")))

# Attention as the ONNX Attention op at any opset, for decoder builds only, which page it: soft-capped
# attention, and attention whose context Reshape MultiHeadAttention would need proven (the graph's
# own Reshape stays after the Attention node, as for opset 23).
PAGED_RULES = tuple(
    Rule("attention_paged", _pattern("paged", scaled, mask, is_guarded, is_capped=is_capped), partial(_rewrite, "paged"),
         partial(_check, "paged"), any_opset=True)
    for scaled in ("scores", "split", "keys", "none") for mask in ("where_add", "add", "where", "none")
    for is_guarded in (False, True) for is_capped in (False, True) if not (is_capped and scaled in ("split", "keys")))
