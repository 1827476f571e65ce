"""Half-precision decoders whose inputs and outputs stayed float32 (onnxconverter-common's
convert_float_to_float16(keep_io_types=True), transformers.js' model_fp16.onnx): float16 weights and
a Cast at every input and output. They are served as their float32 counterpart, as half exports are
(decoder/float32_export.py)."""

import onnx
from onnx import TensorProto, helper

from infc.compiler.decoder.float32_export import as_float32, half_kind
from infc.compiler.plan.format import read_plan
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.testing import FIXTURES

from .conftest import assert_greedy_matches_ort, build_plan, prompts, runner_greedy
from .test_hf_decoders import _profile

HALF_EXPORT = FIXTURES / "hf" / "qwen2_dynamo_fp16.onnx"


def keep_io_types(model: onnx.ModelProto) -> onnx.ModelProto:
    """The half model behind float32 inputs and outputs, as keep_io_types writes it: a Cast from
    each float32 input to float16, and from each float16 result to its float32 output."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    casts = []
    for value in graph.input:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT16:
            inner = f"{value.name}_cast_to_fp16"
            for node in graph.node:
                node.input[:] = [inner if name == value.name else name for name in node.input]
            casts.append(helper.make_node("Cast", [value.name], [inner], to=TensorProto.FLOAT16))
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    for value in graph.output:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT16:
            inner = f"{value.name}_fp16"
            for node in graph.node:
                node.output[:] = [inner if name == value.name else name for name in node.output]
            casts.append(helper.make_node("Cast", [inner], [value.name], to=TensorProto.FLOAT))
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    graph.node.extend(casts)
    return out


def test_a_half_graph_with_float32_inputs_and_outputs_is_served_in_float32(tmp_path):
    model = keep_io_types(onnx.load(HALF_EXPORT))
    assert half_kind(model) == "float16"
    path = tmp_path / "model_fp16.onnx"
    onnx.save(model, path)
    plan = build_plan(path, _profile(tmp_path, 128), tmp_path)
    assert read_plan(plan).meta["decoder"]["export_dtype"] == "float16"
    widened = tmp_path / "model_fp32.onnx"
    onnx.save(as_float32(model), widened)
    runner = load_model_runner(plan)
    requests = prompts(4, runner.spec.vocab_size, seed=1)
    tokens, logits = runner_greedy(runner, requests, 32, budget=128)
    assert_greedy_matches_ort(widened, requests, tokens, logits, 32)


def test_a_float32_model_is_not_taken_for_a_half_one():
    assert half_kind(onnx.load(FIXTURES / "llama_ts.onnx")) is None
