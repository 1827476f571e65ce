"""Lengths in one canonical form, base // q + c (base a named dim or a parenthesized form, q >= 1),
written as onnx dim names (`len//20-1`, `(len//20+1)//2-1`): closed under what convolutions, pools and
exporters do to lengths, adding a constant and floor division by s ((base // q + c) // s ==
base // (q * s) + c / s where s divides c; otherwise the remainder of c stays inside parentheses).
Sizes are non-negative in any run that works, so int64 Div's truncation is floor division here.
See symbolic_lengths.py for why.
"""

from __future__ import annotations

import re

Dim = int | str | None  # a size, a symbolic name, or unknown


def is_named(dim: Dim) -> bool:
    """A size the model names (onnx calls the sizes it cannot name unk__N, fresh on every run)."""
    return isinstance(dim, str) and bool(dim) and not dim.startswith("unk__")


_FORM = re.compile(r"^(?P<base>[A-Za-z_][\w.]*?)(?://(?P<q>\d+))?(?P<c>[+-]\d+)?$")
_TAIL = re.compile(r"^(?://(?P<q>\d+))?(?P<c>[+-]\d+)?$")


def _parse(dim: Dim) -> tuple[str, int, int] | None:
    """(base, q, c); a base may be a parenthesized form itself: (len//20+1)//2-1."""
    if not is_named(dim):
        return None
    if dim.startswith("("):
        depth = 0
        for i, ch in enumerate(dim):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                break
        match = _TAIL.match(dim[i + 1:]) if depth == 0 else None
        return (dim[:i + 1], int(match["q"] or 1), int(match["c"] or 0)) if match is not None else None
    match = _FORM.match(dim)
    if match is None:
        return None
    return match["base"], int(match["q"] or 1), int(match["c"] or 0)


def _render(base: str, q: int, c: int) -> str:
    return base + (f"//{q}" if q != 1 else "") + (f"{c:+d}" if c else "")


def shifted(dim: Dim, k: int) -> Dim:
    """dim + k (None where dim is not in the form)."""
    if isinstance(dim, int):
        return dim + k
    form = _parse(dim)
    return _render(form[0], form[1], form[2] + k) if form is not None else None


def floor_divided(dim: Dim, s: int) -> Dim:
    """dim // s for s > 0: base // (q * s) + c / s where s divides c, else the form with the
    constant's remainder r = c mod s kept inside, (base // q + r) // s + (c - r) / s, one name for
    every way of writing it ((x - 3) // 2 + 1 and (x - 1) // 2 are both (x+1)//2-1)."""
    if isinstance(dim, int):
        return dim // s if s > 0 else None
    form = _parse(dim)
    if form is None or s <= 0:
        return None
    base, q, c = form
    if c % s == 0:
        return _render(base, q * s, c // s)
    return _render(f"({_render(base, q, c % s)})", s, c // s)


def symbolic_arithmetic(op: str, a: Dim, b: Dim) -> Dim:
    """The shape walk's Add / Sub / Div / Mul of a length in the form and an int."""
    if op == "Add":
        return shifted(a, b) if isinstance(b, int) else shifted(b, a) if isinstance(a, int) else None
    if op == "Sub" and isinstance(b, int):
        return shifted(a, -b)
    if op == "Div" and isinstance(b, int):
        return floor_divided(a, b)
    if op == "Mul" and 1 in (a, b):
        return b if a == 1 else a
    return None


