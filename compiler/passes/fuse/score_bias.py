"""Attention scores with a position bias beside the mask, rearranged into the one additive mask the
attention fusion takes (passes/fuse/attention.py: MatMul -> scale -> [Where] -> [Add(mask)] -> Softmax).

  Softmax(Where(c, fill, x))            ==> Softmax(Where(Not(c), x, fill))        torch's masked_fill
  Softmax(Where(c, Add(s, p), fill))    ==> Softmax(Add(Where(c, s, fill), p))     MPT's ALiBi, then the mask
  Softmax(Add(Add(s, p), mask))         ==> Softmax(Add(s, Add(p, mask)))          Bloom's ALiBi, then the mask
  Where(c, 0, Softmax(Where(c, fill, x)))  ==> Where(IsNaN(p), 0, p), p = Softmax(Where(c, -inf, x))   XSoftmax

s is the scores (a MatMul, or its scaling by one constant); fill is one constant at or below -1e30,
which absorbs any real p (fill + p == fill), so the second form is exact. The third adds p and mask
first: exact where the mask holds 0 or a fill, as causal masks do; an additive mask of other values
differs by one rounding of a score. The fourth is DeBERTa's XSoftmax (SEW-D): a row with any
unmasked entry gives exactly 0 at masked entries either way (exp(fill - max) underflows), and a row
masked entirely is uniform under the finite fill, zeroed by the outer Where, and NaN under -inf,
zeroed by the guard, the form torch's SDPA export has and the attention fusion takes.
"""

from __future__ import annotations

import numpy as np

from ...graph import const_value
from ..engine import Match, Rule
from ..pattern import const, op, var
from .attention_builder import Builder, producer

FILL_AT_MOST = -1e30  # as the attention fusion's Where fill
SCORE_PRODUCTS = {"MatMul", "FusedMatMul"}


def _is_scores(t) -> bool:
    """A Q·Kᵀ product, or its scaling by one constant."""
    node = producer(t)
    if node is not None and node.op in ("Mul", "Div") and len(node.inputs) == 2:
        factors = [const_value(i) for i in node.inputs]
        scaled = [i for i, v in zip(node.inputs, factors) if v is None]
        node = producer(scaled[0]) if len(scaled) == 1 and all(v.size == 1 for v in factors if v is not None) else None
    return node is not None and node.op in SCORE_PRODUCTS


def _reads_scores(t) -> bool:
    """Scores, or scores plus something."""
    node = producer(t)
    return _is_scores(t) or node is not None and node.op == "Add" and any(_is_scores(i) for i in node.inputs)


def _is_fill(m: Match) -> bool:
    fill = m.const("fill")
    return fill is not None and fill.size == 1 and float(fill.reshape(-1)[0]) <= FILL_AT_MOST


def _check_fill_first(m: Match) -> str | None:
    if not _is_fill(m):
        return "the Where's first branch is not one fill value at or below -1e30"
    return None if _reads_scores(m["x"]) else "the Where does not mask scores"


def _check_where_bias(m: Match) -> str | None:
    if not _is_fill(m):
        return "the Where's fill is not one value at or below -1e30"
    return None if _is_scores(m["s"]) and not _is_scores(m["p"]) else "the Where does not mask scores plus a bias"


def _check_two_adds(m: Match) -> str | None:
    if not _is_scores(m["s"]) or _is_scores(m["p"]) or _is_scores(m["mask"]):
        return "not scores plus a bias plus a mask"
    return None


def _check_zeroed_softmax(m: Match) -> str | None:
    zero = m.const("zero")
    if m["c"] is not m["c_in"]:
        return "the probabilities are zeroed by another mask than the scores'"
    if zero is None or zero.size != 1 or float(zero.reshape(-1)[0]) != 0 or not _is_fill(m):
        return "not a fill at or below -1e30 and zeroed probabilities"
    return None if _reads_scores(m["x"]) else "the Where does not mask scores"


def _guarded_softmax(m: Match):
    b, dtype, softmax = Builder(m), m["x"].dtype, m.node("softmax")
    filled = b("Where", m["c"], b.const(-np.inf, dtype), m["x"], dtype=dtype)
    p = b("Softmax", filled, dtype=dtype, shape=softmax.outputs[0].shape, **dict(softmax.attrs))
    out = b("Where", b("IsNaN", p, dtype=np.bool_), m["zero"], p, out=m.outputs[0], dtype=dtype)
    if softmax.outputs[0].shape is not None:  # the guard keeps p's shape (the old Where's may be less known)
        out.shape = list(softmax.outputs[0].shape)
    return b.nodes


def _softmax(b: Builder, m: Match, x):
    return b("Softmax", x, out=m.outputs[0], dtype=m.outputs[0].dtype, **dict(m.root.attrs))


def _fill_first(m: Match):
    b = Builder(m)
    keep = b("Not", m["c"], dtype=np.bool_, shape=m["c"].shape)
    _softmax(b, m, b("Where", keep, m["x"], m["fill"], dtype=m["x"].dtype))
    return b.nodes


def _bias_after_where(m: Match):
    b, dtype = Builder(m), m["s"].dtype
    _softmax(b, m, b("Add", b("Where", m["c"], m["s"], m["fill"], dtype=dtype), m["p"], dtype=dtype))
    return b.nodes


def _bias_with_mask(m: Match):
    b, dtype = Builder(m), m["s"].dtype
    _softmax(b, m, b("Add", m["s"], b("Add", m["p"], m["mask"], dtype=dtype), dtype=dtype))
    return b.nodes


# a step of its own before RULES: their masked_fill rule would take the inner Softmax first
ZEROED = (Rule("xsoftmax_as_nan_guard", op.Where(var("c"), const("zero"), op.Softmax(
    op.Where(var("c_in"), const("fill"), var("x")), name="softmax")), _guarded_softmax, _check_zeroed_softmax),)

RULES = (
    Rule("masked_fill_as_where", op.Softmax(op.Where(var("c"), const("fill"), var("x"))), _fill_first, _check_fill_first),
    Rule("bias_after_mask", op.Softmax(op.Where(var("c"), op.Add(var("s"), var("p")), const("fill"))),
         _bias_after_where, _check_where_bias),
    Rule("bias_into_mask", op.Softmax(op.Add(op.Add(var("s"), var("p")), var("mask"))), _bias_with_mask, _check_two_adds),
)
