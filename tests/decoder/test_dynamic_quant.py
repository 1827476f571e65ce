"""Dynamically quantized decoders (onnxruntime's quantize_dynamic, as transformers.js ships
model_quantized.onnx: MatMulInteger + DynamicQuantizeLinear, uint8 / int8 weights, per tensor or per
channel): the build quantizes activations per token row (decoder/dynamic_quant.py), so a plan's
tokens match onnxruntime on the quantized file when onnxruntime too sees one row a step (the prompt
fed token by token), and stay bitwise the same alone, batched and chunked."""

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
from infc.compiler.verify import ort_session

from .conftest import PROFILES, assert_invariant_to_batch_and_chunks, build_plan, prompts, runner_greedy

NUM_TOKENS = 24
# (fixture, weight type, per channel): opset 17 (reductions with axes attributes) and 18 (axes inputs)
CASES = [("llama_ts", QuantType.QUInt8, False), ("llama_dynamo", QuantType.QInt8, True),
         ("hf/qwen2_optimum", QuantType.QUInt8, True)]


def quantized(name: str, weight_type, per_channel: bool, folder) -> str:
    path = folder / f"{name.replace('/', '_')}_quantized.onnx"
    quantize_dynamic(str(FIXTURES / f"{name}.onnx"), str(path), weight_type=weight_type, per_channel=per_channel)
    return str(path)


def ort_one_row_greedy(model_path: str, prompt: list[int], num_tokens: int) -> tuple[list[int], list[np.ndarray]]:
    """onnxruntime's past-KV loop on the quantized file, the prompt fed a token a step: every
    DynamicQuantizeLinear then sees one row, as the plan quantizes each row."""
    model = onnx.load(model_path)
    session = ort_session(model)
    past = [i for i in model.graph.input if i.name.startswith("past_key_values")]
    feeds = {i.name: np.zeros([1, i.type.tensor_type.shape.dim[1].dim_value, 0, i.type.tensor_type.shape.dim[3].dim_value],
                              np.float32) for i in past}
    names = [o.name for o in model.graph.output]
    tokens, logits, pending = [], [], list(prompt)
    for position in range(len(prompt) + num_tokens - 1):
        feeds.update(input_ids=np.array([[pending.pop(0)]], np.int64), position_ids=np.array([[position]]),
                     attention_mask=np.ones((1, position + 1), np.int64))
        out = dict(zip(names, session.run(names, feeds)))
        for info in past:
            feeds[info.name] = out[info.name.replace("past_key_values", "present")]
        if not pending:
            logits.append(out["logits"][0, -1])
            tokens.append(int(np.argmax(logits[-1])))
            pending = [tokens[-1]]
    return tokens, logits


@pytest.mark.parametrize("name,weight_type,per_channel", CASES)
def test_quantize_dynamic_decoder_matches_onnxruntime_row_by_row(name, weight_type, per_channel, tmp_path):
    path = quantized(name, weight_type, per_channel, tmp_path)
    plan = build_plan(path, PROFILES / "llama_decode.yaml", tmp_path)
    program = read_plan(plan).meta["program"]
    assert not any(s["op"] in ("DynamicQuantizeLinear", "MatMulInteger") for s in program)
    assert any("weight_group" in s["attrs"] for s in program)  # decode rows read the 8-bit codes
    runner = load_model_runner(plan)
    requests = prompts(3, runner.spec.vocab_size, seed=2, max_len=12)
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS)
    for prompt, ours, our_logits in zip(requests, tokens, logits):
        ref, ref_logits = ort_one_row_greedy(path, prompt, NUM_TOKENS)
        assert ours == ref
        np.testing.assert_allclose(np.array(our_logits), np.array(ref_logits), rtol=1e-4, atol=1e-4)


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
