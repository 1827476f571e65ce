"""Scaled dot-product attention, written out, into one node.

  q (B,N,S,H) ──────► MatMul ─► Mul|Div(scale)? ─► Where(cond, ·, fill)? ─► Add(mask)? ─► Softmax ─┐
  kt (B,N,H,T) ───────┘                                                     v (B,N,T,H) ─► MatMul ◄┘
    ─► ctx ─► Transpose(0,2,1,3) ─► Reshape(B, S, N*H) ─►
  opset >= 23 ==> ctx = Attention(q, k, v, bias)                            ONNX op, 4-D in and out
  opset <  23 ==> com.microsoft MultiHeadAttention(q as (B,S,N*H), k, v, attention_bias=bias) ─►
  k = kt transposed back; scale: the graph's; bias: the graph's own mask made additive (exact for any
  mask). Past K/V stay the graph's Concats; grouped KV heads arrive repeated by the graph's repeat_kv.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ...graph import CONTRIB_DOMAIN, opset_of
from ..engine import Match, Rule
from ..pattern import const, op, var
from .attention_builder import Builder, shape_of, transposed
from .attention_layout import head_dims, keeps_leading_dims, merged_heads, reads_merged
from .attention_mask import attention_bias


def _scale(m: Match) -> float | None:
    value, is_div = (m.const("scale"), m.node("scale").op == "Div") if "scale" in m.values else (np.ones(1), False)
    return float(value.reshape(-1)[0]) ** (-1 if is_div else 1) if value.size == 1 and value.all() else None


def _check(target: str, m: Match) -> str | None:
    opset, softmax, fill = opset_of(m.graph), m.node("softmax"), m.const("fill") if "fill" in m.values else None
    if (target == "onnx") != (opset >= 23):
        return "ONNX Attention needs opset 23" if target == "onnx" else "opset 23 takes the ONNX Attention op"
    if softmax.attrs.get("axis", -1 if opset >= 13 else 1) not in (-1, 3) or shape_of(softmax.outputs[0], 4) is None:
        return "Softmax is not over the last axis of 4-D scores"
    dtype, has_mask = np.dtype(softmax.outputs[0].dtype), "mask" in m.values or "cond" in m.values
    if dtype != np.float32 and (dtype != np.float16 or target == "onnx" and has_mask):  # see attention_mask
        return "scores are not float32 (or float16 without a mask for ONNX Attention)"
    if _scale(m) is None or not np.isfinite(_scale(m)):
        return "scale is not a finite nonzero scalar"
    if fill is not None and not (fill.size == 1 and float(fill.reshape(-1)[0]) <= -1e30):  # fill + score == fill
        return "Where fill value is not -inf or <= -1e30"
    if target == "mha" and list(m.node("to_bsnh").attrs.get("perm", [])) != [0, 2, 1, 3]:
        return "context is not transposed to (B, S, N, H)"
    return "Q, K, V are not 4-D with known, equal head counts and sizes" if head_dims(m["q"], m["kt"], m["v"]) is None \
        else None


def _rewrite(target: str, m: Match):
    b, (n, hv), dtype, is_onnx = Builder(m), head_dims(m["q"], m["kt"], m["v"]), m.outputs[0].dtype, target == "onnx"
    key, q = transposed(b, m["kt"], [0, 1, 3, 2]), m["q"] if is_onnx else merged_heads(b, m["q"])
    bias = attention_bias(b, m, (q, 2 if is_onnx else 1), (key, 2), is_onnx)
    if is_onnx:
        b("Attention", q, key, m["v"], *[bias] if bias is not None else [], out=m.outputs[0], scale=_scale(m))
        return b.nodes
    merge, ctx_BSNH, is_direct = m.node("merge"), m.node("to_bsnh").outputs[0], keeps_leading_dims(m.node("merge"), 3)
    y = b("MultiHeadAttention", q, key, m["v"], None, None, bias, domain=CONTRIB_DOMAIN, num_heads=n,
          scale=_scale(m), out=m.outputs[0] if is_direct else None, dtype=dtype)
    # Not provably (B, S, N*H): the graph's own Reshape stays, exact whatever its shape input holds.
    src = y if is_direct or reads_merged(merge) else ctx_BSNH
    matched = {id(x) for x in m.nodes}
    is_read = any(id(c) not in matched for c in ctx_BSNH.outputs) or any(t is ctx_BSNH for t in m.graph.outputs)
    if src is ctx_BSNH or is_read:
        b("Reshape", y, b.const([0, 0, n, hv]), out=m.exposed["to_bsnh"][0])  # e.g. for Shape nodes
    if not is_direct:
        b("Reshape", src, m["shape"], out=m.outputs[0], **dict(merge.attrs))
    return b.nodes


def _pattern(target: str, is_scaled: bool, mask: str):
    s = op.MatMul(var("q"), var("kt"), name="qk")
    s = op.any("Mul", "Div")(s, const("scale"), name="scale") if is_scaled else s
    s = op.Where(var("cond"), s, const("fill")) if "where" in mask else s
    s = op.Add(s, var("mask")) if "add" in mask else s
    ctx = op.MatMul(op.Softmax(s, name="softmax"), var("v"), name="pv")
    return ctx if target == "onnx" else op.Reshape(op.Transpose(ctx, name="to_bsnh"), var("shape"), name="merge")


RULES = tuple(
    Rule(f"attention_{target}", _pattern(target, is_scaled, mask), partial(_rewrite, target), partial(_check, target),
         exposed=("to_bsnh",) if target == "mha" else ())
    for target in ("onnx", "mha") for is_scaled in (True, False) for mask in ("where_add", "add", "where", "none"))
