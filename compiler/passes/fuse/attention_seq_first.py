"""torch's multi_head_attention_forward with need_weights=True (nn.MultiheadAttention's default; WavLM's
gated relative position bias, DETR): heads merged into the batch from a sequence-first layout, 3-D
bmm, 3-D Softmax, into one MultiHeadAttention.

  x_q (S, B, E) ─► Reshape(S, B*N, H) ─► Transpose(1,0,2) ─► Mul(c)? ─┐
  x_k (T, B, E) ─► Reshape(T, B*N, H) ─► Transpose(1,2,0) ───────────► MatMul ─► Mul(c)? ─► Add(bias)? ─► Softmax ─┐
  x_v (T, B, E) ─► Reshape(T, B*N, H) ─► Transpose(1,0,2) ──────────────────────────────────────────► MatMul ◄───┘
      ─► Transpose(1,0,2) (S, B*N, H) ─► Reshape(shape)
  ==> Reshape(Transpose(MultiHeadAttention(x_qᵀ, x_kᵀ, x_vᵀ, attention_bias=bias as (B|1, N|1, S, T)), (1,0,2)), shape)

Exact: row b*N + n of the (B*N)-row views is head n of batch b, as MultiHeadAttention splits
(B, S, N*H); (S, B*N, H) and (S, B, N*H) hold the same elements in the same order, so the graph's own
final Reshape stays. Each split Reshape must provably keep its input's first dim and end in H, a
static divisor of the static E (then its middle is B*N); with N > 1 the three batches are one
(MatMul pairs B*N rows only with equal rows or one). A 3-D bias has 1 or B*N rows wherever the 3-D
Add broadcasts, chosen at runtime by its row count as in merged_heads.py.
"""

from __future__ import annotations

import numpy as np

from ...graph import CONTRIB_DOMAIN
from ..engine import Match, Rule
from ..pattern import const, op, var
from .attention_builder import Builder, same_dim
from .attention_dims import DimOf, is_dim_of, shape_elements
from .merged_heads import rows_by_count

PERMS = {"q_heads": [1, 0, 2], "k_heads": [1, 2, 0], "v_heads": [1, 0, 2], "to_seq": [1, 0, 2]}
SPLITS = ("q_split", "k_split", "v_split")


def _heads(x: str):
    return op.Transpose(op.Reshape(var(x), var(f"{x}_shape"), name=f"{x}_split"), name=f"{x}_heads")


def _keeps_first_dim(entry, x) -> bool:
    if isinstance(entry, DimOf):
        named = entry.tensor.shape[entry.axis] if entry.tensor.shape is not None else None
        return is_dim_of(entry, x, 0) or same_dim(named, x.shape[0])
    return isinstance(entry, (int, np.integer)) and entry > 0 and entry == x.shape[0]


def _head_size(m: Match, x: str) -> int | None:
    """H of a split Reshape (S, B, E) -> (S, B*N, H) that provably keeps S, with E static."""
    t, elems = m[x], shape_elements(m[f"{x}_shape"])
    if t.shape is None or len(t.shape) != 3 or not isinstance(t.shape[2], (int, np.integer)) or len(elems) != 3:
        return None
    size, out = elems[2], m.node(f"{x}_split").outputs[0]
    keeps = _keeps_first_dim(elems[0], t) or out.shape is not None and same_dim(out.shape[0], t.shape[0])  # dynamo's
    if not isinstance(size, (int, np.integer)) or size <= 0 or t.shape[2] % size or not keeps:  # arithmetic, as named
        return None
    return int(size)


def _scale(m: Match) -> float:
    return float(np.prod([m.const(name).reshape(-1)[0] for name in ("q_scale", "scale") if name in m.values]))


def _check(m: Match) -> str | None:
    if any(list(m.node(name).attrs.get("perm", [])) != perm for name, perm in PERMS.items()):
        return "not the sequence-first head Transposes (1,0,2) / (1,2,0) of torch's multi_head_attention_forward"
    sizes = {_head_size(m, x) for x in "qkv"}
    if None in sizes or len(sizes) != 1:
        return "a head split does not provably keep (S, B, E) -> (S, B*N, H) with one static H"
    if m["q"].shape[2] // next(iter(sizes)) < 2 or len({m[x].shape[2] for x in "qkv"}) != 1:
        return "fewer than two heads, or Q, K, V widths differ"
    if m.node("softmax").attrs.get("axis", -1) not in (-1, 2):
        return "Softmax is not over the keys"
    if any(name in m.values and m.const(name).size != 1 for name in ("q_scale", "scale")):
        return "a scale is not one value"
    bias = m.values.get("bias")
    if bias is not None and (bias.shape is None or len(bias.shape) != 3):
        return "the bias is not known as 3-D"
    return None


def _rewrite(m: Match):
    b, dtype, width = Builder(m), m.outputs[0].dtype, m["q"].shape[2]
    heads = width // _head_size(m, "q")
    q, k, v = (b("Transpose", m[x], perm=[1, 0, 2], dtype=dtype) for x in "qkv")
    bias = m.values.get("bias")
    if bias is not None:  # (B*N | 1, S', T') -> (B | 1, N | 1, S', T'), broadcast to (.., S, T) unless proven
        rows = rows_by_count(b, bias, b("Concat", b.dims(q, [0]), b.const([heads]), dtype=np.int64, shape=[2], axis=0))
        target = b("Concat", rows, b.dims(bias, [1, 2]), dtype=np.int64, shape=[4], axis=0)
        bias = b("Reshape", bias, target, dtype=bias.dtype)
        if not (same_dim(m["bias"].shape[1], m["q"].shape[0]) and same_dim(m["bias"].shape[2], m["k"].shape[0])):
            full = b("Concat", b.const([1, 1]), b.dims(q, [1]), b.dims(k, [1]), dtype=np.int64, shape=[4], axis=0)
            bias = b("Expand", bias, full, dtype=bias.dtype)
    y = b("MultiHeadAttention", q, k, v, None, None, bias, domain=CONTRIB_DOMAIN, num_heads=heads, scale=_scale(m),
          dtype=dtype)
    b("Reshape", b("Transpose", y, perm=[1, 0, 2], dtype=dtype), m["shape"], out=m.outputs[0],
      **dict(m.node("merge").attrs))
    return b.nodes


def _pattern(is_q_scaled: bool, is_scaled: bool, is_biased: bool):
    q = op.Mul(_heads("q"), const("q_scale"), name="q_scale") if is_q_scaled else _heads("q")
    s = op.MatMul(q, _heads("k"), name="qk")
    s = op.Mul(s, const("scale"), name="scale") if is_scaled else s
    s = op.Add(s, var("bias")) if is_biased else s
    ctx = op.MatMul(op.Softmax(s, name="softmax"), _heads("v"), name="pv")
    return op.Reshape(op.Transpose(ctx, name="to_seq"), var("shape"), name="merge")


RULES = tuple(Rule("attention_seq_first", _pattern(is_q_scaled, is_scaled, is_biased), _rewrite, _check)
              for is_q_scaled in (True, False) for is_scaled in (True, False) for is_biased in (True, False))
