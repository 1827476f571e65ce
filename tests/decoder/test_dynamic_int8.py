"""`infc build --precision int8` of a decoder (compiler/decoder/dynamic_int8.py): MatMul weights stored as
int8 codes with a scale per output channel, every GEMM quantizing its activations per token at run
time. The plan is about a quarter of the fp32 weights' bytes, keeps the fp32 plan's greedy tokens on
the fixtures, and a sequence's logits still do not depend on its batch or its prefill chunks."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from infc.compiler.build import BuildOptions, build
from infc.compiler.build_precision import PrecisionSettings
from infc.compiler.decoder.dynamic_int8 import quantize_decoder_int8
from infc.compiler.lower import Program
from infc.compiler.plan.format import read_plan
from infc.compiler.quantize.w8_sensitivity import TeacherForced
from infc.compiler.quantize.greedy_agreement import agreement, runner_greedy_tokens, seeded_prompts
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.runtime.row_quantized_gemm import ROW_QUANTIZED
from infc.compiler.testing import FIXTURES

from .conftest import PROFILES, assert_invariant_to_batch_and_chunks, prompts


def _build(tmp_path, name: str, precision: str, lm_head: str = "auto"):
    plan = tmp_path / f"{name}-{precision}-{lm_head}.plan"
    build(str(FIXTURES / f"{name}.onnx"), str(PROFILES / f"{name.split('_')[0]}_decode.yaml"), str(plan),
          BuildOptions(use_cache=False, show_progress=False, precision=precision,
                       precision_settings=PrecisionSettings(lm_head=lm_head)))
    return plan


def _head_step(meta) -> dict:
    """The step writing the logits output (the LM head GEMM on these fixtures)."""
    return next(s for s in meta["program"] if s["outputs"] == [meta["decoder"]["logits"]])


# gpt2_dynamo's only weight of 4,096 elements or more is its LM head: quantized with --lm-head int8
@pytest.mark.parametrize("name, lm_head", [("llama_ts", "auto"), ("gpt2_dynamo", "int8")])
def test_int8_decoder_plan_quantizes_weights_and_rows_and_keeps_greedy_tokens(tmp_path, name, lm_head):
    fp32_plan, int8_plan = _build(tmp_path, name, "fp32"), _build(tmp_path, name, "int8", lm_head)
    meta = read_plan(int8_plan).meta
    int8 = meta["precision"]["int8_per_token"]
    head = _head_step(meta)
    if lm_head == "auto":  # kept float32: its GEMM reads the float32 weight, no codes
        assert int8["lm_head"] == {"weight": head["inputs"][1], "kept_fp32": True} and int8["kept_fp32"] == [head["inputs"][1]]
        assert meta["weights"][head["inputs"][1]]["dtype"] == "float32" and not head["attrs"].get(ROW_QUANTIZED)
    else:
        assert int8["lm_head"]["kept_fp32"] is False and head["attrs"][ROW_QUANTIZED] == 1 and int8["kept_fp32"] == []
    gemms = [s for s in meta["program"] if (s["attrs"] or {}).get(ROW_QUANTIZED)]
    assert int8["num_weights"] > 0 and len(gemms) == int8["gemms_quantizing_rows"] >= int8["num_weights"]
    assert all(s["inputs"][1] == "" and meta["weights"][s["inputs"][2]]["dtype"] == "int8" for s in gemms)  # codes alone
    assert int8["bytes_int8"] <= 0.27 * int8["bytes_fp32"]  # int8 plus one scale and zero point per column
    assert meta["precision"]["accuracy"]["greedy"]["agreement"] >= 0.9
    runners = [load_model_runner(p) for p in (fp32_plan, int8_plan)]
    seeded = seeded_prompts(meta["decoder"]["vocab_size"], 8, 9)
    tokens = [runner_greedy_tokens(runner, seeded, 16) for runner in runners]
    assert agreement(*tokens)["agreement"] >= 0.9
    requests = prompts(4, meta["decoder"]["vocab_size"], seed=5, max_len=40)
    assert_invariant_to_batch_and_chunks(runners[1], requests, 6, 2, [5, 13, 7, 30], 64)


def _gemm(x, w, y):
    return {"op": "BatchInvariant", "domain": "infc", "name": y, "inputs": [x, w], "outputs": [y],
            "attrs": {"inner_op": "MatMul", "inner_domain": "", "const_inputs": [1]}}


def test_int8_leaves_a_weight_other_steps_read_fp32():
    """A tied LM head whose table a Gather also reads (the embedding): quantizing it would change the
    embeddings, so it keeps fp32; the other weight becomes codes read by its GEMM alone."""
    rng = np.random.default_rng(2)
    tied, own = rng.standard_normal((64, 128)).astype(np.float32), rng.standard_normal((64, 128)).astype(np.float32)
    steps = [{"op": "Gather", "domain": "", "name": "embed", "inputs": ["tied", "ids"], "outputs": ["e"], "attrs": {"axis": 0}},
             _gemm("h", "tied", "logits"), _gemm("h", "own", "y")]
    program = Program(steps, {"tied": tied, "own": own}, [], [], 17, {})
    report = quantize_decoder_int8(program)
    assert report["num_weights"] == 1 and np.array_equal(program.weights["tied"], tied)
    assert "own" not in program.weights and program.weights["own/codes"].dtype == np.int8
    gemm = next(s for s in program.steps if s["outputs"] == ["y"])
    assert gemm["inputs"][:2] == ["h", ""] and gemm["attrs"][ROW_QUANTIZED] == 1
    assert next(s for s in program.steps if s["outputs"] == ["logits"])["inputs"] == ["h", "tied"]
    assert report["skipped"] == {"also read by a step that is not a GEMM weight": 1}


def test_int8_keeps_the_lm_head_fp32_by_default_and_inspect_says_so(tmp_path):
    """The head is the GEMM whose output becomes the logits (decoder/lm_head.py): kept float32 by
    default; --lm-head int8 quantizes it like the rest, and the plan's logits move by more."""
    kept, quantized = _build(tmp_path, "llama_ts", "int8"), _build(tmp_path, "llama_ts", "int8", "int8")
    metas = [read_plan(p).meta for p in (kept, quantized)]
    entries = [m["precision"]["int8_per_token"] for m in metas]
    assert entries[1]["num_weights"] == entries[0]["num_weights"] + 1
    assert entries[0]["bytes_fp32"] + entries[0]["kept_fp32_bytes"] == entries[1]["bytes_fp32"]
    head = _head_step(metas[0])["inputs"][1]
    assert entries[1]["lm_head"] == {"weight": head, "kept_fp32": False} and head not in metas[1]["weights"]
    shown = subprocess.run([sys.executable, "-m", "infc.cli", "inspect", str(kept)], capture_output=True, text=True)
    assert shown.returncode == 0 and f"int8: LM head {head} float32" in shown.stdout
    # closer to the fp32 plan's next-token distribution with the head in float32, teacher-forced on
    # the fp32 plan's own greedy tokens
    fp32 = load_model_runner(_build(tmp_path, "llama_ts", "fp32"))
    seeded = seeded_prompts(metas[0]["decoder"]["vocab_size"], 4, 12, seed=3)
    tokens = runner_greedy_tokens(fp32, seeded, 8)
    reference = TeacherForced(fp32, seeded, tokens).log_probs()
    kl = [float((np.exp(reference) * (reference - TeacherForced(load_model_runner(p), seeded, tokens).log_probs()))
                .sum(-1).mean()) for p in (kept, quantized)]
    assert kl[0] < kl[1], kl
