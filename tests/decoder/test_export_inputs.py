"""Inputs newer transformers exports take besides the usual three: cache_position (each token's
position, [S]), token_type_ids (segment 0 while generating) and logits_to_keep (the rows whose
logits the LM head computes: fed as infc.logits_indices, decoder/logits_rows.py). Each is made
in-test on the llama_dynamo fixture, as the export writes it, and the plan matches onnxruntime's
greedy loop on that file; a profile written for the three usual inputs still builds them."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infc.compiler.decoder.canonicalize import LOGITS_INDICES
from infc.compiler.errors import BadInput
from infc.compiler.plan.format import read_plan
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.testing import FIXTURES

from .conftest import PROFILES, assert_greedy_matches_ort, build_plan, prompts, runner_greedy

SOURCE = FIXTURES / "llama_dynamo.onnx"


def _input(name: str, elem_type, dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, dims)


def positions_from_cache_position(model: onnx.ModelProto) -> onnx.ModelProto:
    """position_ids replaced by cache_position [S] (transformers: position_ids = cache_position[None])."""
    graph = model.graph
    kept = [i for i in graph.input if i.name != "position_ids"]
    del graph.input[:]
    graph.input.extend([*kept, _input("cache_position", TensorProto.INT64, ["sequence_length"])])
    graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), "batch_axis"))
    graph.node.insert(0, helper.make_node("Unsqueeze", ["cache_position", "batch_axis"], ["position_ids"]))
    return model


def token_type_embeddings(model: onnx.ModelProto) -> onnx.ModelProto:
    """GPT-2's way: the token type's embedding (a row of its own table) added to the token's."""
    graph = model.graph
    embed = next(n for n in graph.node if n.op_type == "Gather" and n.input[1] == "input_ids")
    width = next(t for t in graph.initializer if t.name == embed.input[0]).dims[1]
    table = np.random.default_rng(0).normal(0, 0.5, (2, width)).astype(np.float32)
    graph.initializer.append(numpy_helper.from_array(table, "token_type_table"))
    graph.input.append(_input("token_type_ids", TensorProto.INT64, ["batch_size", "sequence_length"]))
    tokens = embed.output[0]
    embed.output[0] = "token_embedding"
    at = list(graph.node).index(embed) + 1
    graph.node.insert(at, helper.make_node("Gather", ["token_type_table", "token_type_ids"], ["type_embedding"]))
    graph.node.insert(at + 1, helper.make_node("Add", ["token_embedding", "type_embedding"], [tokens]))
    return model


def rows_to_keep(model: onnx.ModelProto, dims) -> onnx.ModelProto:
    """The LM head on hidden[:, logits_to_keep] (transformers with a tensor logits_to_keep)."""
    graph = model.graph
    head = next(n for n in graph.node if "logits" in n.output)
    graph.input.append(_input("logits_to_keep", TensorProto.INT64, dims))
    graph.node.insert(list(graph.node).index(head), helper.make_node(
        "Gather", [head.input[0], "logits_to_keep"], ["kept_rows"], axis=1))
    head.input[0] = "kept_rows"
    return model


@pytest.mark.parametrize("make", [positions_from_cache_position, token_type_embeddings,
                                  lambda m: rows_to_keep(m, ["num_logits"])], ids=["cache_position", "token_type_ids", "logits_to_keep"])
def test_newer_export_inputs_match_onnxruntime(make, tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(make(onnx.load(SOURCE)), path)
    plan = build_plan(path, PROFILES / "llama_decode.yaml", tmp_path)  # lists only the usual three
    runner = load_model_runner(plan)
    requests = prompts(4, runner.spec.vocab_size, seed=1)
    tokens, logits = runner_greedy(runner, requests, 32)
    assert_greedy_matches_ort(path, requests, tokens, logits, 32)


def test_logits_to_keep_is_the_runners_logits_rows(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(rows_to_keep(onnx.load(SOURCE), ["num_logits"]), path)
    meta = read_plan(build_plan(path, PROFILES / "llama_decode.yaml", tmp_path)).meta
    assert meta["decoder"]["gathers_logits"] and LOGITS_INDICES in [i["name"] for i in meta["inputs"]]
    assert "logits_to_keep" not in [i["name"] for i in meta["inputs"]]


def test_a_scalar_logits_to_keep_is_refused(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(rows_to_keep(onnx.load(SOURCE), []), path)
    with pytest.raises(BadInput, match="input 'logits_to_keep' is a scalar row index: it picks one row of a step"):
        build_plan(path, PROFILES / "llama_decode.yaml", tmp_path)
