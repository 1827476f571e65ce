"""GELU written out elementwise, in erf or tanh form, into one Gelu node.

    erf:   x ─► Div(√2) | Mul(1/√2) ─► Erf ──────────────────────────────────────► Add(1) ─┐
    tanh:  x ─► Pow(3) | x·x·x ─► Mul(0.044715) ─► Add(x) ─► Mul(√(2/π)) ─► Tanh ─► Add(1) ─┤
           x ───────────────────────────────────────────────────────────────────────────► Mul·0.5 ─►
    (the 0.5 sits on x, on the Add(1) or on the product: three exported orders)
      ==>  x ─► Gelu ─►   ONNX Gelu(approximate="none"|"tanh") at opset >= 20, else
                          com.microsoft Gelu (erf) / FastGelu (tanh)
"""

from __future__ import annotations

import math

import onnx_graphsurgeon as gs

from ...graph import CONTRIB_DOMAIN, is_float, is_scalar_const, opset_of
from ..engine import Match, Rule
from ..pattern import const, op, var

x = var("x")
_ERF_ARGS = {"Div": math.sqrt(2.0), "Mul": 1.0 / math.sqrt(2.0)}
_EXPECTED = {"one": 1.0, "half": 0.5, "three": 3.0, "coef": 0.044715, "sqrt_2_pi": math.sqrt(2.0 / math.pi)}


def _check(m: Match) -> str | None:
    if not is_float(m["x"]):
        return "input is not floating point"
    if "scale" in m.values and not is_scalar_const(m["scale"], _ERF_ARGS[m.node("scaled").op]):
        return "erf argument is not x/sqrt(2)"
    for name, value in _EXPECTED.items():
        if name in m.values and not is_scalar_const(m[name], value):
            return f"constant is not {value:g}"
    return None


def _rewrite(m: Match):
    is_tanh = "Tanh" in {n.op for n in m.nodes}
    if opset_of(m.graph) >= 20:
        return [gs.Node("Gelu", attrs={"approximate": "tanh" if is_tanh else "none"}, inputs=[m["x"]], outputs=m.outputs)]
    return [gs.Node("FastGelu" if is_tanh else "Gelu", domain=CONTRIB_DOMAIN, inputs=[m["x"]], outputs=m.outputs)]


def _erf_core():
    return op.Add(op.Erf(op.any("Div", "Mul")(x, const("scale"), name="scaled")), const("one"))


def _tanh_core(cube):
    inner = op.Add(x, op.Mul(cube, const("coef")))
    return op.Add(op.Tanh(op.Mul(inner, const("sqrt_2_pi"))), const("one"))


def _half_placements(core):
    half = const("half")
    return (op.Mul(op.Mul(x, core), half), op.Mul(x, op.Mul(half, core)), op.Mul(op.Mul(x, half), core))


_CUBES = (op.Pow(x, const("three")), op.Mul(op.Mul(x, x), x))

RULES = tuple(Rule("gelu_erf", p, _rewrite, _check) for p in _half_placements(_erf_core())) + tuple(
    Rule("gelu_tanh", p, _rewrite, _check) for cube in _CUBES for p in _half_placements(_tanh_core(cube)))
