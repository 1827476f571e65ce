"""Round trips through the low type in fp16 / bf16 plans, as one device launch.

A reduced-precision program (compiler/build_precision.py) computes in fp32 and stores in the low
type, so between two ops it says `y = Cast(x, to=low)` then `z = Cast(y, to=float32)`. On the device
each Cast is a launch and a pass over memory; where `y` feeds nothing but that one Cast back, the
pair is the single op `z = RoundTo(x, to=low)`: fp32 in, fp32 out, every value rounded to the
nearest low-type value (ties to even, NaN kept, overflow to inf), exactly what the two Casts give.

Rounding is idempotent, so a RoundTo whose input already holds low-type values is dropped and its
readers read the input (elide_repeated_rounding): a RoundTo's own output, a 16-bit GEMM site's output
(rounded by cuBLAS, or by the site after a generated tile: runtime/cuda/gemm.py), and data movement of
such values (a reshape or transpose between two casts). In a bf16 BERT-style encoder that is 10 of the
17 RoundTo launches a layer.
"""

from __future__ import annotations

import functools

import numpy as np

from ..kernels.common import np_dtype

ROUND_OP = ("infc.cuda", "RoundTo")
LOW_TYPES = {10: "float16", 16: "bfloat16"}  # ONNX TensorProto codes
LOW_CODES = {name: code for code, name in LOW_TYPES.items()}
TO_FLOAT32 = 1

# bf16 round-to-nearest-even on the fp32 bits: add 0x7FFF plus the kept half's lowest bit, drop the
# low 16 bits. NaN is kept as is (the carry could turn a NaN with only low payload bits into inf).
_BF16_CUDA = ("unsigned int u = __float_as_uint(x);"
              "y = isnan(x) ? x : __uint_as_float((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u)")
# The GPU's own conversions, round to nearest even both ways (subnormals, inf and NaN as the hardware
# does). CuPy's `float16` type is not usable here: with CUDA 13 NVRTC rejected it as an incomplete type
# (H200, 2026-11-30), so the body names no CuPy type at all.
_F16_CUDA = ('unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));'
             'asm("cvt.f32.f16 %0, %1;" : "=f"(y) : "h"(h))')
BODIES = {"float16": _F16_CUDA, "bfloat16": _BF16_CUDA}


def fold_cast_pairs(placed: list[tuple[int, dict]], host_values: set[str], keep: set[str]) -> list[tuple[int, dict]]:
    """`placed` (program index, step) with every foldable pair merged into the first Cast's slot; the
    second Cast is dropped. `host_values` stay as they are (shape arithmetic runs on the host) and so do
    values in `keep` (graph outputs)."""
    consumers: dict[str, list[int]] = {}
    for position, (_, step) in enumerate(placed):
        for name in step["inputs"]:
            if name:
                consumers.setdefault(name, []).append(position)
    folded, dropped = {}, set()
    for position, (_, step) in enumerate(placed):
        to = (step.get("attrs") or {}).get("to")
        if _is_cast(step) and to in LOW_TYPES and step["inputs"][0] not in host_values:
            low = step["outputs"][0]
            users = consumers.get(low, [])
            if len(users) == 1 and low not in keep:
                back = placed[users[0]][1]
                if _is_cast(back) and (back.get("attrs") or {}).get("to") == TO_FLOAT32:
                    folded[position] = {"op": ROUND_OP[1], "domain": ROUND_OP[0], "name": step.get("name", ""),
                                        "inputs": [step["inputs"][0]], "outputs": list(back["outputs"]),
                                        "attrs": {"to": to}}
                    dropped.add(users[0])
    return [(index, folded.get(position, step)) for position, (index, step) in enumerate(placed)
            if position not in dropped]


# Ops that only move or select values: their outputs hold values of their data inputs (by position;
# None: every input). The other inputs are shapes, axes or indexes.
MOVEMENT_DATA_INPUTS = {"Reshape": (0,), "Transpose": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "Flatten": (0,),
                        "Split": (0,), "Slice": (0,), "Identity": (0,), "Expand": (0,), "Gather": (0,),
                        "Tile": (0,), "Concat": None}


def elide_repeated_rounding(placed: list[tuple[int, dict]], rounded: dict[str, int],
                            keep: set[str]) -> list[tuple[int, dict]]:
    """`placed` without the RoundTo steps whose input already holds values of their type; their
    readers read that input instead. `rounded`: values known to hold low-type values (name -> type
    code), such as GEMM outputs rounded by cuBLAS. Values in `keep` (graph outputs) stay."""
    rounded, rename, kept = dict(rounded), {}, []
    for index, step in placed:
        inputs = [rename.get(name, name) for name in step["inputs"]]
        if inputs != list(step["inputs"]):
            step = {**step, "inputs": inputs}
        domain, op = step.get("domain") or "", step["op"]
        if (domain, op) == ROUND_OP:
            to, source, target = step["attrs"]["to"], inputs[0], step["outputs"][0]
            if rounded.get(source) == to and target not in keep:
                rename[target] = source
                continue
            rounded[target] = to
        elif domain == "" and op in MOVEMENT_DATA_INPUTS:
            positions = MOVEMENT_DATA_INPUTS[op]
            data = [n for n in inputs if n] if positions is None else [inputs[i] for i in positions if i < len(inputs)]
            types = {rounded.get(name) for name in data}
            if data and len(types) == 1 and None not in types:
                to = types.pop()
                rounded.update((name, to) for name in step["outputs"] if name)
        kept.append((index, step))
    return kept


def _is_cast(step: dict) -> bool:
    return (step.get("domain") or "") in ("", "ai.onnx") and step["op"] == "Cast"


def round_to(inputs, attrs, ctx):
    """The device op: fp32 -> fp32 rounded to the low type."""
    x = inputs[0]
    to = int(attrs["to"])
    if ctx.xp is np or x.dtype != np.float32:  # the stand-in device, or a value that is not fp32 after all
        return [x.astype(np_dtype(to)).astype(x.dtype if x.dtype.kind == "f" else np.float32)]
    return [_cupy_kernel(to)(x)]


def round_in_place(x, low: str) -> None:
    """Rounds an fp32 device array to the low type's values where it lies (a 16-bit GEMM site's output)."""
    if isinstance(x, np.ndarray):  # the stand-in device
        x[...] = x.astype(np_dtype(LOW_CODES[low])).astype(np.float32)
    else:
        _cupy_kernel(LOW_CODES[low])(x, x)


@functools.cache
def _cupy_kernel(to: int):
    import cupy  # noqa: PLC0415 - GPU machines only

    return cupy.ElementwiseKernel("float32 x", "float32 y", BODIES[LOW_TYPES[to]], f"infc_round_to_{LOW_TYPES[to]}")


def round_bf16_bits(x: np.ndarray) -> np.ndarray:
    """_BF16_CUDA's arithmetic in NumPy (tests compare it with ml_dtypes' rounding)."""
    u = x.astype(np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(x), x, rounded)


ROUNDING = {ROUND_OP: round_to}
