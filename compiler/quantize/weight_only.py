"""Weight-only int8 (`--precision w8`) on a lowered program: each GEMM's constant 2-D weight is
stored int8 with symmetric scales per output channel and per group of GROUP_SIZE input channels
(one scale per output channel when K does not split into groups), and a DequantizeLinear step at
the start of the program turns it back into the fp32 weight under its old name.

    W_fp32 [K, N]  ==>  W_int8 [K, N] + scale [K/G, N]  ─► DequantizeLinear(axis=K, block_size=G) ─► "W"

Why groups: one scale over a whole column lets a single large weight coarsen all the others; on
SmolLM2 per-channel scales kept 96.9% of greedy steps and only 69% of whole 32-token continuations
(groups of 32: 97.9% and 79%; of 16: 98.4% and 85%).

On the CPU the DequantizeLinear steps read only weights, so the executor runs them once and keeps
the result (its memo of weight-only steps; they come first, before any Shape step, so the memo's
state never changes there): the weights are dequantized at the first run for GEMMs of many rows,
as in an fp32 plan, while decode rows read the int8 codes (grouped weights get all-zero zero points
for that: decoder/weight_codes.py, runtime/code_chain_gemm.py), with the same sums bit for bit.
The plan file holds int8 (about 1/4 of the fp32 bytes). On a GPU the same sections feed the
weight-only int8 kernels of #4, which dequantize inside the GEMM. Decoder builds leave the weights
whose int8 error moves the logits most in fp32 (`keep_fp32`, chosen by w8_sensitivity.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..decoder.batch_invariant import WRAPPERS
from .qdq import weight_per_channel

GEMM_OPS = {("", "MatMul"), ("", "Gemm"), ("com.microsoft", "FusedMatMul"), ("com.microsoft", "FusedGemm")}
# Smaller weights (biases, norms, tiny projections) stay fp32: their bytes do not matter.
MIN_ELEMENTS = 4096
GROUP_SIZE = 16  # input channels per scale: scales add 1/4 to the int8 bytes (32 kept 79% of SmolLM2 tokens, 16 kept 85%)
COMPUTE = (f"int8 weights with symmetric scales per output channel and group of {GROUP_SIZE} input channels in the "
           "plan; on the CPU decode rows (up to 8 per step) read the int8 weights, with the same sums as the fp32 GEMM on "
           "the dequantized weights; larger steps run that GEMM, the weights dequantized to fp32 once, at the first run")


@dataclass
class W8Report:
    num_weights: int
    bytes_fp32: int
    bytes_int8: int  # int8 values plus fp32 scales
    skipped: dict  # reason -> weights
    kept_fp32: list = field(default_factory=list)  # quantizable weights left fp32 (w8_sensitivity.py)
    kept_fp32_bytes: int = 0

    def to_json(self) -> dict:
        return asdict(self)


def gemm_key(step: dict) -> tuple[str, str]:
    if (step.get("domain"), step["op"]) in WRAPPERS:  # decoder plans wrap GEMMs (decoder/batch_invariant.py)
        return step["attrs"].get("inner_domain") or "", step["attrs"]["inner_op"]
    return step.get("domain") or "", step["op"]


def gemm_b_axis(step: dict) -> int | None:
    """The axis of a GEMM step's weight (input B) holding output channels: N of [K, N], or of [N, K]
    with transB; None for a step that is not a GEMM."""
    if gemm_key(step) not in GEMM_OPS:
        return None
    return 0 if (step.get("attrs") or {}).get("transB", 0) else 1


OTHER_USE = "also read by a step that is not a GEMM weight"
OTHER_GEMM = "other GEMM"  # a use as the B of a GEMM that `b_axis` does not take


def weight_uses(program) -> dict[str, list[tuple[dict, int]]]:
    """Each weight a step reads -> (the step, the input position it reads it at), in program order."""
    uses: dict[str, list[tuple[dict, int]]] = {}
    for step in program.steps:
        for index, name in enumerate(step["inputs"]):
            if name in program.weights:
                uses.setdefault(name, []).append((step, index))
    return uses


def quantizable_weights(program, min_elements: int = MIN_ELEMENTS, b_axis=gemm_b_axis,
                        other_gemm: str = "read by a GEMM of another kind") -> tuple[dict[str, int], dict[str, int]]:
    """The weights w8 would store int8 -> their output-channel axis, and reason -> weights it skips.
    `b_axis(step)`: the output axis when the step is a GEMM whose weight (input B) this precision
    quantizes, else None (int8 decoder plans take only [K, N] MatMuls: decoder/dynamic_int8.py);
    `other_gemm`: the skip reason of a weight a GEMM that `b_axis` refuses reads."""
    uses: dict[str, set] = {}  # weight -> {axis, OTHER_GEMM, or None for a use that is not a GEMM's B}
    for name, readers in weight_uses(program).items():
        for step, index in readers:
            axis = b_axis(step)
            if axis is None and gemm_b_axis(step) is not None:
                axis = OTHER_GEMM
            uses.setdefault(name, set()).add(axis if index == 1 else None)
    candidates, skipped = {}, {}
    for name, axes in uses.items():
        reason = _skip_reason(program.weights[name], axes, min_elements, other_gemm)
        if reason is None:
            (candidates[name],) = axes
        elif axes != {None}:  # weights no GEMM reads are not candidates
            skipped[reason] = skipped.get(reason, 0) + 1
    return candidates, skipped


def dequantized(weight: np.ndarray, axis: int, group_size: int = GROUP_SIZE) -> np.ndarray:
    """What the plan's DequantizeLinear step gives back for `weight` (to measure the int8 error)."""
    q, scale, attrs = _quantize(weight.astype(np.float32), axis, group_size)
    scale = np.repeat(scale, attrs["block_size"], axis=attrs["axis"]) if "block_size" in attrs else \
        np.expand_dims(scale, 1 - axis)
    return (q.astype(np.float32) * scale).astype(np.float32)


def quantize_program_weights(program, min_elements: int = MIN_ELEMENTS, group_size: int = GROUP_SIZE,
                             keep_fp32: tuple[str, ...] = ()) -> W8Report:
    """Rewrites `program` (steps and weights) in place; `keep_fp32`: candidates left fp32."""
    candidates, skipped = quantizable_weights(program, min_elements)
    dequantize_steps, bytes_fp32, bytes_int8 = [], 0, 0
    for name, axis in candidates.items():
        if name in keep_fp32:
            continue
        weight = program.weights[name]
        q, scale, attrs = _quantize(weight.astype(np.float32), axis, group_size)
        q_name, scale_name = f"{name}/w8", f"{name}/w8_scale"
        del program.weights[name]
        program.weights[q_name], program.weights[scale_name] = q, scale
        inputs = [q_name, scale_name]
        if "block_size" in attrs:  # zero points (all 0) make the step one decode kernels read (decoder/weight_codes.py)
            program.weights[f"{name}/w8_zero"] = np.zeros_like(scale, np.int8)
            inputs.append(f"{name}/w8_zero")
        dequantize_steps.append({"op": "DequantizeLinear", "domain": "", "name": f"{name}/w8_dequantize",
                                 "inputs": inputs, "outputs": [name], "attrs": attrs})
        bytes_fp32 += weight.nbytes
        bytes_int8 += sum(program.weights[n].nbytes for n in inputs)
    program.steps[:0] = dequantize_steps
    kept = [name for name in keep_fp32 if name in candidates]
    return W8Report(len(dequantize_steps), bytes_fp32, bytes_int8, skipped, kept,
                    sum(program.weights[n].nbytes for n in kept))


def _quantize(weight: np.ndarray, axis: int, group_size: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """int8 values, scales and the DequantizeLinear attributes; `axis` holds the output channels."""
    k_axis = 1 - axis
    if not group_size or weight.shape[k_axis] % group_size:
        q, scale = weight_per_channel(weight, axis)
        return q, scale, {"axis": axis}
    w_KN = np.moveaxis(weight, k_axis, 0)
    groups_GgN = w_KN.reshape(-1, group_size, w_KN.shape[1])
    scale_GN = np.abs(groups_GgN).max(axis=1) / 127.0
    scale_GN = np.where(scale_GN > 0, scale_GN, 1.0).astype(np.float32)
    q_KN = np.clip(np.round(groups_GgN / scale_GN[:, None, :]), -127, 127).astype(np.int8).reshape(w_KN.shape)
    return (np.ascontiguousarray(np.moveaxis(q_KN, 0, k_axis)), np.ascontiguousarray(np.moveaxis(scale_GN, 0, k_axis)),
            {"axis": k_axis, "block_size": group_size})


def _skip_reason(weight: np.ndarray, axes: set, min_elements: int, other_gemm: str) -> str | None:
    if None in axes:
        return OTHER_USE
    if OTHER_GEMM in axes:
        return other_gemm
    if len(axes) > 1:
        return "read with different output axes"
    if weight.dtype != np.float32 or weight.ndim != 2:
        return "not a 2-D fp32 matrix"
    if weight.size < min_elements:
        return f"fewer than {min_elements} elements"
    return None
