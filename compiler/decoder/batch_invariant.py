"""Batch-invariant GEMMs: a sequence's logits must not depend on what else is in the step, and BLAS
fp32 results for a row can change with the number of rows M (GEMV and small-matrix paths, blocking).
Decoder plans run every float32 GEMM as `infc.BatchInvariant`, which the runtime executes in float32
where this machine's BLAS was checked row-invariant for the shape and in float64 elsewhere
(runtime/invariant_gemm.py, runtime/kernels/batch_invariant.py). Plans built before it hold
`infc.Float64` steps, which still run (always float64)."""

from __future__ import annotations

import numpy as np

from ..lower import Program

EXPERT_GEMM = ("infc.cpu", "ExpertMatMul")  # grouped by expert at lowering (lower_experts.py): its own flag
GEMMS = {("", "MatMul"), ("", "Gemm"), ("com.microsoft", "FusedMatMul"), ("com.microsoft", "FusedGemm")}
WRAPPERS = {("infc", "BatchInvariant"), ("infc", "Float64")}


def use_batch_invariant_gemms(program: Program, dtypes: dict[str, object]) -> int:
    """Rewrites the program's float32 GEMM steps in place; returns how many."""
    count = 0
    for step in program.steps:
        key = (step.get("domain") or "", step["op"])
        if key == EXPERT_GEMM:
            step["attrs"] = {**step["attrs"], "batch_invariant": 1}
            count += 1
            continue
        if key not in GEMMS or np.dtype(dtypes.get(step["outputs"][0]) or np.float32) != np.float32:
            continue
        const_inputs = [i for i, name in enumerate(step["inputs"]) if name in program.weights]
        step["attrs"] = {**step["attrs"], "inner_op": step["op"], "inner_domain": key[0], "const_inputs": const_inputs}
        step["op"], step["domain"] = "BatchInvariant", "infc"
        count += 1
    return count
