"""`--precision int8` for decoder plans: int8 weights and int8 activations quantized per token.

    W [K, N] float32  ==>  codes [K, N] int8, one symmetric scale per column (zero points 0)
    each GEMM's rows  ==>  quantized one by one to uint8, DynamicQuantizeLinear's formula, at run time

What onnxruntime's `quantize_dynamic` makes of a model (weights int8, per-channel; activations
quantized dynamically), served as infc serves such files already (decoder/dynamic_quant.py,
runtime/row_quantized_gemm.py): every row gets its own activation scale, so a token's logits stay
independent of its batch, and the integer sums are exact, so prefill runs on onnxruntime's int8 GEMMs
and decode rows on VNNI, the same bits either way. No calibration: activation ranges are each row's own.

Which weights: the float32 weights of the plan's MatMul steps, [K, N] with N the output channels,
read by nothing else (a tied embedding keeps fp32) and of MIN_ELEMENTS at least. The weight is
replaced by its exactly dequantized form before the codes are stored, so the plan's float32 path (a
device plan, compiled kernels off) computes with what the codes say.
"""

from __future__ import annotations

import numpy as np

from ..lower import Program
from ..quantize.qdq import weight_per_channel
from ..quantize.weight_only import MIN_ELEMENTS, quantizable_weights
from .weight_codes import BATCH_INVARIANT, WeightCodes, attach_codes, store_codes

COMPUTE = ("int8 weights with one symmetric scale per output channel; each GEMM's activations quantized to uint8 per "
           "token at run time (its own scale and zero point), integer sums exact (onnxruntime's int8 GEMMs on prefill "
           "rows, VNNI on decode rows), float32 everywhere else")

NOT_KN_MATMUL = "not the [K, N] weight of a MatMul"  # a Gemm's [N, K] with transB, a weight read otherwise


def _kn_matmul_axis(step: dict) -> int | None:
    """1 for a decoder MatMul step reading a weight as its [K, N] B (what attach_codes hands codes to)."""
    is_matmul = (step.get("domain") or "", step["op"]) == BATCH_INVARIANT and len(step["inputs"]) == 2 \
        and (step["attrs"].get("inner_domain"), step["attrs"].get("inner_op")) == ("", "MatMul")
    return 1 if is_matmul else None


def quantize_decoder_int8(program: Program, min_elements: int = MIN_ELEMENTS, keep_fp32: tuple[str, ...] = ()) -> dict:
    """Rewrites `program` in place; returns the plan's int8 entry (how many weights, their bytes, the
    candidates `keep_fp32` left float32: the LM head by default, decoder/lm_head.py)."""
    candidates, skipped = quantizable_weights(program, min_elements, b_axis=_kn_matmul_axis, other_gemm=NOT_KN_MATMUL)
    codes, bytes_fp32 = {}, 0
    kept = [name for name in keep_fp32 if name in candidates]
    for name in candidates:
        if name in kept:
            continue
        weight = program.weights[name]
        q, scale = weight_per_channel(weight, 1)
        parts = WeightCodes(q, scale.reshape(1, -1), np.zeros((1, q.shape[1]), np.int8), q.shape[0], row_quantized=True)
        program.weights[name] = parts.dequantized()  # what the codes restate, exactly
        codes[name] = parts
        bytes_fp32 += weight.nbytes
    stored = store_codes(program, codes)
    attached = attach_codes(program, stored)
    bytes_int8 = sum(p.codes.nbytes + p.scale.nbytes + p.zero.nbytes for p in stored.values())
    return {"num_weights": len(stored), "gemms_quantizing_rows": attached, "bytes_fp32": bytes_fp32,
            "bytes_int8": bytes_int8, "skipped": skipped, "kept_fp32": kept,
            "kept_fp32_bytes": sum(program.weights[n].nbytes for n in kept)}
