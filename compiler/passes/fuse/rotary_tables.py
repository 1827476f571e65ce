"""The cos/sin inputs of the fused rotary op, read back from the graph's (B, 1, S, H) tables: their
per-token (B, S, H) source under the Unsqueeze, the first half of a table whose halves are equal
by construction (Cos(Concat(f, f)) -> Cos(f)), and the caches and position ids each op wants."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import const_value
from .attention_builder import Builder, producer, same_dim, shape_of

# Elementwise ops that commute with taking the first half of the last axis.
UNARY = frozenset({"Cos", "Sin", "Cast", "Neg", "Identity"})
WITH_SCALAR = frozenset({"Mul", "Div", "Add", "Sub"})


def token_table(t: gs.Tensor) -> gs.Tensor | None:
    """The (B, S, H) table when `t` = Unsqueeze(table, axis 1), else None."""
    node = producer(t)
    if node is None or node.op != "Unsqueeze" or shape_of(node.inputs[0], 3) is None:
        return None
    axes = const_value(node.inputs[1]) if len(node.inputs) > 1 else node.attrs.get("axes")
    return node.inputs[0] if axes is not None and [int(a) for a in np.ravel(axes)] in ([1], [-3]) else None


def first_half(t: gs.Tensor, b: Builder | None = None) -> gs.Tensor | None:
    """The first half of `t`'s last axis when `t` is Concat(f, f) under elementwise ops (Cos, Sin,
    Cast, a scalar factor): built with `b`, only looked up without. None when not provable."""
    node = producer(t)
    index = 0 if node is not None and node.op in UNARY else None
    if node is not None and node.op == "Concat" and len(node.inputs) == 2 and node.inputs[0] is node.inputs[1]:
        rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
        return node.inputs[0] if rank is not None and node.attrs.get("axis") in (-1, rank - 1) else None
    if node is not None and node.op in WITH_SCALAR and len(node.inputs) == 2:
        sizes = [getattr(const_value(i), "size", None) for i in node.inputs]
        index = sizes.index(None) if sizes.count(None) == 1 and 1 in sizes else None
    inner = first_half(node.inputs[index], b) if index is not None else None
    if inner is None or b is None:
        return inner
    inputs = list(node.inputs)
    inputs[index] = inner
    return b(node.op, *inputs, dtype=t.dtype, shape=inner.shape, **dict(node.attrs))


def rotary_inputs(b: Builder, tables: list[gs.Tensor], x: gs.Tensor, token_axes: list[int], half: int):
    """After x: (cos, sin) as (B, S, H/2) for the ONNX op, else (ids, cos, sin) for the contrib op,
    whose caches are the tables' rows as (B*S, H/2) and ids = arange(B*S) as (B, S)."""
    is_per_token = all(same_dim(tables[0].shape[i], x.shape[a]) for i, a in enumerate(token_axes))
    cos, sin = (first_half(t, b) for t in tables)
    if b.opset >= 23:
        if not is_per_token:  # broadcast over batch or sequence: the ONNX op wants (B, S, H/2)
            target = b("Concat", b.dims(x, token_axes), b.const([half]), axis=0, dtype=np.int64)
            cos, sin = (b("Expand", t, target, dtype=t.dtype) for t in (cos, sin))
        return [cos, sin]
    tokens = b.dims(cos, [0, 1])
    num_tokens = b("ReduceProd", tokens, keepdims=0, dtype=np.int64)
    ids = b("Reshape", b("Range", b.const(0), num_tokens, b.const(1), dtype=np.int64), tokens, dtype=np.int64)
    if not is_per_token:  # every token still reads its own row
        ids = b("Expand", ids, b.dims(x, token_axes), dtype=np.int64)
    return [ids] + [b("Reshape", t, b.const([-1, half]), dtype=t.dtype) for t in (cos, sin)]
