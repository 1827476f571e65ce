"""The LM head of a lowered decoder program: the GEMM whose output becomes the logits, found by the
graph's structure (never by a weight's name).

    h ─► GEMM(h, W_head) ─► [Cast | Reshape | ... | Mul/Div/Tanh by constants]* ─► logits (graph output)

Walking back from the logits output, data movement steps are followed through their data input and
elementwise steps through their one runtime input (the other operands are weights: a logit
multiplier, a soft-cap's constants); the first GEMM reached with a weight as its B is the head.
Anything else on the way (a second runtime operand, an op not listed) ends the walk: no head.

Why it matters: quantizing the head's weight perturbs every logit at once, and the greedy token
is the arg-max over them; vLLM and llama.cpp keep the output projection in higher precision.
"""

from __future__ import annotations

from ..quantize.weight_only import GEMM_OPS, gemm_key

# --lm-head: auto keeps the head float32 for int8 (per-token activations) and leaves it to the
# sensitivity selection for w8 (measured on SmolLM2: docs/quantization.md); fp32 / int8 force either
LM_HEAD_CHOICES = ("auto", "fp32", "int8")
AUTO = {"int8": "fp32", "w8": None}  # None: w8's sensitivity selection decides

FOLLOW_DATA_INPUT = {"Cast", "Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Expand"}
FOLLOW_ONE_RUNTIME_INPUT = {"Mul", "Div", "Add", "Sub", "Tanh", "Softcap"}  # logit multipliers, soft-caps


def lm_head_weight(program, logits: str) -> str | None:
    """The name of the weight the LM head GEMM reads as its B, or None when the walk finds no head."""
    producers = {out: step for step in program.steps for out in step["outputs"] if out}
    name = logits
    while (step := producers.get(name)) is not None:
        op, inputs = step["op"], step["inputs"]
        if gemm_key(step) in GEMM_OPS:
            return inputs[1] if len(inputs) > 1 and inputs[1] in program.weights else None
        if (step.get("domain") or "") != "":
            return None
        if op in FOLLOW_DATA_INPUT:
            name = inputs[0]
            continue
        runtime = [i for i in inputs if i and i not in program.weights]
        if op not in FOLLOW_ONE_RUNTIME_INPUT or len(runtime) != 1:
            return None
        name = runtime[0]
    return None


def keeps_head_fp32(choice: str, precision: str) -> bool | None:
    """True: the head stays float32; False: it is quantized with the rest; None (w8's auto): the
    sensitivity selection decides, as for any other weight."""
    resolved = AUTO.get(precision) if choice == "auto" else choice
    return None if resolved is None else resolved == "fp32"
