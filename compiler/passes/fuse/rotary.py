"""Rotary position embedding (RoPE, non-interleaved "rotate_half" form) into one node.

  x (B,N,S,H) ─┬────────────────────────────────────────────► Mul(cos) ─┐
               ├─► Slice(H/2:) ─► Neg ─┐                                 ├─► Add ─►
               └─► Slice(:H/2) ────────┴─► Concat(-1) ─► Mul(sin) ───────┘
  cos, sin: (B,1,S,H) tables with provably equal halves, e.g. Unsqueeze(Cos(Concat(f, f)), 1)
    opset >= 23 ==> RotaryEmbedding(x, Cos(f), Sin(f))                      ONNX, caches (B,S,H/2)
    opset <  23 ==> com.microsoft RotaryEmbedding(x, ids, cos (B*S,H/2), sin): ids = arange(B*S) as
                    (B,S), so each token reads its own row; exact for any positions
  When x = Transpose(Reshape(x3 (B,S,N*H))) splits heads, the op runs on x3 (num_heads=N) and the
  heads are split after it, so the attention fusion can read (B,S,N*H) back without a Transpose.
"""

from __future__ import annotations

import numpy as np

from ...graph import CONTRIB_DOMAIN, const_value
from ..engine import Match, Rule
from ..pattern import op, var
from .attention_builder import Builder, same_dim, shape_of
from .attention_layout import split_source
from .rotary_tables import first_half, rotary_inputs, token_table

x = var("x")


def _last_axis_slice(m: Match, name: str, size: int) -> tuple[int, int] | None:
    values = [const_value(t) for t in m.node(name).inputs[1:]]
    if len(values) < 3 or any(v is None or v.size != 1 for v in values):
        return None
    start, end, axis, step = (int(v.reshape(-1)[0]) for v in values + [np.ones(1)] * (4 - len(values)))
    start, end = (min(max(i + size if i < 0 else i, 0), size) for i in (start, end))
    return (start, end) if axis in (-1, 3) and step == 1 else None


def _check(m: Match) -> str | None:
    dims = shape_of(m["x"], 4)
    if dims is None or not isinstance(dims[3], int) or dims[3] % 2:
        return "input is not 4-D (B, N, S, H) with a static even H"
    upper, lower, half = _last_axis_slice(m, "upper", dims[3]), _last_axis_slice(m, "lower", dims[3]), dims[3] // 2
    if m.node("rot").attrs.get("axis") not in (-1, 3) or upper != (half, 2 * half) or lower != (0, half):
        return "rotated input is not Concat(-x[..., H/2:], x[..., :H/2])"
    if np.dtype(m["x"].dtype) not in (np.float32, np.float16):
        return "input is not float32 or float16"
    tables = [token_table(m[name]) for name in ("cos", "sin")]
    if any(t is None or first_half(t) is None or t.dtype != m["x"].dtype for t in tables):
        return "cos/sin is not a (B, 1, S, H) table with two equal halves"
    if not all(same_dim(c, s) for c, s in zip(tables[0].shape[:2], tables[1].shape[:2])):
        return "cos and sin tables differ in shape"
    return None


def _rewrite(m: Match):
    b, head_size = Builder(m), m["x"].shape[3]
    x3 = split_source(m["x"])
    x3 = x3 if x3 is not None and isinstance(x3.shape[2], int) else None  # num_heads must be static
    src, token_axes = (m["x"], [0, 2]) if x3 is None else (x3, [0, 1])
    tables = [token_table(m[name]) for name in ("cos", "sin")]
    inputs = [src] + rotary_inputs(b, tables, src, token_axes, head_size // 2)
    attrs = {"interleaved": 0} if x3 is None else {"interleaved": 0, "num_heads": x3.shape[2] // head_size}
    y = b("RotaryEmbedding", *inputs, out=m.outputs[0] if x3 is None else None, dtype=src.dtype, shape=src.shape,
          domain=None if b.opset >= 23 else CONTRIB_DOMAIN, **attrs)
    if x3 is not None:  # heads split after the op, as the graph split them before it
        shape = [*src.shape[:2], attrs["num_heads"], head_size]
        y_BSNH = b("Reshape", y, b.const([0, 0, attrs["num_heads"], head_size]), dtype=y.dtype, shape=shape)
        b("Transpose", y_BSNH, out=m.outputs[0], perm=[0, 2, 1, 3])
    return b.nodes


_rotated = op.Concat(op.Neg(op.Slice(x, name="upper", allow_extra_inputs=True)),
                     op.Slice(x, name="lower", allow_extra_inputs=True), name="rot")
RULES = (Rule("rotary_embedding", op.Add(op.Mul(x, var("cos")), op.Mul(_rotated, var("sin"))), _rewrite, _check),)
