"""Decomposed HardSwish, x * relu6(x + 3) / 6, into one op.

    x ─┬─► Add(3) ─► Clip(0, 6) ─┐
       └──────────────────────── Mul ─► Div(6) ─►     ==>   x ─► HardSwish ─►          (opset >= 14)
                                                      ==>   x ─┬─► HardSigmoid(1/6, 1/2) ─┐
                                                               └──────────────────────── Mul ─►  (opset < 14)
    gates:  Clip(·, 0, 6) with bounds as inputs (opset >= 11) or attributes (older), Min(Max(·, 0), 6)
    scales: Div(Mul(x, g), 6),  Mul(x, Div(g, 6)),  Mul(Mul(x, g), 1/6),  Mul(x, Mul(g, 1/6))
    also:   Mul(x, HardSigmoid(x, alpha=1/6, beta=1/2))  ==>  HardSwish       (opset >= 14 only)

Below opset 14 there is no HardSwish op; the two-node HardSigmoid form is the shortest standard one
(and the one onnxruntime's NCHWc Conv fusion looks for), so the four-node forms become that.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import opset_of
from ..engine import Match, Rule
from ..pattern import const, op, var

_EXPECTED = {"three": 3.0, "lo": 0.0, "hi": 6.0, "six": 6.0, "sixth": 1 / 6, "alpha": 1 / 6, "beta": 0.5}


def _constants(m: Match, gate: str) -> dict:
    if gate == "hardsigmoid":
        attrs = m.node("gate").attrs
        return {"alpha": np.asarray(attrs.get("alpha", 0.2)), "beta": np.asarray(attrs.get("beta", 0.5))}
    found = {name: m.const(name) for name in _EXPECTED if name in m.values}
    if gate == "clip_attrs":  # opset < 11 keeps the bounds as attributes; later a 1-input Clip has none
        attrs = m.node("gate").attrs
        found.update(lo=np.asarray(attrs.get("min", -np.inf)), hi=np.asarray(attrs.get("max", np.inf)))
    return found


def _check(gate: str, m: Match) -> str | None:
    x = m["x"]
    if x.dtype is None or np.dtype(x.dtype) not in (np.float16, np.float32):
        return "HardSwish runs only float16/float32 on CPU"
    if gate == "hardsigmoid" and opset_of(m.graph) < 14:
        return "HardSwish needs opset 14 (the HardSigmoid form is already the shortest)"
    for name, value in _constants(m, gate).items():
        rtol = max(1e-5, 4 * float(np.finfo(value.dtype).eps)) if value is not None and value.dtype.kind == "f" else 1e-5
        if value is None or value.size != 1 or not np.isclose(float(value.reshape(-1)[0]), _EXPECTED[name], rtol=rtol):
            return "constants are not those of HardSwish"
        if value.ndim > 0 and (x.shape is None or value.ndim > len(x.shape)):
            return "a constant may broadcast the input to a higher rank"
    return None


def _rewrite(m: Match):
    x = m["x"]
    if opset_of(m.graph) >= 14:
        return [gs.Node("HardSwish", inputs=[x], outputs=m.outputs)]
    gate = m.value("hardswish_gate", like=m.outputs[0])
    return [gs.Node("HardSigmoid", attrs={"alpha": 1 / 6, "beta": 0.5}, inputs=[x], outputs=[gate]),
            gs.Node("Mul", inputs=[x, gate], outputs=m.outputs)]


_PLUS3 = op.Add(var("x"), const("three"))
_GATES = {"clip": op.Clip(_PLUS3, const("lo"), const("hi"), name="gate"),
          "clip_attrs": op.Clip(_PLUS3, name="gate"),
          "relu6": op.Min(op.Max(_PLUS3, const("lo")), const("hi"), name="gate")}

_SCALES = {
    "div": lambda g: op.Div(op.Mul(var("x"), g), const("six")),
    "mul_div": lambda g: op.Mul(var("x"), op.Div(g, const("six"))),
    "mul_sixth": lambda g: op.Mul(op.Mul(var("x"), g), const("sixth")),
    "sixth_gate": lambda g: op.Mul(var("x"), op.Mul(g, const("sixth"))),
}

RULES = tuple(
    Rule(f"fuse_hardswish_{gate}_{scale}", build(gate_pattern), _rewrite, partial(_check, gate))
    for gate, gate_pattern in _GATES.items() for scale, build in _SCALES.items()
) + (Rule("fuse_hardswish_hardsigmoid", op.Mul(var("x"), op.HardSigmoid(var("x"), name="gate")), _rewrite,
          partial(_check, "hardsigmoid")),)
