"""Batch-invariant GEMMs: BLAS fp32 results for a row change with the number of rows M (blocking,
gemv vs gemm paths), so a sequence's logits would depend on what else is in the batch. Decoder
plans run every float32 GEMM as `infc.Float64`: inputs cast to float64, the original kernel, the
result rounded to float32; weights are cast once and kept."""

from __future__ import annotations

import numpy as np

from ..lower import Program

GEMMS = {("", "MatMul"), ("", "Gemm"), ("com.microsoft", "FusedMatMul"), ("com.microsoft", "FusedGemm")}


def use_float64_gemms(program: Program, dtypes: dict[str, object]) -> int:
    """Rewrites the program's float32 GEMM steps in place; returns how many."""
    count = 0
    for step in program.steps:
        key = (step.get("domain") or "", step["op"])
        if key not in GEMMS or np.dtype(dtypes.get(step["outputs"][0]) or np.float32) != np.float32:
            continue
        const_inputs = [i for i, name in enumerate(step["inputs"]) if name in program.weights]
        step["attrs"] = {**step["attrs"], "inner_op": step["op"], "inner_domain": key[0], "const_inputs": const_inputs}
        step["op"], step["domain"] = "Float64", "infc"
        count += 1
    return count
