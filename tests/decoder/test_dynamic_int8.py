"""`infc build --precision int8` of a decoder (compiler/decoder/dynamic_int8.py): MatMul weights stored as
int8 codes with a scale per output channel, every GEMM quantizing its activations per token at run
time. The plan is about a quarter of the fp32 weights' bytes, keeps the fp32 plan's greedy tokens on
the fixtures, and a sequence's logits still do not depend on its batch or its prefill chunks."""

from __future__ import annotations

import numpy as np
import pytest

from infc.compiler.build import BuildOptions, build
from infc.compiler.decoder.dynamic_int8 import quantize_decoder_int8
from infc.compiler.lower import Program
from infc.compiler.plan.format import read_plan
from infc.compiler.quantize.greedy_agreement import agreement, runner_greedy_tokens, seeded_prompts
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.runtime.row_quantized_gemm import ROW_QUANTIZED
from infc.compiler.testing import FIXTURES

from .conftest import PROFILES, assert_invariant_to_batch_and_chunks, prompts


def _build(tmp_path, name: str, precision: str):
    plan = tmp_path / f"{name}-{precision}.plan"
    build(str(FIXTURES / f"{name}.onnx"), str(PROFILES / f"{name.split('_')[0]}_decode.yaml"), str(plan),
          BuildOptions(use_cache=False, show_progress=False, precision=precision))
    return plan


@pytest.mark.parametrize("name", ["llama_ts", "gpt2_dynamo"])
def test_int8_decoder_plan_quantizes_weights_and_rows_and_keeps_greedy_tokens(tmp_path, name):
    fp32_plan, int8_plan = _build(tmp_path, name, "fp32"), _build(tmp_path, name, "int8")
    meta = read_plan(int8_plan).meta
    int8 = meta["precision"]["int8_per_token"]
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
