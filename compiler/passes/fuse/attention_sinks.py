"""Attention with sinks (gpt-oss): a learned logit per head joins every row's softmax, then leaves.

  scores ─► [scale, mask as attention.py] ─► Concat(·, Expand(sinks (N,), (B, N, S, 1)), axis=-1) ─┐
        ┌─ Sub(·, ReduceMax(·, axis=-1)) ◄──────────────────────────────────────────────────────┘
        └─► Softmax ─► Slice(0 : -1 on the last axis) ─► MatMul ◄─ v
  ==> Attention(q, k, v, mask, scale) with sinks=[N floats]   (decoder builds only: PAGED_RULES)

  softmax over [s_0 .. s_T-1, sink] with the sink's column dropped is softmax(s) whose denominator
  gains exp(sink): infc.PagedAttention's `sinks` attribute. The peak shift does not change a
  softmax. Neither the ONNX Attention op nor MultiHeadAttention has sinks, so only a paged graph,
  where canonicalize.py replaces the node before anything runs it, may hold this one.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ...graph import const_value
from ..engine import Match, Rule
from .attention import _check, _pattern, _rewrite, head_dims, _scores

LAST_AXIS = (-1, 3)


def _last_axis_reduce(m: Match) -> bool:
    peak = m.node("peak")
    axes = peak.attrs.get("axes") if len(peak.inputs) < 2 else const_value(peak.inputs[1])  # opset 18: an input
    return axes is not None and np.asarray(axes).reshape(-1).tolist() in ([-1], [3]) and peak.attrs.get("keepdims", 1) == 1


def _drops_last_column(m: Match) -> bool:
    starts, ends, axes = (m.const(n).reshape(-1).tolist() for n in ("sink_starts", "sink_ends", "sink_axes"))
    steps = m.node("drop_sink").inputs[4:]
    is_unit = not steps or steps[0].is_empty() or np.asarray(const_value(steps[0])).reshape(-1).tolist() == [1]
    return starts == [0] and ends == [-1] and axes[0] in LAST_AXIS and len(axes) == 1 and is_unit


def _sinks(m: Match) -> np.ndarray | None:
    sinks, dims = m.const("sinks"), head_dims(m["q"], m["kt"], m["v"], _scores(m))
    if dims is None or sinks is None or sinks.size != dims[0] or sinks.ndim not in (1, 4):
        return None
    return sinks.reshape(-1).astype(np.float32) if sinks.ndim == 1 or sinks.shape[1] == sinks.size else None


def _check_sinks(m: Match) -> str | None:
    if m.node("joined").attrs.get("axis") not in LAST_AXIS:
        return "sinks are not concatenated as the scores' last column"
    if not _last_axis_reduce(m):
        return "the peak shift is not a ReduceMax over the last axis"
    if not _drops_last_column(m):
        return "the sink column is not sliced off the probabilities (Slice 0 : -1 on the last axis)"
    if _sinks(m) is None:
        return "sinks are not one constant per query head"
    return _check("paged", m)


def _rewrite_sinks(m: Match):
    nodes = _rewrite("paged", m)
    attention = next(n for n in nodes if n.op == "Attention")
    attention.attrs["sinks"] = [float(x) for x in _sinks(m)]
    return nodes


PAGED_RULES = tuple(
    Rule("attention_paged_sinks", _pattern("paged", scaled, mask, False, has_sinks=True), _rewrite_sinks, _check_sinks,
         any_opset=True)
    for scaled in ("scores", "split", "none") for mask in ("where_add", "add", "where", "none"))
