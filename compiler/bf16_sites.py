"""Which float32 values of a program hold bf16 values: the GEMMs that may run on bf16 tiles.

Why: a bf16 plan (build_precision.py) computes each GEMM in float32 from its activation rounded to
bf16 (`Cast(Cast(x, bfloat16), float32)`) and its weight rounded at build time (fp32 constants
holding bf16 values). A bf16 GEMM kernel (runtime/amx_gemm.py, runtime/bf16_gemm.py) rounds its
activation to bf16 itself, which changes nothing on such a value, and nothing else may take it:
a GEMM the self-repair pinned to fp32 reads unrounded values. So a site qualifies by what the
program says about its activation (below) and by its weight's bits (`bf16_gemm.is_bf16_valued`).

A value holds bf16 values when it is
    Cast(to=float32) of a bfloat16 value          (a bf16 value between ops, or a bf16 graph input)
    a RoundTo(to=bfloat16)                        (the executor's fold of that Cast pair)
    data movement of such values                  (MOVERS: each output value is an input value)
"""

from __future__ import annotations

from .runtime.cast_fold import LOW_CODES, TO_FLOAT32

BF16 = LOW_CODES["bfloat16"]
# ops whose data outputs are values of their data inputs (the first one, or all for Concat)
MOVERS = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Split", "Slice", "Expand",
          "Gather", "Concat"}
ROUND_OPS = {("infc.cpu", "RoundTo"), ("infc.cuda", "RoundTo")}


def rounded_by_readers(steps: list[dict], name: str, outputs: set[str]) -> bool:
    """Every reader of value `name` casts it to bfloat16 first (and it is no graph output): the step
    that writes it may round it to bf16 itself, which changes nothing the program reads."""
    readers = [step for step in steps if name in step["inputs"]]
    return bool(readers) and name not in outputs and all(
        step["op"] == "Cast" and (step.get("domain") or "") == "" and (step.get("attrs") or {}).get("to") == BF16
        for step in readers)


def bf16_valued(steps: list[dict], inputs: list[dict]) -> set[str]:
    """Names of float32 values (and bfloat16 ones) that hold bf16 values only, in program order."""
    low = {i["name"] for i in inputs if i.get("dtype") == "bfloat16"}  # bfloat16 values
    valued: set[str] = set()
    for step in steps:
        op, domain = step["op"], step.get("domain") or ""
        to = (step.get("attrs") or {}).get("to")
        data = [name for name in step["inputs"] if name]
        if domain == "" and op == "Cast":
            if to == BF16:
                low.update(step["outputs"])
            elif to == TO_FLOAT32 and data and data[0] in low:
                valued.update(step["outputs"])
        elif (domain, op) in ROUND_OPS and to == BF16:
            valued.update(step["outputs"])
        elif domain == "" and op in MOVERS and data:
            sources = data if op == "Concat" else data[:1]
            if all(name in valued for name in sources):
                valued.update(step["outputs"])
            elif all(name in low for name in sources):
                low.update(step["outputs"])
    return valued
