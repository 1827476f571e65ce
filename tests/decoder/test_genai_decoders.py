"""Decoders converted by onnxruntime-genai's model builder (tests/models/genai/, made by
tests/models/make_genai_fixtures.py): GroupQueryAttention with packed QKV and rotary inside, no
position_ids input, SimplifiedLayerNormalization in the ONNX domain, and (int4) MatMulNBits weights.
The build unpacks them (compiler/decoder/genai_export.py) and pages the result: greedy tokens and
logits match onnxruntime running the export itself (int4: its fp32-accuracy kernel, which computes
from the same dequantized blocks; the default kernel, which rounds activations to int8, is within
about 1% of the logits' scale)."""

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from infc.compiler import model_io
from infc.compiler.decoder import model_folder
from infc.compiler.decoder.genai_export import dequantize_nbits, unpack
from infc.compiler.graph import import_graph
from infc.compiler.lower import lower_graph
from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.kernels import has_kernel
from infc.compiler.plan.format import read_plan
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.testing import FIXTURES

from .conftest import PROFILES, assert_greedy_matches_ort, build_plan, ort_greedy, prompts, runner_greedy

GENAI = FIXTURES / "genai"
NUM_REQUESTS, NUM_TOKENS = 4, 32


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """llama_decode.yaml without position_ids: the export takes input_ids and attention_mask."""
    path = tmp_path_factory.mktemp("genai_profile") / "decode.yaml"
    path.write_text("\n".join(line for line in (PROFILES / "llama_decode.yaml").read_text().splitlines()
                              if "position_ids" not in line) + "\n")
    return path


def _accuracy_fp32(source, folder):
    """The export with MatMulNBits computing in fp32 (accuracy_level 0) instead of int8 activations."""
    model = onnx.load(source)
    for node in model.graph.node:
        for attribute in node.attribute:
            if attribute.name == "accuracy_level":
                attribute.i = 0
    path = folder / "fp32_accuracy.onnx"
    onnx.save(model, path)
    return path


def test_a_genai_fp32_export_matches_onnxruntime(profile, tmp_path):
    source = GENAI / "llama_fp32.onnx"
    model_io.load_model(source)  # SimplifiedLayerNormalization in the ONNX domain: onnxruntime's, accepted
    runner = load_model_runner(build_plan(source, profile, tmp_path))
    assert "position_ids" in runner._dtypes  # the positions GroupQueryAttention derived, fed by the runtime
    requests = prompts(NUM_REQUESTS, runner.spec.vocab_size, seed=1)
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS, chunk_sizes=[7, 40, 3, 16], budget=64)
    assert_greedy_matches_ort(source, requests, tokens, logits, NUM_TOKENS)


def test_separate_query_key_and_value_are_read_as_such(profile, tmp_path):
    """Qwen3 normalizes q and k per head before attention: the builder gives GroupQueryAttention
    three inputs instead of a packed one."""
    source = GENAI / "qwen3_fp32.onnx"
    assert any(n.op_type == "GroupQueryAttention" and n.input[1] for n in onnx.load(source).graph.node)
    runner = load_model_runner(build_plan(source, profile, tmp_path))
    requests = prompts(NUM_REQUESTS, runner.spec.vocab_size, seed=3)
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS, budget=128)
    assert_greedy_matches_ort(source, requests, tokens, logits, NUM_TOKENS)


def test_a_soft_cap_reaches_the_paged_attention(profile, tmp_path):
    """Gemma 2 conversions set GroupQueryAttention's softcap: it rides on the unpacked attention into
    PagedAttention (whose soft-capping the Gemma 2 export tests check against onnxruntime)."""
    model = onnx.load(GENAI / "llama_fp32.onnx")
    for node in model.graph.node:
        for attribute in node.attribute:
            if node.op_type == "GroupQueryAttention" and attribute.name == "softcap":
                attribute.f = 30.0
    onnx.save(model, tmp_path / "capped.onnx")
    program = read_plan(build_plan(tmp_path / "capped.onnx", profile, tmp_path)).meta["program"]
    assert [s["attrs"].get("softcap") for s in program if s["op"] == "PagedAttention"] == [30.0, 30.0]


def test_a_genai_int4_export_computes_its_dequantized_weights(profile, tmp_path):
    source = GENAI / "llama_int4.onnx"
    runner = load_model_runner(build_plan(source, profile, tmp_path))
    requests = prompts(NUM_REQUESTS, runner.spec.vocab_size, seed=2)
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS, budget=128)
    assert_greedy_matches_ort(_accuracy_fp32(source, tmp_path), requests, tokens, logits, NUM_TOKENS)
    for prompt, ours in zip(requests, logits):  # onnxruntime's default kernel quantizes activations to int8
        _, ref = ort_greedy(source, prompt, 1)
        assert np.abs(ours[0] - ref[0]).max() <= 3e-2 * np.abs(ref[0]).max()  # about 1% on these weights


@pytest.mark.parametrize("bits, block, zero_points", [(4, 32, None), (4, 16, "packed"), (8, 32, "packed"), (4, 16, "float")])
def test_nbits_weights_dequantize_as_onnxruntime_reads_them(bits, block, zero_points):
    rng = np.random.default_rng(bits + block)
    n, k = 24, 40  # K not a multiple of the block: the last block is padded
    k_blocks, blob = -(-k // block), block * bits // 8
    packed = rng.integers(0, 256, (n, k_blocks, blob), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, (n * k_blocks,)).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(packed, "b"), onnx.numpy_helper.from_array(scales, "s")]
    zp = None
    if zero_points == "packed":
        zp = rng.integers(0, 256, (n * -(-k_blocks * bits // 8),), dtype=np.uint8)
    elif zero_points == "float":
        zp = rng.uniform(4, 12, (n * k_blocks,)).astype(np.float32)
    if zp is not None:
        inits.append(onnx.numpy_helper.from_array(zp, "z"))
    node = helper.make_node("MatMulNBits", ["a", "b", "s"] + (["z"] if zp is not None else []), ["y"], domain="com.microsoft",
                            K=k, N=n, bits=bits, block_size=block, accuracy_level=0)
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    a = rng.standard_normal((3, k)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    weight = dequantize_nbits(packed, scales, zp, n, k, bits, block)
    np.testing.assert_allclose(a @ weight.T, want, rtol=1e-5, atol=1e-5)
    unpacked = unpack(model)  # and as the build rewrites the node: a MatMul by that weight
    got = ort.InferenceSession(unpacked.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_chat_template_and_eos_ids_come_from_the_files_beside_the_model(profile, tmp_path):
    """onnxruntime-genai and Hugging Face folders keep them in files, not in the model's metadata."""
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(GENAI / "llama_fp32.onnx", folder / "model.onnx")
    assert model_folder.chat_template(folder / "model.onnx") is None and model_folder.eos_token_ids(folder / "model.onnx") == []
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ messages }}"}]}))
    (folder / "config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    (folder / "genai_config.json").write_text(json.dumps({"model": {"eos_token_id": 2}}))
    assert model_folder.chat_template(folder / "model.onnx") == "{{ messages }}"
    assert model_folder.eos_token_ids(folder / "model.onnx") == [2]  # genai_config.json first
    decoder = read_plan(build_plan(folder / "model.onnx", profile, tmp_path)).meta["decoder"]
    assert decoder["chat_template"] == "{{ messages }}" and decoder["eos_token_ids"] == [2]
    (folder / "chat_template.jinja").write_text("{{ jinja }}")
    assert model_folder.chat_template(folder / "model.onnx") == "{{ jinja }}"


@pytest.mark.parametrize("opset, kept_as", [(21, "DequantizeLinear"), (17, "Gather")])
def test_a_block_quantized_embedding_gathers_its_codes_or_its_dequantized_table(opset, kept_as):
    """Tied int4 embeddings: GatherBlockQuantized over a Reshape of the LM head's MatMulNBits blocks.
    From opset 21 the rows' codes are gathered and dequantized (blocked DequantizeLinear); before, the
    rows of a float32 table. Either way the values are onnxruntime's, bit for bit."""
    rng = np.random.default_rng(5)
    vocab, k, block = 20, 64, 32
    packed = rng.integers(0, 256, (vocab, k // block, block // 2), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, (vocab, k // block)).astype(np.float32)
    shape = helper.make_node("Constant", [], ["shape"], value=onnx.numpy_helper.from_array(np.array([vocab, k // 2], np.int64)))
    nodes = [shape, helper.make_node("Reshape", ["blocks", "shape"], ["table"]),
             helper.make_node("GatherBlockQuantized", ["table", "ids", "scales"], ["y"], domain="com.microsoft",
                              bits=4, block_size=block, gather_axis=0, quantize_axis=1)]
    graph = helper.make_graph(nodes, "embed", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, k])],
                              [onnx.numpy_helper.from_array(packed, "blocks"), onnx.numpy_helper.from_array(scales, "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    ids = np.array([[0, 3, 19, 3, 7]], np.int64)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    unpacked = unpack(model)
    ops = [n.op_type for n in unpacked.graph.node]
    assert "GatherBlockQuantized" not in ops and ops[-1] == kept_as
    got = ort.InferenceSession(unpacked.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    np.testing.assert_array_equal(got, want)
    program = lower_graph(import_graph(unpacked), has_kernel)
    np.testing.assert_array_equal(Executor(program.steps, program.weights, opset).run({"ids": ids})["y"], want)  # infc's too
