"""Layouts, and what the attention and rotary fusions must prove about shapes: equal dims, Reshapes
that keep the leading (B, S) dims, heads split from and merged back to (B, S, N*H)."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from .attention_builder import Builder, producer, same_dim, shape_of, transposed
from .attention_dims import DimOf, is_dim_of, shape_elements


def keeps_leading_dims(reshape: gs.Node, rank: int) -> bool:
    """Reshape(src, shape) provably gives a rank-`rank` tensor with src's first two dims."""
    src, out = reshape.inputs[0], reshape.outputs[0].shape
    elems, allowzero = shape_elements(reshape.inputs[1]), reshape.attrs.get("allowzero", 0)
    if (len(out) != rank) if out is not None else (len(elems) != rank):
        return False
    for axis in (0, 1):
        e, dim = elems[axis] if elems else None, src.shape[axis] if src.shape is not None else None
        if not (out is not None and same_dim(out[axis], dim) or is_dim_of(e, src, axis)
                or isinstance(e, int) and (e == 0 and not allowzero or same_dim(e, dim))):
            return False
    return True


def reshapes_to_own_shape(reshape: gs.Node, dims: list, aliases: dict[int, list[gs.Tensor]]) -> bool:
    """Reshape(x, shape) provably gives x back: x's dims are `dims` (ints or dim names where known), and
    each entry of the shape copies (0), equals the known dim, is a runtime dim of x, of a tensor in
    aliases[axis] (whose dim there equals x's) or of any tensor whose dim has the same name, is
    computed and named as the dim in the output by the shape walk, or is the one -1 left when all
    others are proven."""
    src, out = reshape.inputs[0].shape, reshape.outputs[0].shape
    if src is not None and out is not None and len(src) == len(out) == len(dims) \
            and all(same_dim(a, b) for a, b in zip(src, out)):
        return True  # inference proved it (a length the shape walk names on both sides: symbolic_lengths.py)
    elems, allowzero = shape_elements(reshape.inputs[1]), reshape.attrs.get("allowzero", 0)
    if len(elems) != len(dims):
        return False
    num_inferred = 0
    for axis, (e, dim) in enumerate(zip(elems, dims)):
        if isinstance(e, DimOf):
            named = e.tensor.shape[e.axis] if e.tensor.shape is not None else None
            if not (any(is_dim_of(e, t, axis) for t in [reshape.inputs[0], *aliases.get(axis, [])])
                    or same_dim(named, dim)):
                return False
        elif isinstance(e, gs.Tensor):  # computed (dynamo's arithmetic): proven where the shape walk named it
            if not (out is not None and len(out) == len(dims) and same_dim(out[axis], dim)):
                return False
        elif e == -1:
            num_inferred += 1
        elif not (e == 0 and not allowzero or isinstance(dim, int) and e == dim):
            return False
    return num_inferred <= 1


def _is_dims_of(elems: list, x: gs.Tensor, axes: list[int]) -> bool:
    """Shape entries that are provably x's dims at `axes` (its runtime dims, or static ones)."""
    return len(elems) == len(axes) and all(
        is_dim_of(e, x, a) or isinstance(e, int) and e > 0 and e == x.shape[a] for e, a in zip(elems, axes))


def unflattened_transpose(t: gs.Tensor) -> gs.Tensor | None:
    """x when t = Reshape(Transpose(Reshape(x (B,N,A,C), [-1, A, C]), (0, 2, 1)), [B, N, C, A]), that
    is t == Transpose(x, (0, 1, 3, 2)): torch's matmul with a transposed 4-D operand, exported in 3-D."""
    outer = producer(t)
    mid = producer(outer.inputs[0]) if outer is not None and outer.op == "Reshape" else None
    is_swap = mid is not None and mid.op == "Transpose" and list(mid.attrs.get("perm", [])) == [0, 2, 1]
    inner = producer(mid.inputs[0]) if is_swap else None
    if inner is None or inner.op != "Reshape" or shape_of(inner.inputs[0], 4) is None:
        return None
    x, flat = inner.inputs[0], shape_elements(inner.inputs[1])
    if flat[:1] != [-1] or not _is_dims_of(flat[1:], x, [2, 3]):
        return None
    return x if _is_dims_of(shape_elements(outer.inputs[1]), x, [0, 1, 3, 2]) else None


def head_dims(q: gs.Tensor, kt: gs.Tensor, v: gs.Tensor, scores: gs.Tensor | None = None) -> tuple[int, int] | None:
    """(N, H of v) of q (B,N,S,H), kt (B,N,H,T), v (B,N,T,H): static and equal where they must be.
    K and V may also have one head that the MatMuls broadcast over N query heads (multi-query
    attention exported without repeat_kv, as Falcon's): N then comes from q or the `scores`."""
    q, kt, v = (shape_of(t, 4) or [None] * 4 for t in (q, kt, v))
    s = (shape_of(scores, 4) if scores is not None else None) or [None] * 4
    queries = {d for d in (q[1], s[1]) if isinstance(d, int)}
    keys = {d for d in (kt[1], v[1]) if isinstance(d, int)}
    heads = queries or keys
    if len(heads) != 1 or not (isinstance(q[3], int) and q[3] == kt[2] and isinstance(v[3], int)):
        return None
    n = next(iter(heads))
    if any(k not in (n, 1) for k in keys) or not queries and keys == {1}:
        return None  # one K/V head under query heads of unknown count: broadcast or not is unknown
    return n, v[3]


def is_broadcast_head(t: gs.Tensor, num_heads: int) -> bool:
    """`t` (B, 1, .., ..) has the one K/V head that a MatMul broadcasts over `num_heads` query heads."""
    shape = shape_of(t, 4)
    return num_heads != 1 and shape is not None and shape[1] == 1


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
