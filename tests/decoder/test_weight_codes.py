"""Decoder GEMM weights kept as 8-bit codes (compiler/decoder/weight_codes.py): the plan stores the
codes of onnxruntime-genai's quantized weights (also when a pass packed two of them side by side)
and of `--precision w8`, and hands them to the GEMM steps, whose decode rows read them. A sequence's
logits still do not depend on its batch or its prefill chunks: decode rows (codes) and prefill rows
(the BLAS on the dequantized weights) sum alike."""

import numpy as np
import pytest

from infc.compiler.decoder.weight_codes import WeightCodes, attach_codes, store_codes
from infc.compiler.lower import Program
from infc.compiler.plan.format import read_plan
from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.testing import FIXTURES

from .conftest import assert_invariant_to_batch_and_chunks, build_plan, prompts
from .test_genai_decoders import profile  # noqa: F401 - the fixture

GROUP = 16


def _codes(rng, k, n) -> WeightCodes:
    blocks = -(-k // GROUP)
    return WeightCodes(rng.integers(0, 16, (k, n)).astype(np.uint8), rng.random((blocks, n), dtype=np.float32),
                       rng.integers(0, 16, (blocks, n)).astype(np.uint8), GROUP)


def _gemm(x, w, y):
    return {"op": "BatchInvariant", "domain": "infc", "name": y, "inputs": [x, w], "outputs": [y],
            "attrs": {"inner_op": "MatMul", "inner_domain": "", "const_inputs": [1]}}


def test_weights_restated_by_codes_are_stored_as_codes_and_read_by_their_gemms():
    rng = np.random.default_rng(0)
    k = 40  # not a multiple of the group: the last group is short
    a, b, c, d = (_codes(rng, k, n) for n in (24, 8, 16, 24))
    packed = np.concatenate([b.dequantized(), c.dequantized()], axis=1)  # a pass laid b and c side by side
    changed = d.dequantized() * 2  # a pass scaled d: its codes no longer restate it
    program = Program([_gemm("x", "A", "ya"), _gemm("x", "BC", "ybc"), _gemm("x", "D", "yd")],
                      {"A": a.dequantized(), "BC": packed, "D": changed}, [], [], 17)
    reference = Executor(program.steps, dict(program.weights), 17, output_names=["ya", "ybc", "yd"])
    assert len(store_codes(program, {"A": a, "B": b, "C": c, "D": d})) == 2
    assert attach_codes(program) == 2
    assert program.weights["A/codes"].dtype == np.uint8 and "A" not in program.weights
    assert np.array_equal(program.weights["BC/codes"], np.concatenate([b.codes, c.codes], axis=1))
    assert program.weights["D"] is changed and "D/codes" not in program.weights
    gemms = {s["outputs"][0]: s for s in program.steps if s["op"] == "BatchInvariant"}
    assert gemms["ya"]["attrs"]["weight_group"] == GROUP and len(gemms["ya"]["inputs"]) == 5
    assert "weight_group" not in gemms["yd"]["attrs"]
    coded = Executor(program.steps, program.weights, 17, output_names=["ya", "ybc", "yd"])
    for rows in (1, 3, 20):
        x = rng.standard_normal((rows, k)).astype(np.float32)
        expected, got = reference.run({"x": x}), coded.run({"x": x})
        assert all(np.array_equal(expected[name], got[name]) for name in expected)


def test_codes_of_another_layout_are_not_attached():
    rng = np.random.default_rng(1)
    codes = _codes(rng, 32, 8)
    weights = {"q": codes.codes, "s": codes.scale, "z": codes.zero.astype(np.int8)}  # zero of another type
    steps = [{"op": "DequantizeLinear", "domain": "", "name": "dq", "inputs": ["q", "s", "z"], "outputs": ["W"],
              "attrs": {"axis": 0, "block_size": GROUP}}, _gemm("x", "W", "y")]
    assert attach_codes(Program(steps, weights, [], [], 17)) == 0
    steps[0]["attrs"] = {"axis": 1, "block_size": GROUP}  # blocked along N
    weights["z"] = codes.zero
    assert attach_codes(Program(steps, weights, [], [], 17)) == 0
    steps[0]["attrs"] = {"axis": 0, "block_size": GROUP}
    assert attach_codes(Program(steps, weights, [], [], 17)) == 1


def test_a_genai_int4_plan_reads_codes_and_keeps_batch_invariance(profile, tmp_path):  # noqa: F811
    plan = build_plan(FIXTURES / "genai" / "llama_int4.onnx", profile, tmp_path)
    meta = read_plan(plan).meta
    gemms = [s for s in meta["program"] if s["op"] == "BatchInvariant"]
    assert gemms and all("weight_group" in s["attrs"] for s in gemms)
    assert not any(s["inputs"][1] in meta["weights"] for s in gemms)  # no float32 GEMM weight in the plan
    runner = load_model_runner(plan)
    requests = prompts(8, runner.spec.vocab_size, seed=7, max_len=40)
    assert_invariant_to_batch_and_chunks(runner, requests, 10, num_alone=2, chunk_sizes=[3, 5, 16] * 3, budget=48)


@pytest.mark.parametrize("name", ["llama_ts"])
def test_w8_plans_hand_their_int8_codes_to_the_gemms(name, tmp_path):
    from infc.compiler.build import BuildOptions, build

    from .conftest import PROFILES

    plan = tmp_path / "w8.plan"
    build(str(FIXTURES / f"{name}.onnx"), str(PROFILES / "llama_decode.yaml"), str(plan),
          BuildOptions(use_cache=False, show_progress=False, precision="w8"))
    meta = read_plan(plan).meta
    coded = [s for s in meta["program"] if "weight_group" in s["attrs"]]
    assert len(coded) == meta["precision"]["w8"]["num_weights"] > 0
    assert all(meta["weights"][s["inputs"][2]]["dtype"] == "int8" for s in coded)
