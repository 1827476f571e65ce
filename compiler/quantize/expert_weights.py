"""`--precision w8` for a mixture of experts' weights: each ExpertMatMul step's [E, K, N] float32
weight stored as int8 codes with one symmetric scale per expert and output channel.

    W [E, K, N] float32  ==>  codes [E, K, N] int8 + scale [E, N] float32
    ExpertMatMul(x, idx, W)  ==>  ExpertMatMul(x, idx, codes, scale)      (runtime/kernels/expert_gemm.py)

Why: in a MoE decoder the experts are most of the weight bytes, and only the experts a step's
tokens were routed to are read. The kernel rebuilds an expert's weight per call into one reused
float32 buffer (decode rows read the codes directly), so the plan and the resident weights stay int8,
unlike the DequantizeLinear steps of weight_only.py, whose float32 results the executor keeps.
Per channel, not per group of K: the kernel's code path reads one scale per column (group = K).
A weight that any other step reads (or that is not float32) is left as it is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..lower_experts import EXPERT_DOMAIN, EXPERT_OP
from .qdq import weight_per_channel
from .weight_only import MIN_ELEMENTS, weight_uses


@dataclass
class ExpertW8Report:
    num_weights: int = 0
    bytes_fp32: int = 0
    bytes_int8: int = 0  # codes plus scales
    skipped: dict = field(default_factory=dict)  # reason -> weights

    def to_json(self) -> dict:
        return asdict(self)


def _is_expert_step(step: dict) -> bool:
    return ((step.get("domain") or "", step["op"]) == (EXPERT_DOMAIN, EXPERT_OP)) and len(step["inputs"]) == 3


def per_expert_channel(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 codes [E, K, N] and scales [E, N]: each expert's column max maps to 127."""
    codes, scales = zip(*(weight_per_channel(expert, 1) for expert in weight))
    return np.stack(codes), np.stack(scales)


def quantize_expert_weights(program, min_elements: int = MIN_ELEMENTS) -> ExpertW8Report:
    """Rewrites `program`'s ExpertMatMul steps and weights in place."""
    report = ExpertW8Report()
    for name, uses in weight_uses(program).items():
        if not any(_is_expert_step(step) and index == 2 for step, index in uses):
            continue
        weight = program.weights[name]
        reason = ("also read by a step that is not an expert GEMM's weight"
                  if any(not _is_expert_step(step) or index != 2 for step, index in uses)
                  else "not a 3-D fp32 expert weight" if weight.dtype != np.float32 or weight.ndim != 3
                  else f"fewer than {min_elements} elements" if weight.size < min_elements else None)
        if reason:
            report.skipped[reason] = report.skipped.get(reason, 0) + 1
            continue
        codes, scale = per_expert_channel(weight)
        del program.weights[name]
        program.weights[f"{name}/w8"], program.weights[f"{name}/w8_scale"] = codes, scale
        for step, _ in uses:
            step["inputs"] = [*step["inputs"][:2], f"{name}/w8", f"{name}/w8_scale"]
        report.num_weights += 1
        report.bytes_fp32 += weight.nbytes
        report.bytes_int8 += codes.nbytes + scale.nbytes
    return report
