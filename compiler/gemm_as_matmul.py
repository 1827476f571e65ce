"""Gemm steps with a constant weight as MatMul + Add, so the GEMM tuner (tune_plan.py) takes them.

Why: the tuner rewrites MatMul steps with a constant 2-D weight into TunedMatMul; a Gemm (what
exporters write for a Linear on 2-D rows: torch's MultiheadAttention output projection, every
classifier head) ran gemm_forward's BLAS call untuned. In a bf16 plan that kept ViT-S/16's twelve
attention output projections in float32 sgemm while the other 36 GEMMs ran on AMX tiles.

    Y = Gemm(A, B, C; transA=0, transB, alpha=1, beta)     B a weight, C a weight or absent
        ->  P = MatMul(A, B or B^T)   Y = Add(P, beta * C)  (no Add without C or with beta = 0)

The same sums: Gemm computes A @ B in float32 and adds beta * C once, as the Add does; a bf16
program's Cast after Y still rounds the sum once. transA (a transposed activation) and alpha != 1
(a scaled product: folding it into B would change its bits) stay Gemm.
"""

from __future__ import annotations

import numpy as np

from .lower import Program


def _rewritable(step: dict, weights: dict) -> bool:
    attrs = step.get("attrs") or {}
    inputs = step["inputs"]
    b = weights.get(inputs[1]) if len(inputs) > 1 else None
    c_name = inputs[2] if len(inputs) > 2 else ""
    return (step["op"] == "Gemm" and not step.get("domain") and not attrs.get("transA", 0)
            and float(attrs.get("alpha", 1.0)) == 1.0 and b is not None and b.ndim == 2 and b.dtype == np.float32
            and (not c_name or c_name in weights) and inputs[0] not in weights)


def gemms_as_matmuls(program: Program, shapes_by_level: dict) -> int:
    """Rewrites the program's eligible Gemm steps in place (shapes_by_level gets the new products'
    entries: the Gemm output's shape and dtype); returns how many."""
    steps, count, replaced = [], 0, set()
    for step in program.steps:
        if not _rewritable(step, program.weights):
            steps.append(step)
            continue
        attrs, inputs = step.get("attrs") or {}, step["inputs"]
        out = step["outputs"][0]
        weight = inputs[1]
        if attrs.get("transB", 0):
            weight = f"{inputs[1]}@T"
            replaced.add(inputs[1])
            if weight not in program.weights:
                program.weights[weight] = np.ascontiguousarray(program.weights[inputs[1]].T)
        c_name = inputs[2] if len(inputs) > 2 else ""
        beta = float(attrs.get("beta", 1.0))
        has_bias = bool(c_name) and beta != 0.0
        product = f"{out}/matmul" if has_bias else out
        steps.append({**{k: v for k, v in step.items() if k not in ("attrs", "inputs", "outputs")},
                      "op": "MatMul", "domain": "", "inputs": [inputs[0], weight], "outputs": [product], "attrs": {}})
        if has_bias:
            if beta != 1.0:
                scaled = f"{c_name}@beta{beta:g}"
                program.weights.setdefault(scaled, (program.weights[c_name] * np.float32(beta)).astype(np.float32))
                c_name = scaled
            steps.append({"op": "Add", "domain": "", "name": f"{step.get('name', '')}/bias", "inputs": [product, c_name],
                          "outputs": [out], "attrs": {}})
            for seen in shapes_by_level.values():
                if out in seen:
                    seen[product] = seen[out]
        count += 1
    program.steps[:] = steps
    read = {name for step in steps for name in step["inputs"]} | {o["name"] for o in program.outputs}
    for name in replaced - read:  # a transposed weight the plan stores once
        del program.weights[name]
    return count
