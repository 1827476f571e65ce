"""`infc.cpu.TunedMatMul`: a MatMul whose constant weight was tuned per M bucket at build time.

inputs: [a, w, *packed weights]; attrs["variants"]: ascending by `m_max`, each naming the winning
impl of runtime/gemm_impls.py, its params and which inputs hold its packed arrays. An M above the
last bucket (outside the profile) runs the generic matmul on the original weight.
"""

from __future__ import annotations

import numpy as np

from ..gemm_impls import run_gemm


def tuned_matmul(inputs, attrs, ctx):
    a, w = inputs[0], inputs[1]
    m = a.size // a.shape[-1] if a.ndim > 1 else 1
    for variant in attrs["variants"]:
        if m <= variant["m_max"]:
            packed = {name: inputs[index] for name, index in variant["packed"].items()}
            return [run_gemm(variant["impl"], a, packed, variant["params"])]
    return [np.matmul(a, w)]


KERNELS = {("infc.cpu", "TunedMatMul"): tuned_matmul}
