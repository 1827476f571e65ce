"""Layouts, and what the attention and rotary fusions must prove about shapes: equal dims, Reshapes
that keep the leading (B, S) dims, heads split from and merged back to (B, S, N*H)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import const_value
from .attention_builder import Builder, producer, same_dim, shape_of, transposed


def shape_elements(t: gs.Tensor) -> list:
    """A 1-D shape tensor as ints (constants) and scalar tensors; [] when that is not known."""
    if const_value(t) is not None:
        return [int(v) for v in np.ravel(const_value(t))]
    node, out = producer(t), []
    for part in node.inputs if node is not None and node.op == "Concat" else []:
        inner = producer(part)
        if const_value(part) is not None:
            out += [int(v) for v in np.ravel(const_value(part))]
        elif inner is not None and inner.op == "Unsqueeze" and shape_of(inner.inputs[0], 0) is not None:
            out.append(inner.inputs[0])
        else:
            return []
    return out


def _is_dim_of(e: gs.Tensor, t: gs.Tensor, axis: int) -> bool:
    """`e` is Gather(Shape(t), axis): that runtime dim itself."""
    node = producer(e)
    shape = producer(node.inputs[0]) if node is not None and node.op == "Gather" else None
    index = const_value(node.inputs[1]) if shape is not None else None
    return (shape is not None and shape.op == "Shape" and shape.inputs[0] is t and not shape.attrs.get("start")
            and node.attrs.get("axis", 0) == 0 and index is not None and index.size == 1 and int(index) == axis)


def keeps_leading_dims(reshape: gs.Node, rank: int) -> bool:
    """Reshape(src, shape) provably gives a rank-`rank` tensor with src's first two dims."""
    src, out = reshape.inputs[0], reshape.outputs[0].shape
    elems, allowzero = shape_elements(reshape.inputs[1]), reshape.attrs.get("allowzero", 0)
    if (len(out) != rank) if out is not None else (len(elems) != rank):
        return False
    for axis in (0, 1):
        e, dim = elems[axis] if elems else None, src.shape[axis] if src.shape is not None else None
        if not (out is not None and same_dim(out[axis], dim) or isinstance(e, gs.Tensor) and _is_dim_of(e, src, axis)
                or isinstance(e, int) and (e == 0 and not allowzero or same_dim(e, dim))):
            return False
    return True


def head_dims(q: gs.Tensor, kt: gs.Tensor, v: gs.Tensor) -> tuple[int, int] | None:
    """(N, H of v) of q (B,N,S,H), kt (B,N,H,T), v (B,N,T,H): static and equal where they must be."""
    q, kt, v = (shape_of(t, 4) or [None] * 4 for t in (q, kt, v))
    heads = {d for d in (q[1], kt[1], v[1]) if isinstance(d, int)}
    if len(heads) != 1 or not (isinstance(q[3], int) and q[3] == kt[2] and isinstance(v[3], int)):
        return None
    return heads.pop(), v[3]


def reads_merged(reshape: gs.Node) -> bool:
    """Reshape(x (B,S,N,H), shape) equals Reshape(x as (B,S,N*H), shape): no 0 past the second entry
    of the shape copies a dim of x (allowzero, or those entries known and nonzero)."""
    tail = shape_elements(reshape.inputs[1])[2:]
    return bool(reshape.attrs.get("allowzero", 0)) or (tail != [] and all(isinstance(e, int) and e for e in tail))


def split_source(x_BNSH: gs.Tensor) -> gs.Tensor | None:
    """x3 (B, S, N*H) when x = Transpose(Reshape(x3, shape), (0, 2, 1, 3)) and the Reshape provably
    split only the last dim into heads, else None."""
    node = producer(x_BNSH)
    if node is None or node.op != "Transpose" or list(node.attrs.get("perm", [])) != [0, 2, 1, 3]:
        return None
    split = producer(node.inputs[0])
    if split is None or split.op != "Reshape" or shape_of(split.inputs[0], 3) is None:
        return None
    return split.inputs[0] if keeps_leading_dims(split, 4) else None


def merged_heads(b: Builder, x_BNSH: gs.Tensor) -> gs.Tensor:
    """x as (B, S, N*H): the tensor it was split from, else Transpose + Reshape(0, 0, -1)."""
    x3 = split_source(x_BNSH)
    if x3 is not None:
        return x3
    return b("Reshape", transposed(b, x_BNSH, [0, 2, 1, 3]), b.const([0, 0, -1]), dtype=x_BNSH.dtype)
