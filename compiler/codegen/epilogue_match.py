"""Which work after a GEMM site its launch can do itself: the generated kernels' epilogue (bias ->
activation -> residual add, templates/common.cuh) applied to the accumulator before the store.

    MatMul(x, W) ─► Add(·, b) ─► Relu|Gelu|BiasGelu ─► Add(·, r) ─► y        (any prefix, in this order)
    Gemm(x, W, c)                                                             c: the bias (alpha = beta = 1)
    Conv|FusedConv(x, W, B)                                                   B and a Relu activation (no Z)

An ElementwiseChain step (lower_fuse.py) is read as the steps it holds; it is absorbed whole or not at
all. A value is absorbed only when one step reads it and it is not a program output, so nothing else
can see the intermediates the fused launch never writes. Convolutions stop at their own bias and
activation: the GEMM's (pixels, channels) rows are transposed afterwards, a residual is not.

A 16-bit site of an fp16 / bf16 plan (`through_low`) writes values its program rounds to the low type
next: MatMul -> Cast(low) -> Cast(float32) -> Add(·, b) -> ... Its epilogue may take that round trip
too: the bias (and activation, as BiasGelu) is added to the fp32 accumulator and the result is rounded
once, by the rounding the program does after the Add, where the plan as written rounds twice. That is
what an fp16 GEMM with a fused bias computes on cuBLAS or TensorRT (fp32 epilogue, one conversion), and
it saves a launch and a pass over the output per site. Without a stage to absorb, the round trip stays
and the site rounds its own output (GemmSpec.rounded_to).

The CPU program is left as it is; the match is recorded in the plan (meta["cuda"]["gemms"][i]["epilogue"])
and the device executor runs the site's step in place of the absorbed ones (runtime/cuda/gemm.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.cuda.gemm import EpilogueSpec

ACTIVATION_OF = {("", "Relu"): "relu", ("", "Gelu"): "gelu", ("com.microsoft", "Gelu"): "gelu"}
CONV_ACTIVATION = {"Relu": "relu"}
STAGES = ("bias", "act", "residual")
TO_FLOAT32 = 1  # ONNX TensorProto.FLOAT


@dataclass(frozen=True)
class _Op:
    """One elementwise operation after the site: a step, or one op of a chain step."""
    key: tuple[str, str]
    inputs: tuple
    attrs: dict


def _ops_of(step: dict) -> list[tuple[_Op, str]]:
    """(op, result) pairs; a chain's inner results get names no other step can read."""
    key = (step.get("domain") or "", step["op"])
    if key != ("infc.cpu", "ElementwiseChain"):
        return [(_Op(key, tuple(step["inputs"]), step.get("attrs") or {}), step["outputs"][0])]
    ops, results = [], []
    for k, op in enumerate(step["attrs"]["ops"]):
        names = tuple(None if a is None else step["inputs"][a] if a >= 0 else results[-1 - a] for a in op["args"])
        results.append(step["outputs"][0] if k == len(step["attrs"]["ops"]) - 1 else f"{step['outputs'][0]}#{k}")
        ops.append((_Op((op.get("domain") or "", op["op"]), names, op.get("attrs") or {}), results[-1]))
    return ops


def _classify(op: _Op, value: str, weights: dict, n: int, is_residual) -> tuple[dict, int] | None:
    """({"bias"|"act"|"residual": ...}, its stage) when `op` applied to `value` is an epilogue stage."""
    others = [x for x in op.inputs if x != value]
    if op.key in ACTIVATION_OF and len(op.inputs) == 1:
        if op.key == ("", "Gelu") and op.attrs.get("approximate", "none") != "none":
            return None
        return {"act": ACTIVATION_OF[op.key]}, 1
    if op.key == ("com.microsoft", "BiasGelu") and op.inputs[0] == value and _is_bias(weights.get(op.inputs[1]), n):
        return {"bias": op.inputs[1], "act": "gelu"}, 1
    if op.key == ("", "Add") and len(op.inputs) == 2 and len(others) == 1:
        if _is_bias(weights.get(others[0]), n):
            return {"bias": others[0]}, 0
        if others[0] not in weights and is_residual(others[0]):
            return {"residual": others[0]}, 2
    return None


def _is_bias(weight, n: int) -> bool:
    return weight is not None and weight.dtype == np.float32 and weight.shape == (n,)


def match_epilogue(steps: list[dict], index: int, weights: dict, n: int, output_names, shapes_by_level,
                   through_low: int | None = None) -> EpilogueSpec | None:
    """The site's epilogue; `through_low` (an ONNX type code): a 16-bit site whose output the program
    rounds to that type first (see the module docstring)."""
    step = steps[index]
    key, attrs = (step.get("domain") or "", step["op"]), step.get("attrs") or {}
    found: dict = {}
    if key in (("", "Conv"), ("com.microsoft", "FusedConv")):
        if len(step["inputs"]) > 2 and _is_bias(weights.get(step["inputs"][2]), n):
            found["bias"] = step["inputs"][2]
        has_z = len(step["inputs"]) > 3 and bool(step["inputs"][3])
        act = CONV_ACTIVATION.get(attrs.get("activation") or "")
        if act and not has_z and "bias" in found:  # the epilogue adds the bias before activating
            found["act"] = act
        return EpilogueSpec(**found, own=tuple(found), output=step["outputs"][0]) if found else None
    if key == ("", "Gemm"):
        if float(attrs.get("alpha", 1.0)) != 1.0:
            return None
        if len(step["inputs"]) > 2 and step["inputs"][2]:
            if float(attrs.get("beta", 1.0)) != 1.0 or not _is_bias(weights.get(step["inputs"][2]), n):
                return None
            found["bias"] = step["inputs"][2]
    own = tuple(found)
    readers: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        for name in s["inputs"]:
            if name:
                readers.setdefault(name, []).append(i)
    value, stage, absorbed = step["outputs"][0], (0 if found else -1), []
    produced_at = {name: i for i, s in enumerate(steps) for name in s["outputs"] if name}
    hidden = {value}  # values the fused launch never writes
    if through_low is not None:
        round_trip = None if own else _round_trip(steps, readers, value, through_low, output_names)
        if round_trip is None:
            return None
        absorbed.extend(round_trip)
        value = steps[round_trip[-1]]["outputs"][0]
        hidden.update(steps[i]["outputs"][0] for i in round_trip)

    def is_residual(name: str) -> bool:  # ready when the site runs, visible, the output's shape
        return (produced_at.get(name, -1) < index and name not in hidden
                and _same_shape(name, step["outputs"][0], shapes_by_level))

    while value not in output_names and len(readers.get(value, [])) == 1:
        reader = readers[value][0]
        taken, current, last = {}, value, stage
        for op, result in _ops_of(steps[reader]):
            hit = _classify(op, current, weights, n, is_residual) if current in op.inputs else None
            if hit is None or hit[1] <= last or set(hit[0]) & (set(found) | set(taken)):
                taken = None
                break
            taken.update(hit[0])
            current, last = result, hit[1]
            hidden.add(result)
        if not taken:
            break
        found.update(taken)
        absorbed.append(reader)
        value, stage = steps[reader]["outputs"][0], last
    if not found:  # nothing to do after the GEMM (a round trip alone stays the program's)
        return None
    return EpilogueSpec(**found, own=own, absorbed=tuple(absorbed), output=value)


def _round_trip(steps: list[dict], readers: dict, value: str, low: int, output_names) -> list[int] | None:
    """[Cast(value, low), Cast(that, float32)] as step indices when those are `value`'s only readers."""
    trip, current = [], value
    for to in (low, TO_FLOAT32):
        if current in output_names or len(readers.get(current, [])) != 1:
            return None
        reader = readers[current][0]
        cast = steps[reader]
        if (cast.get("domain") or "", cast["op"]) != ("", "Cast") or (cast.get("attrs") or {}).get("to") != to:
            return None
        trip.append(reader)
        current = cast["outputs"][0]
    return trip


def _same_shape(name: str, like: str, shapes_by_level) -> bool:
    """At every profile level, `name` is float32 with the GEMM output's shape (no broadcasting)."""
    for shapes in shapes_by_level.values():
        a, b = shapes.get(name), shapes.get(like)
        if a is None or b is None or tuple(a[0]) != tuple(b[0]) or a[1] != "float32":
            return False
    return True
