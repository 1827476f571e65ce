"""Dynamically quantized decoders (onnxruntime's quantize_dynamic, as transformers.js ships
model_quantized.onnx: MatMulInteger + DynamicQuantizeLinear, uint8 / int8 weights, per tensor or per
channel): the build makes each a float32 GEMM on the exactly dequantized weight
(decoder/dynamic_quant.py), so a plan's tokens and logits match onnxruntime on that float32-activation
counterpart, stay near onnxruntime's on the quantized file itself (its activations rounded to 8 bits),
and are bitwise the same alone, batched and chunked."""

import numpy as np
import onnx
import pytest
from onnx import helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from infc.compiler.decoder.dynamic_quant import fold_dynamic_quantization
from infc.compiler.errors import BadInput
from infc.compiler.plan.format import read_plan
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.testing import FIXTURES

from .conftest import (PROFILES, assert_greedy_matches_ort, assert_invariant_to_batch_and_chunks, build_plan, ort_greedy,
                       prompts, runner_greedy)

NUM_TOKENS = 24
# (fixture, weight type, per channel): TorchScript (opset 17), dynamo and Optimum (opset 18) exports
CASES = [("llama_ts", QuantType.QUInt8, False), ("llama_dynamo", QuantType.QInt8, True),
         ("hf/qwen2_optimum", QuantType.QUInt8, True)]


def quantized(name: str, weight_type, per_channel: bool, folder) -> str:
    path = folder / f"{name.replace('/', '_')}_quantized.onnx"
    quantize_dynamic(str(FIXTURES / f"{name}.onnx"), str(path), weight_type=weight_type, per_channel=per_channel)
    return str(path)


@pytest.mark.parametrize("name,weight_type,per_channel", CASES)
def test_quantize_dynamic_decoder_matches_its_float32_activation_counterpart(name, weight_type, per_channel, tmp_path):
    path = quantized(name, weight_type, per_channel, tmp_path)
    plan = build_plan(path, PROFILES / "llama_decode.yaml", tmp_path)
    program = read_plan(plan).meta["program"]
    assert not any(s["op"] in ("DynamicQuantizeLinear", "MatMulInteger") for s in program)
    assert any("weight_group" in s["attrs"] for s in program)  # decode rows read the 8-bit codes
    counterpart = tmp_path / "float_activations.onnx"
    onnx.save(fold_dynamic_quantization(onnx.load(path), {}), counterpart)
    runner = load_model_runner(plan)
    requests = prompts(3, runner.spec.vocab_size, seed=2, max_len=12)
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS)
    assert_greedy_matches_ort(counterpart, requests, tokens, logits, NUM_TOKENS)
    for prompt, our_logits in zip(requests, logits):  # the quantized file: activation rounding apart
        _, ref_logits = ort_greedy(path, prompt, 1)
        assert np.abs(our_logits[0] - ref_logits[0]).max() < 0.25 * np.abs(ref_logits[0]).max()


def test_quantize_dynamic_decoder_is_batch_and_chunk_invariant(tmp_path):
    path = quantized("llama_ts", QuantType.QUInt8, False, tmp_path)
    runner = load_model_runner(build_plan(path, PROFILES / "llama_decode.yaml", tmp_path))
    requests = prompts(4, runner.spec.vocab_size, seed=3)
    assert_invariant_to_batch_and_chunks(runner, requests, 8, num_alone=2, chunk_sizes=[7, 5, 16, 3], budget=24)


def test_a_dynamic_quantizer_read_outside_a_matmul_is_refused(tmp_path):
    model = onnx.load(quantized("llama_ts", QuantType.QUInt8, False, tmp_path))
    quantizer = next(n for n in model.graph.node if n.op_type == "DynamicQuantizeLinear")
    model.graph.node.append(helper.make_node("Identity", [quantizer.output[0]], ["leaked"], name="leak"))
    model.graph.output.append(helper.make_tensor_value_info("leaked", onnx.TensorProto.UINT8, None))
    with pytest.raises(BadInput, match=rf"DynamicQuantizeLinear '{quantizer.name}' is read by 'leak' \(Identity\)"):
        fold_dynamic_quantization(model, {})
