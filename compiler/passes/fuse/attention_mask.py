"""The attention fusion's mask: the graph's own masking turned into the additive bias that both ORT
attention ops take, so any mask the graph computes stays exact."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..engine import Match
from .attention_builder import Builder, same_dim, shape_of


def attention_bias(b: Builder, m: Match, q_dims: tuple, k_dims: tuple, is_onnx: bool) -> gs.Tensor | None:
    """Where(cond, 0, fill) + mask for scores Add(Where(cond, s, fill), mask) (either part optional):
    s + Where(cond, 0, fill) == Where(cond, s, fill) since fill (-inf or <= -1e30) absorbs s. Then
    broadcast to (.., S, T), S and T read from `q_dims`/`k_dims` (tensor, axis): both ORT ops reject
    a mask row or column of 1 that the graph's Add broadcast. No Expand when the shape proves it.
    A row masked entirely by -inf gives NaN in the graph and zeros in ORT's ONNX Attention."""
    parts, dtype = [m["mask"]] if "mask" in m.values else [], m.node("softmax").outputs[0].dtype
    if "cond" in m.values:
        parts.insert(0, b("Where", m["cond"], b.const(0, m["fill"].dtype), m["fill"], dtype=dtype))
    if not parts:
        return None
    bias = parts[0] if len(parts) == 1 else b("Add", *parts, dtype=dtype)
    if is_onnx:  # ORT's Attention zeroes a row whose max is exactly lowest(). Entries below L = -1e30
        # absorb any real score, lose to any entry above L, and among themselves only their order
        # counts: (b + L) / 2 keeps that order and keeps them below L, but far from lowest().
        limit = b.const(-1e30, dtype)
        squeezed = b("Mul", b("Add", bias, limit, dtype=dtype), b.const(0.5, dtype), dtype=dtype)
        bias = b("Where", b("Less", bias, limit, dtype=np.bool_), squeezed, bias, dtype=dtype)
    shape = shape_of(bias, 4)
    if shape is not None and same_dim(shape[2], m["q"].shape[2]) and same_dim(shape[3], m["kt"].shape[3]):
        return bias
    target = b("Concat", b.const([1, 1]), b.dims(q_dims[0], [q_dims[1]]), b.dims(k_dims[0], [k_dims[1]]),
               dtype=np.int64, shape=[4], axis=0)
    return b("Expand", bias, target, dtype=dtype)
