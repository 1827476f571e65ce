"""Decoder GEMM weights kept as 8-bit codes, read by decode rows (runtime/code_chain_gemm.py).

    W [K, N] float32   ==>   codes [K, N] (u)int8, scale / zero [ceil(K/G), N] ─► DequantizeLinear(axis 0, block G) ─► "W"
                                     └──────────────── also inputs 2-4 of each BatchInvariant step reading W

Weight-only quantized plans hold their GEMM weights this way: `--precision w8` (quantize/weight_only.py
writes the DequantizeLinear steps) and onnxruntime-genai exports, whose 2/4/8-bit MatMulNBits weights
come out of genai_export.unpack as float32 plus their codes (`store_codes`). The executor runs the
DequantizeLinear steps once (they read weights only) for the rows the BLAS serves; `attach_codes`
hands the codes to the GEMM steps too, so decode rows stream a quarter of the float32 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..lower import Program
from ..runtime.kernels.quant import dequantize_linear
from ..runtime.row_quantized_gemm import ROW_QUANTIZED

BATCH_INVARIANT = ("infc", "BatchInvariant")
DEQUANTIZE = ("", "DequantizeLinear")


@dataclass(frozen=True)
class WeightCodes:
    codes: np.ndarray  # [K, N] uint8 or int8
    scale: np.ndarray  # [ceil(K / group), N] float32
    zero: np.ndarray  # like scale, of the codes' type
    group: int  # K rows per scale
    # the model quantizes the GEMM's activations too (quantize_dynamic): its steps then quantize
    # each row (runtime/row_quantized_gemm.py)
    row_quantized: bool = False

    @classmethod
    def of_rows(cls, parts: tuple[np.ndarray, np.ndarray, np.ndarray], k: int, group: int) -> WeightCodes:
        """From codes [N, >= K] and scales / zero points [N, blocks] (MatMulNBits' row-major parts)."""
        codes, scale, zero = parts
        return cls(np.ascontiguousarray(codes[:, :k].T), np.ascontiguousarray(scale.T), np.ascontiguousarray(zero.T), group)

    def dequantized(self) -> np.ndarray:
        """What the plan's DequantizeLinear step computes: its own kernel, (code - zero) * scale in float32."""
        return dequantize_linear([self.codes, self.scale, self.zero], {"axis": 0, "block_size": self.group}, None)[0]


def store_codes(program: Program, codes: dict[str, WeightCodes]) -> dict[str, WeightCodes]:
    """Replaces each float32 GEMM weight of `program` that `codes` restates exactly by its codes and a
    DequantizeLinear step (first in the program, with the other weight-only steps); returns those
    weights' codes by name.
    A weight the passes packed from several (gate and up projections side by side) takes their codes
    side by side; one they changed otherwise (transposed, scaled) keeps its float32 form."""
    pool = {name: parts for name, parts in codes.items() if name not in program.weights}  # packed by a pass
    steps, stored = [], {}
    for name in _gemm_weights(program):
        weight = program.weights[name]
        parts = codes.get(name) or _side_by_side(weight, pool)
        if parts is None or weight.shape != parts.codes.shape or not np.array_equal(weight, parts.dequantized()):
            continue
        del program.weights[name]
        inputs = [f"{name}/codes", f"{name}/scale", f"{name}/zero"]
        for input_name, value in zip(inputs, (parts.codes, parts.scale, parts.zero)):
            program.weights[input_name] = value
        steps.append({"op": "DequantizeLinear", "domain": "", "name": f"{name}/dequantize", "inputs": inputs,
                      "outputs": [name], "attrs": {"axis": 0, "block_size": parts.group}})
        stored[name] = parts
    program.steps[:0] = steps
    return stored


def _gemm_weights(program: Program) -> list[str]:
    """Float32 weights read as the weight of a decoder MatMul step."""
    names = []
    for step in program.steps:
        if (step.get("domain") or "", step["op"]) == BATCH_INVARIANT and len(step["inputs"]) == 2:
            name = step["inputs"][1]
            weight = program.weights.get(name)
            if weight is not None and weight.dtype == np.float32 and weight.ndim == 2 and name not in names:
                names.append(name)
    return names


def _side_by_side(weight: np.ndarray, pool: dict[str, WeightCodes]) -> WeightCodes | None:
    """The codes of `weight` as weights of the pool laid side by side along N, found by their values
    (the first column of each screens the candidates), or None."""
    k, n = weight.shape
    found, offset = [], 0
    while offset < n:
        for parts in pool.values():
            width = parts.codes.shape[1]
            if (parts.codes.shape[0] != k or offset + width > n or any(p is parts for p in found)
                    or (found and parts.group != found[0].group)):
                continue
            first = WeightCodes(parts.codes[:, :1], parts.scale[:, :1], parts.zero[:, :1], parts.group).dequantized()
            if np.array_equal(first[:, 0], weight[:, offset]):
                found.append(parts)
                offset += width
                break
        else:
            return None
    if len(found) < 2:
        return None
    return WeightCodes(*(np.concatenate([getattr(p, field) for p in found], axis=1) for field in ("codes", "scale", "zero")),
                       found[0].group, all(p.row_quantized for p in found))


def attach_codes(program: Program, stored: dict[str, WeightCodes] | None = None) -> int:
    """Gives each float32 MatMul step of the decoder whose weight a DequantizeLinear step of 8-bit codes
    blocked along K produces those codes as inputs 2-4 (attr `weight_group`), and the attr
    ROW_QUANTIZED to those whose codes (`stored`, from store_codes) say the model quantizes their
    activations, with one scale per column: those read the codes alone (input 1 empty), and a
    DequantizeLinear step no step reads any more leaves the program; returns how many."""
    row_quantized = {name for name, parts in (stored or {}).items() if parts.row_quantized and parts.group >= parts.codes.shape[0]}
    groups = {}
    for step in program.steps:
        if (step.get("domain") or "", step["op"]) == DEQUANTIZE:
            group = _codes_group(step, program.weights)
            if group:
                groups[step["outputs"][0]] = (step["inputs"][:3], group)
    count = 0
    for step in program.steps:
        attrs = step["attrs"]
        if ((step.get("domain") or "", step["op"]) != BATCH_INVARIANT or (attrs["inner_domain"], attrs["inner_op"]) != ("", "MatMul")
                or len(step["inputs"]) != 2 or step["inputs"][1] not in groups):
            continue
        inputs, group = groups[step["inputs"][1]]
        if step["inputs"][1] in row_quantized:  # the step reads the codes alone: no float32 weight is made
            step["inputs"] = [step["inputs"][0], "", *inputs]
            step["attrs"] = {**attrs, "weight_group": group, ROW_QUANTIZED: 1}
        else:
            step["inputs"] = [*step["inputs"], *inputs]
            step["attrs"] = {**attrs, "weight_group": group}
        count += 1
    read = {name for step in program.steps for name in step["inputs"]}
    program.steps[:] = [step for step in program.steps if (step.get("domain") or "", step["op"]) != DEQUANTIZE
                        or step["outputs"][0] in read or step["outputs"][0] not in groups]
    return count


def _codes_group(step: dict, weights: dict) -> int | None:
    """K rows per scale when the step dequantizes constant 8-bit codes [K, N] into float32, blocked
    along K, with zero points of the codes' type; None otherwise."""
    names = step["inputs"]
    if len(names) != 3 or not all(name in weights for name in names):
        return None
    codes, scale, zero = (weights[name] for name in names)
    attrs = step["attrs"]
    group = int(attrs.get("block_size", 0) or 0)
    if codes.dtype not in (np.int8, np.uint8) or codes.ndim != 2 or attrs.get("axis", 1) not in (0, -2) or group <= 0:
        return None
    if attrs.get("output_dtype") not in (None, 0, 1) or scale.dtype != np.float32 or zero.dtype != codes.dtype:
        return None
    blocks = (-(-codes.shape[0] // group), codes.shape[1])
    return group if scale.shape == blocks and zero.shape == blocks else None
