"""`infc build --target cuda` of a decoder plan: the paged program of decoder/plan.py, run by the
device executor (runtime/cuda/) with the KV pools on the GPU.

What the device side adds to the program:
    weights     weight-only steps (a genai export's MatMulNBits codes, DequantizeLinear of weights)
                are folded into float32 weights here: the device executor has no memo for steps
                that read weights only, and would redo them every step on the host;
    row kernels the plan's norms launch the fixed row kernels (codegen/row_kernels.py), compiled
                for the device's architecture and stored as cubin sections, as one-shot plans do;
    meta        meta["cuda"] as plan_loader reads it (no tuned GEMM sites: decoder GEMMs are
                infc.BatchInvariant steps, run as xp.matmul by runtime/cuda/ops_paged.py).
Then the build's safety net: one prefill step and one mixed step (a decode behind another
sequence's prefill) through the device runner against the CPU runner on the same program, logits
within SELF_CHECK_RTOL. Batch invariance is not promised on the device (decoder["batch_invariant"]).
"""

from __future__ import annotations

import numpy as np

from .. import build_cuda
from ..errors import InfcError
from ..lower import Program
from ..plan.format import Plan
from ..runtime.decode_api import SeqChunk
from ..runtime.executor import Executor
from ..runtime.kernels import kernel_for
from ..runtime.kernels.common import KernelContext, decode_attrs
from ..runtime.model_runner import PagedModelRunner
from ..runtime.row_quantized_gemm import ROW_QUANTIZED

SELF_CHECK_RTOL = 1e-4  # float32 attention sums on the device against float64 ones on the CPU
SELF_CHECK_SEED = 31
WEIGHT_STEP_OPS = {("", "DequantizeLinear")}


class DeviceSelfCheckFailed(InfcError):
    """The device runner's logits differ from the CPU runner's on the build's own steps."""


def fold_weight_steps(program: Program) -> int:
    """Runs the steps that read only weights (WEIGHT_STEP_OPS) into weights, drops them and the codes
    the GEMM steps were also handed (their weight_group inputs); returns how many were folded."""
    folded = 0
    for step in list(program.steps):
        key = (step.get("domain") or "", step["op"])
        if key not in WEIGHT_STEP_OPS or not all(name in program.weights for name in step["inputs"] if name):
            continue
        inputs = [program.weights[name] if name else None for name in step["inputs"]]
        outputs = kernel_for(*key)(inputs, decode_attrs(step.get("attrs") or {}), KernelContext(program.opset))
        program.weights.update(zip(step["outputs"], outputs))
        program.steps.remove(step)
        folded += 1
    for step in program.steps:
        if "weight_group" in (step.get("attrs") or {}):
            group = step["attrs"].pop("weight_group")
            if step["attrs"].pop(ROW_QUANTIZED, None):  # the codes alone: the device's GEMM takes their float32 weight
                name = f"{step['inputs'][2]}/dequantized"
                if name not in program.weights:
                    parts = [program.weights[n] for n in step["inputs"][2:5]]
                    program.weights[name] = kernel_for("", "DequantizeLinear")(
                        parts, {"axis": 0, "block_size": group}, KernelContext(program.opset))[0]
                step["inputs"][1] = name
            step["inputs"] = step["inputs"][:2]
    used = {name for step in program.steps for name in step["inputs"]}
    for name in [n for n in program.weights if n not in used]:
        del program.weights[name]
    return folded


def device_plan(program: Program, decoder: dict, fingerprint: dict, options, log) -> tuple[dict, dict]:
    """(meta["cuda"], cubin sections) of a checked device decoder plan; `program` loses its weight-only steps."""
    from ..codegen.plan_kernels import compile_rows  # noqa: PLC0415

    folded = fold_weight_steps(program)
    if folded:
        log(f"cuda: {folded} weight-only steps folded into float32 weights (the device computes in float32)")
    sections, rows = compile_rows(program, fingerprint["arch"], build_cuda.cubin_cache(options.cache_dir), log)
    cuda = {"kernels": {}, "gemms": [], "chains": {}, "rows": rows, "host_ops": build_cuda.host_ops(program)}
    check = self_check(program, decoder, cuda, sections, fingerprint)
    log(f"cuda self-check: logits within {check['max_rel_diff']:.2g} of the CPU runner's (prefill and mixed steps)"
        + (f"; host fallback for {', '.join(cuda['host_ops'])}" if cuda["host_ops"] else ""))
    decoder["batch_invariant"] = False
    return {**cuda, "self_check": check}, sections


def self_check(program: Program, decoder: dict, cuda: dict, sections: dict, fingerprint: dict) -> dict:
    from ..runtime.cuda.plan_loader import device_executor  # noqa: PLC0415

    outputs = [o["name"] for o in program.outputs]
    meta = {"program": program.steps, "outputs": program.outputs, "opset": program.opset, "target": fingerprint,
            "cuda": cuda}
    executor = device_executor(Plan("cuda self-check", meta, {**sections, **program.islands}), program.weights)
    runners = [PagedModelRunner(executor, decoder, program.inputs, device=executor.backend),
               PagedModelRunner(Executor(program.steps, program.weights, program.opset, program.islands,
                                         output_names=outputs), decoder, program.inputs)]
    rng = np.random.default_rng(SELF_CHECK_SEED)
    vocab, block = decoder["vocab_size"], decoder["block_size"]
    length = max(2, min(block + 3, decoder["max_model_len"] - 1))  # past one block where the model allows
    prompt, other = (rng.integers(0, vocab, n).tolist() for n in (length, 5))
    first = list(range(-(-(length + 1) // block)))
    second = list(range(len(first), len(first) + -(-len(other) // block)))
    steps = [[SeqChunk(0, prompt, 0, first, True)],
             [SeqChunk(1, other, 0, second, True), SeqChunk(0, [int(rng.integers(vocab))], length, first, True)]]
    for runner in runners:
        runner.allocate_kv(len(first) + len(second))
    worst = 0.0
    for index, chunks in enumerate(steps):
        got, want = (np.asarray(runner.step(chunks), np.float64) for runner in runners)
        diff = float(np.abs(got - want).max()) / max(float(np.abs(want).max()), np.finfo(np.float32).tiny)
        if not diff <= SELF_CHECK_RTOL:  # NaN fails too
            raise DeviceSelfCheckFailed(f"cuda self-check: step {index + 1}'s logits differ from the CPU runner's by "
                                        f"{diff:.3g} relative (limit {SELF_CHECK_RTOL:g})")
        worst = max(worst, diff)
    return {"max_rel_diff": worst, "seed": SELF_CHECK_SEED, "steps": len(steps)}
