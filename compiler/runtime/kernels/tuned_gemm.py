"""`infc.cpu.TunedMatMul`: a MatMul whose constant weight was tuned per M bucket at build time.

inputs: [a, w, *packed weights]; attrs["variants"]: ascending by `m_max`, each naming the winning
impl of runtime/gemm_impls.py, its params and which inputs hold its packed arrays. An M above the
last bucket (outside the profile) runs the generic matmul on the original weight. attrs["round_to"]
(an ONNX type code, bfloat16's): the output is rounded to that type, as every reader of it would
round it (compiler/tune_plan.py sets it only then), so their rounding step goes
(runtime/cast_fold.fold_rounding); rounding the product just written costs no pass over memory.
"""

from __future__ import annotations

import numpy as np

from ..cast_fold import LOW_TYPES
from ..gemm_impls import run_gemm
from .jit_half import round_to_low


def tuned_matmul(inputs, attrs, ctx):
    a, w = inputs[0], inputs[1]
    m = a.size // a.shape[-1] if a.ndim > 1 else 1
    y = None
    for variant in attrs["variants"]:
        if m <= variant["m_max"]:
            packed = {name: inputs[index] for name, index in variant["packed"].items()}
            y = run_gemm(variant["impl"], a, packed, variant["params"])
            break
    if y is None:
        y = np.matmul(a, w)
    round_to = attrs.get("round_to")
    return [y if round_to is None else round_to_low(y, LOW_TYPES[round_to], out=y)]


KERNELS = {("infc.cpu", "TunedMatMul"): tuned_matmul}
