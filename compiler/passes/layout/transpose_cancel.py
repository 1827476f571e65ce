"""Two Transposes in a row become one with the composed perm, or an Identity when they cancel.

    x ─► Transpose(p) ─► Transpose(q) ─►   ==>   x ─► Transpose(r) ─►    r[i] = p[q[i]]
                                           ==>   x ─► Identity ─►        when r is the identity
The Identity is left for the no-op pass, which knows how to bypass it without losing a graph output
name. When the first Transpose has other consumers it is rebuilt for them (dead code otherwise), so
the pair still merges: the second one then reads x directly.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ..engine import Match, Rule
from ..pattern import op, var


def _perm(node: gs.Node, rank: int | None) -> list[int] | None:
    perm = node.attrs.get("perm")
    if perm is not None:
        return [int(p) for p in perm]
    return list(range(rank))[::-1] if rank is not None else None  # ONNX default: reverse the dims


def _perms(m: Match):
    shape = m["x"].shape
    rank = len(shape) if shape is not None else None
    return _perm(m.node("first"), rank), _perm(m.root, rank)


def _check(m: Match) -> str | None:
    p, q = _perms(m)
    if p is None or q is None:
        return "perm omitted and rank unknown"
    return None if len(p) == len(q) else "perm lengths differ"


def _rewrite(m: Match):
    first = m.node("first")
    p, q = _perms(m)
    composed = [p[i] for i in q]
    rebuilt = gs.Node("Transpose", attrs=dict(first.attrs), inputs=[m["x"]], outputs=m.exposed["first"])
    if composed == list(range(len(composed))):
        return [rebuilt, gs.Node("Identity", inputs=[m["x"]], outputs=m.outputs)]
    return [rebuilt, gs.Node("Transpose", attrs={"perm": composed}, inputs=[m["x"]], outputs=m.outputs)]


RULES = (
    Rule("cancel_transpose_pair", op.Transpose(op.Transpose(var("x"), name="first")), _rewrite, _check,
         exposed=("first",)),
)
