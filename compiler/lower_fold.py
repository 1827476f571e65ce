"""Lowering-time folding of DequantizeLinear over constants: a QDQ model's weights become float weights.

A QDQ model (onnxruntime's quantize_static, other quantizers) stores each weight as int8 and
dequantizes it in the graph:

    W_int8 ─► DequantizeLinear(scale, zero point) ─► Conv / MatMul

`infc optimize` keeps that form (onnxruntime runs int8 kernels from it). A plan computes in float32
from the dequantized weights (docs/quantization.md), so the build evaluates these steps once, with
the runtime's own DequantizeLinear kernel, and stores the result as a weight: the convolution and
GEMM tuners then see constant weights (tactics, packed layouts), and no run dequantizes them again.
The values are the ones the step computed at run time, bit for bit.
"""

from __future__ import annotations

import numpy as np

from .runtime.kernels.common import KernelContext, decode_attrs
from .runtime.kernels.quant import dequantize_linear

FOLDED = ("", "DequantizeLinear")


def fold_constant_dequantize(steps: list[dict], weights: dict[str, np.ndarray], opset: int, keep: set[str]) -> list[dict]:
    """`steps` without the DequantizeLinear steps whose inputs are all weights (their outputs join
    `weights`); outputs in `keep` (graph outputs) stay computed by their step."""
    kept = []
    for step in steps:
        inputs = [name for name in step["inputs"] if name]
        if ((step.get("domain") or ""), step["op"]) == FOLDED and inputs and all(n in weights for n in inputs) \
                and len(step["outputs"]) == 1 and step["outputs"][0] not in keep:
            args = [weights[name] if name else None for name in step["inputs"]]
            value = dequantize_linear(args, decode_attrs(step.get("attrs") or {}), KernelContext(opset, [None]))[0]
            weights[step["outputs"][0]] = np.require(value, requirements="C")
            continue
        kept.append(step)
    used = {name for step in kept for name in step["inputs"]} | keep
    for step in steps:  # the quantized weights, scales and zero points no step reads any more
        if step not in kept:
            for name in step["inputs"]:
                if name and name not in used:
                    weights.pop(name, None)
    return kept
