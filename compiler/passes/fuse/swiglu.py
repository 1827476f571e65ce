"""SwiGLU's gate and up projections merged into one GEMM that reads x and the weights once.

    x ─┬─► MatMul(Wg) ─► QuickGelu ─► Mul ─►        (the silu rule already made x·σ(x) a QuickGelu)
       └─► MatMul(Wu) ─────────────►┘
      ==>  x ─► MatMul([Wg | Wu]) ─► Split(N, N) ─┬─► QuickGelu ─► Mul ─►
                                                   └─────────────►┘
The runtime maps exactly this MatMul → Split → QuickGelu → Mul form onto a gated-GEMM epilogue.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import CONTRIB_DOMAIN, opset_of
from ..engine import Match, Rule
from ..pattern import const, ms_op, op, var


def _check(m: Match) -> str | None:
    w_gate, w_up = m.const("w_gate"), m.const("w_up")
    if w_gate.ndim != 2 or w_gate.shape != w_up.shape or w_gate.dtype != w_up.dtype:
        return "gate and up weights are not 2-D of one shape and dtype"
    return None


def _rewrite(m: Match):
    w_gate, w_up = m.const("w_gate"), m.const("w_up")
    n = w_gate.shape[1]
    gate_out = m.node("gate").outputs[0]
    shape = list(gate_out.shape[:-1]) + [2 * n] if gate_out.shape is not None else None
    gate_up = m.value("swiglu_gate_up", like=gate_out, shape=shape)
    gate, up, act = (m.value(hint, like=gate_out) for hint in ("swiglu_gate", "swiglu_up", "swiglu_act"))
    sizes = np.array([n, n], dtype=np.int64)
    if opset_of(m.graph) >= 13:
        split = gs.Node("Split", attrs={"axis": -1}, inputs=[gate_up, m.constant("swiglu_split", sizes)], outputs=[gate, up])
    else:
        split = gs.Node("Split", attrs={"axis": -1, "split": sizes.tolist()}, inputs=[gate_up], outputs=[gate, up])
    return [
        gs.Node("MatMul", inputs=[m["x"], m.constant("swiglu_w", np.concatenate([w_gate, w_up], axis=1))], outputs=[gate_up]),
        split,
        gs.Node("QuickGelu", domain=CONTRIB_DOMAIN, attrs=dict(m.node("act").attrs), inputs=[gate], outputs=[act]),
        gs.Node("Mul", inputs=[act, up], outputs=m.outputs),
    ]


_gate = op.MatMul(var("x"), const("w_gate"), name="gate")
RULES = (Rule("swiglu", op.Mul(ms_op.QuickGelu(_gate, name="act"), op.MatMul(var("x"), const("w_up"))), _rewrite, _check),)
