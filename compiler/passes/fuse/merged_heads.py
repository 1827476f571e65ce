"""Attention's batched MatMuls over merged batch and head axes made 4-D again, so the attention
fusion sees its usual form (Bloom: torch's baddbmm and bmm on (B*N, S, H) views).

  scores   Reshape(Add?(Mul|Div?(MatMul(Reshape(q4), Transpose(Reshape(k4), (0,2,1))), c), p3), (B, N, S, T))
       ==> Add?(Mul|Div?(MatMul(q4, Transpose(k4, (0,1,3,2))), c), p3 viewed as (B, N, ., .))
           or the factor on the keys, MatMul(Reshape(q4), Mul|Div(Transpose(Reshape(k4)), c)) (DeBERTa)
  context  Reshape(MatMul(Reshape(p4), Reshape(v4)), shape)  ==>  Reshape(MatMul(p4, v4), shape)

Exact: slice b*N + n of a 3-D product is slice (b, n) of the 4-D one, provided each flattening
Reshape provably merges exactly the first two axes of its 4-D input: its first entry is the graph's
own B * N (or -1 with the last two entries proven), as in the scores, whose final view provably
splits them back as (B, N). A 3-D bias p3 has 1 or B * N rows in every run where the 3-D Add
broadcasts: rows proven 1 or B * N (Bloom's ALiBi: slopes times key positions, (B*N, 1, T); rows made
as X * N, N > 1, are never 1) are viewed as (1, 1, ., .) or (B, N, ., .); rows not proven either way
(DeBERTa's relative scores, gathered along an index of the queries' rows) choose between the two by
their runtime count. One of rank 2 or less broadcasts the same way in 4-D as it is.

The probabilities p4 are the Softmax of the 4-D scores (B, N, S, T) after elementwise masking, whose
broadcasts only grow dims, so p4 is at least (B, N, S, T) in each dim; p4 flattened as (B*N, S, -1)
then times v4's merged (B*N, T, H) succeeds only where p4 is exactly (B, N, S, T), with T provably
both the keys' and the values' length; flattened as (-1, S, T) (DeBERTa) it has B'*N' rows, B' >= B and
N' >= N, which MatMul pairs with v4's B*N rows only where they are equal or B*N is 1 (v4 broadcast):
either way the 4-D product pairs the same rows. The graph's own final Reshape stays (its shape may read the
3-D context's dims, which the rewrite still gives).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import const_value
from ..engine import Match, Rule
from ..pattern import const, op, var
from .attention_builder import Builder, producer, same_dim, shape_of, transposed
from .attention_dims import DimOf, is_dim_of, scalar_dim, shape_elements

# ops that keep their first input's shape when the other is one constant value (or that have none)
SHAPE_KEEPING = {"Mul", "Div", "Add", "Sub", "Cast", "Neg"}


def _is(e, value: int) -> bool:
    """Shape entry `e` is the constant `value` (entries may be tensors, whose == compares names)."""
    return isinstance(e, (int, np.integer)) and e == value


def _is_dim(e, x: gs.Tensor, axis: int) -> bool:
    """Shape entry (int or DimOf) `e` is provably `x`'s dim at `axis`."""
    dim = x.shape[axis] if x.shape is not None else None
    if isinstance(e, (int, np.integer)):
        return e > 0 and isinstance(dim, (int, np.integer)) and e == dim
    if isinstance(e, DimOf):
        named = e.tensor.shape[e.axis] if e.tensor.shape is not None else None
        return is_dim_of(e, x, axis) or same_dim(named, dim)
    return False


def _entry_is_dim(reshape: gs.Node, i: int, x: gs.Tensor, axis: int) -> bool:
    """Entry i of the Reshape's shape is provably x's dim at `axis`: read back as that dim, or computed
    (dynamo's arithmetic) and named so in the Reshape's output by the shape walk, which evaluated it."""
    elems, out = shape_elements(reshape.inputs[1]), reshape.outputs[0].shape
    if i >= len(elems):
        return False
    if _is_dim(elems[i], x, axis):
        return True
    return out is not None and len(out) == len(elems) and not _is(elems[i], -1) and x.shape is not None \
        and same_dim(out[i], x.shape[axis])


def _scalar(t: gs.Tensor):
    value = const_value(t)
    if value is not None:
        return int(value.reshape(-1)[0]) if value.size == 1 and value.dtype.kind in "iu" else None
    return scalar_dim(t)


def _is_heads_product(e, x: gs.Tensor) -> bool:
    """Shape entry `e` is x's dim 0 times its dim 1: a constant, or Mul(dim 0, dim 1) in the graph."""
    d0, d1 = x.shape[0], x.shape[1]
    if isinstance(e, (int, np.integer)):
        return isinstance(d0, (int, np.integer)) and isinstance(d1, (int, np.integer)) and e == d0 * d1 > 0
    node = producer(e) if isinstance(e, gs.Tensor) else None
    if node is None or node.op != "Mul" or len(node.inputs) != 2:
        return False
    f = [_scalar(t) for t in node.inputs]
    return any(_is_dim(a, x, 0) and _is_dim(b, x, 1) for a, b in (f, f[::-1]))


def _same_entry(a, b) -> bool:
    """Two shape entries that are one value: one tensor, one runtime dim, or equal constants."""
    if isinstance(a, DimOf) and isinstance(b, DimOf):
        return a.tensor is b.tensor and a.axis == b.axis
    if isinstance(a, (int, np.integer)) or isinstance(b, (int, np.integer)):
        return isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)) and a == b
    return a is b


def first_entry(reshape: gs.Node):
    elems = shape_elements(reshape.inputs[1])
    return elems[0] if elems else None


def merges_first_two(reshape: gs.Node, x: gs.Tensor, partner_rows=None) -> bool:
    """Reshape(x (A, B, C, D), shape) provably gives (A*B, C, D). With `partner_rows`, the first
    entry may also be the one that flattens the other operand of the same batched MatMul (proven
    to be its A*B): the keys and values of an attention share its queries' batch A."""
    elems = shape_elements(reshape.inputs[1])
    if shape_of(x, 4) is None or len(elems) != 3:
        return False
    tail = [_entry_is_dim(reshape, i, x, i + 1) for i in (1, 2)]
    if _is_heads_product(elems[0], x) or partner_rows is not None and _same_entry(elems[0], partner_rows):
        return all(tail) or sum(tail) == 1 and any(_is(e, -1) for e in elems[1:])
    return _is(elems[0], -1) and all(tail)


def splits_first(reshape: gs.Node, x: gs.Tensor, rows: tuple[gs.Tensor, int], cols: tuple[gs.Tensor, int]) -> bool:
    """Reshape(y (A*B, R, C), shape) provably gives (A, B, R, C), A and B x's first dims; R and C are
    the dims of `rows` and `cols` (tensor, axis). A -1 first entry is A when the other three are proven."""
    elems = shape_elements(reshape.inputs[1])
    if len(elems) != 4 or not _is_dim(elems[1], x, 1):
        return False
    tail = [_entry_is_dim(reshape, i, t, axis) for i, (t, axis) in ((2, rows), (3, cols))]
    if _is(elems[0], -1):  # (-1, B, R, C) of A*B*R*C elements: A (DeBERTa's view(-1, heads, ...))
        return all(tail)
    return _is_dim(elems[0], x, 0) and (all(tail) or sum(tail) == 1 and any(_is(e, -1) for e in elems[2:]))


def _bias_rows(t: gs.Tensor, x: gs.Tensor) -> str | None:
    """How a 3-D bias's rows map to (B, N): "one" (it broadcasts), "heads" (B * N of them, in x's
    order), else None. Read through shape-keeping elementwise ops to the Reshape that made it."""
    shape = shape_of(t, 3)
    if shape is not None and same_dim(shape[0], 1):
        return "one"
    if shape is not None and _is_heads_product(shape[0], x):
        return "heads"
    node = producer(t)
    while node is not None and node.op in SHAPE_KEEPING:
        others = [i for i in node.inputs[1:] if const_value(i) is None or const_value(i).size != 1]
        if others:
            return None
        node = producer(node.inputs[0])
    elems = shape_elements(node.inputs[1]) if node is not None and node.op == "Reshape" else []
    if len(elems) != 3:
        return None
    return "one" if _is(elems[0], 1) else "heads" if _is_heads_product(elems[0], x) or _has_factor(elems[0], x.shape[1]) \
        else None


def _has_factor(e, heads) -> bool:
    """Shape entry `e` is Mul(something, heads) with heads > 1: then it is never 1, so where the bias
    broadcasts against the (B*N)-row scores at all, it has their B*N rows."""
    node = producer(e) if isinstance(e, gs.Tensor) else None
    if node is None or node.op != "Mul" or not isinstance(heads, (int, np.integer)) or heads < 2:
        return False
    return any(_is(_scalar(t), int(heads)) for t in node.inputs)


def _same_length(a: gs.Tensor, a_axis: int, b: gs.Tensor, axis: int) -> bool:
    """a along `a_axis` and b along `axis` provably have the same size: a named or static dim, or
    both Concats along that axis of parts that do (the keys and values of a past-KV cache)."""
    if a.shape is not None and b.shape is not None and len(a.shape) > a_axis and len(b.shape) > axis \
            and same_dim(a.shape[a_axis], b.shape[axis]):
        return True
    if a_axis != axis:
        return False
    na, nb = producer(a), producer(b)
    if na is None or nb is None or na.op != "Concat" or nb.op != "Concat" or len(na.inputs) != len(nb.inputs):
        return False
    rank = len(a.shape) if a.shape is not None else None
    if rank is None or {na.attrs.get("axis") % rank, nb.attrs.get("axis") % rank} != {axis}:
        return False
    return all(_same_length(x, axis, y, axis) for x, y in zip(na.inputs, nb.inputs))


ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Where", "Tanh", "Not", "Cast"}


def _scores_product(p: gs.Tensor) -> gs.Node | None:
    """The 4-D Q·Kᵀ MatMul that Softmax(elementwise ops of it) = p reads, when p is that (or its NaN
    guard Where(IsNaN(p), 0, p), which keeps its shape)."""
    node = producer(p)
    guarded = producer(node.inputs[0]) if node is not None and node.op == "Where" else None
    if guarded is not None and guarded.op == "IsNaN" and guarded.inputs[0] is node.inputs[2]:
        node = producer(node.inputs[2])
    if node is None or node.op != "Softmax":
        return None
    stack, seen = [node.inputs[0]], set()
    while stack:
        node = producer(stack.pop())
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.op == "MatMul" and shape_of(node.outputs[0], 4) is not None:
            return node
        if node.op in ELEMENTWISE:
            stack.extend(t for t in node.inputs if const_value(t) is None)
    return None


def _check_scores(m: Match) -> str | None:
    q, k = m["a4"], m["b4"]
    if shape_of(q, 4) is None or shape_of(k, 4) is None:
        return "operands are not views of 4-D tensors"
    if not isinstance(q.shape[1], (int, np.integer)) or k.shape[1] != q.shape[1]:
        return "operands do not have the same static head count"
    if not merges_first_two(m.node("a_flat"), q) or \
            not merges_first_two(m.node("b_flat"), k, partner_rows=first_entry(m.node("a_flat"))):
        return "a flattening Reshape does not provably merge the first two axes"
    if list(m.node("b_swap").attrs.get("perm", [])) != [0, 2, 1]:
        return "the keys' Transpose is not (0, 2, 1)"
    if any(name in m.values and m.const(name).size != 1 for name in ("scale", "k_scale")):
        return "the scores' factor is not one value"
    bias = m.values.get("bias3")
    if bias is not None and (bias.shape is None or len(bias.shape) > 3):
        return "the bias's rank is not known as 3 or less"
    if not splits_first(m.node("view"), q, (q, 2), (k, 2)):
        return "the 4-D view does not provably split the first axis back into the operands' (B, N)"
    return None


def _rewrite_scores(m: Match):
    build, q, k = Builder(m), m["a4"], m["b4"]
    kt, dtype, out = transposed(build, k, [0, 1, 3, 2]), m.outputs[0].dtype, m.outputs[0]
    if "k_scale" in m.values:
        kt = build(m.node("k_scale").op, kt, m["k_scale"], dtype=kt.dtype, shape=kt.shape)
    steps = [("product", "MatMul", [q, kt])]
    if "scale" in m.values:
        steps.append(("scale", m.node("scale").op, [m["scale"]]))
    bias = m.values.get("bias3")
    if bias is not None:
        if len(bias.shape) == 3:  # (B*N | 1, R, C) -> (B, N, R, C) | (1, 1, R, C)
            rows = _bias_view_rows(build, bias, q)
            target = build("Concat", rows, build.dims(bias, [1, 2]), dtype=np.int64, shape=[4], axis=0)
            bias = build("Reshape", bias, target, dtype=bias.dtype)
        steps.append(("biased", "Add", [bias]))
    y, scores_shape, scores_4d = None, [q.shape[0], q.shape[1], q.shape[2], k.shape[2]], {}
    for i, (name, op_type, args) in enumerate(steps):  # the last writes the view's output
        is_last = i == len(steps) - 1
        y = build(op_type, *([] if y is None else [y]), *args, dtype=dtype, out=out if is_last else None,
                  shape=None if is_last else scores_shape)
        scores_4d[name] = y
    _keep_exposed(build, m, scores_4d)
    return build.nodes


def _keep_exposed(build: Builder, m: Match, scores_4d: dict) -> None:
    """Interior values read outside the match (TorchScript reads the 3-D scores' sizes for the view;
    DeBERTa's relative scores multiply the 3-D queries again): the flattening nodes stay as they
    were, the 3-D scores become views of the 4-D ones (same elements, same order)."""
    for name, (exposed, *_) in m.exposed.items():
        node = m.node(name)
        if name in scores_4d:
            scores = scores_4d[name]
            flat = build("Concat", build.const([-1]), build.dims(scores, [2, 3]), dtype=np.int64, shape=[3], axis=0)
            build("Reshape", scores, flat, out=exposed)
        else:
            build(node.op, *node.inputs, out=exposed, domain=node.domain, **dict(node.attrs))


def _bias_view_rows(build: Builder, bias: gs.Tensor, q: gs.Tensor) -> gs.Tensor:
    """The first two dims of the 3-D bias viewed in 4-D: (B, N) or (1, 1) where its rows are proven,
    else chosen at runtime by whether it has one row (the Add broadcast allows only 1 or B * N)."""
    rows = _bias_rows(bias, q)
    if rows is not None:
        return build.dims(q, [0, 1]) if rows == "heads" else build.const([1, 1])
    return rows_by_count(build, bias, build.dims(q, [0, 1]))


def rows_by_count(build: Builder, bias: gs.Tensor, batch_heads: gs.Tensor) -> gs.Tensor:
    """(1, 1) where the 3-D bias has one row, else `batch_heads` (B, N): a (B*N)-row Add allows no other."""
    is_one = build("Equal", build.dims(bias, [0]), build.const([1]), dtype=np.bool_, shape=[1])
    return build("Where", is_one, build.const([1, 1]), batch_heads, dtype=np.int64, shape=[2])


def _key_length(keys: gs.Tensor) -> tuple[gs.Tensor, int] | None:
    """Where the length T of Q·Kᵀ's second operand (B, N, H, T) comes from: (tensor, axis) through a
    Transpose (perm[3]), possibly after one constant factor (DeBERTa scales the keys)."""
    node = producer(keys)
    if node is not None and node.op in ("Mul", "Div") and len(node.inputs) == 2:
        factors = [const_value(t) for t in node.inputs]
        scaled = [t for t, v in zip(node.inputs, factors) if v is None]
        is_scalar = len(scaled) == 1 and all(v.size == 1 for v in factors if v is not None)
        node = producer(scaled[0]) if is_scalar and (node.op == "Mul" or factors[1] is not None) else None
    perm = list(node.attrs.get("perm", [])) if node is not None and node.op == "Transpose" else []
    return (node.inputs[0], perm[3]) if len(perm) == 4 else None


def _check_context(m: Match) -> str | None:
    p, v, view = m["a4"], m["b4"], m.node("view")
    if shape_of(p, 4) is None or shape_of(v, 4) is None or not isinstance(v.shape[1], (int, np.integer)):
        return "operands are not views of 4-D tensors with a static head count"
    if not merges_first_two(m.node("b_flat"), v, partner_rows=first_entry(m.node("a_flat"))):
        return "the values' Reshape does not provably merge the first two axes"
    scores = _scores_product(p)
    if scores is None or scores.outputs[0].shape[1] != v.shape[1]:
        return "the probabilities are not a Softmax of elementwise ops of 4-D scores with the values' heads"
    key_length = _key_length(scores.inputs[1])  # T must be the values' length
    if key_length is None or not _same_length(*key_length, v, 2):
        return "the keys' length is not provably the values'"
    s = scores.outputs[0]
    elems = shape_elements(m.node("a_flat").inputs[1])
    flat = m.node("a_flat")
    is_rows = len(elems) == 3 and _entry_is_dim(flat, 1, s, 2)
    if not (is_rows and (_is_heads_product(elems[0], s) and _is(elems[2], -1) or _is(elems[0], -1) and _entry_is_dim(flat, 2, s, 3))):
        return "the probabilities' Reshape is not provably (B * N, S, -1) or (-1, S, T) of the scores' dims"
    if not view.attrs.get("allowzero", 0) and any(_is(e, 0) for e in shape_elements(view.inputs[1]) or [0]):
        return "the context's Reshape may copy a dim of its 3-D input (a 0 entry)"
    return None


def _rewrite_context(m: Match):
    build, view = Builder(m), m.node("view")
    product = build("MatMul", m["a4"], m["b4"], dtype=m.outputs[0].dtype)
    if "product" in m.exposed:  # its dims feed shape arithmetic (TorchScript): the 3-D context, from the 4-D one
        flat = build("Concat", build.const([-1]), build.dims(product, [2, 3]), dtype=np.int64, shape=[3], axis=0)
        build("Reshape", product, flat, out=m.exposed["product"][0], dtype=product.dtype)
    build("Reshape", product, view.inputs[1], out=m.outputs[0], dtype=product.dtype, **dict(view.attrs))
    return build.nodes


def _pattern(keys_swapped: bool, scaled: bool = False, biased: bool = False, keys_scaled: bool = False):
    flat_b = op.Reshape(var("b4"), var("b_shape"), name="b_flat")
    b = op.Transpose(flat_b, name="b_swap") if keys_swapped else flat_b
    b = op.any("Mul", "Div")(b, const("k_scale"), name="k_scale") if keys_scaled else b
    y = op.MatMul(op.Reshape(var("a4"), var("a_shape"), name="a_flat"), b, name="product")
    y = op.any("Mul", "Div")(y, const("scale"), name="scale") if scaled else y
    y = op.Add(y, var("bias3"), name="biased") if biased else y
    return op.Reshape(y, var("view_shape"), name="view")


SCORES = tuple(Rule("merged_heads_scores", _pattern(True, scaled, biased, keys_scaled), _rewrite_scores, _check_scores,
                    exposed=("a_flat", "b_flat", "b_swap", "k_scale", "product", "scale", "biased"))
               for scaled, keys_scaled in ((True, False), (False, True), (False, False)) for biased in (True, False))
# after SCORES (a later step): the context rule finds the 4-D scores behind the probabilities
CONTEXT = (Rule("merged_heads_context", _pattern(False), _rewrite_context, _check_context, exposed=("product",)),)
