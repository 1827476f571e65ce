"""The paged form of the decoder fixtures (TorchScript, dynamo, opset-23 Attention), the plan's
decoder metadata, and the build errors for what is not a recognized decoder."""

from pathlib import Path

import numpy as np
import onnx
import pytest

from infc.compiler.build import BuildOptions, build
from infc.compiler.decoder.canonicalize import canonicalize
from infc.compiler.decoder.mask_check import probes
from infc.compiler.decoder.plan import _attention_rejections
from infc.compiler.decoder.sites import find_sites
from infc.compiler.errors import BadInput
from infc.compiler.graph import import_graph
from infc.compiler.optimize import optimize_model
from infc.compiler.plan.format import read_plan
from infc.compiler.plan_report import plan_report
from infc.compiler.runtime.decode_api import SeqChunk
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.testing import FIXTURES

from .conftest import DECODERS, PROFILES, build_plan, ort_greedy, prompts, runner_greedy


def paged(model: onnx.ModelProto):
    optimized = optimize_model(model)
    graph = import_graph(optimized.model)
    sites = find_sites(graph, _attention_rejections(optimized))
    return graph, sites, canonicalize(graph, sites, 16, "logits", probes(128, 64))


@pytest.mark.parametrize("name", DECODERS)
def test_attention_becomes_paged_and_the_kv_cache_leaves_the_graph(name):
    graph, sites, info = paged(onnx.load(FIXTURES / f"{name}.onnx"))
    ops = [n.op for n in graph.nodes]
    assert ops.count("PagedAttention") == len(sites) == 2
    assert not {"MultiHeadAttention", "Attention", "Softmax"} & set(ops)
    assert [t.name for t in graph.outputs] == ["logits"] and info["gathers_logits"]
    assert info["inputs"] == ["input_ids", "position_ids", "infc.slot_mapping", "infc.block_tables",
                              "infc.query_start_loc", "infc.context_lens", "infc.kv.0.key", "infc.kv.0.value",
                              "infc.kv.1.key", "infc.kv.1.value", "infc.logits_indices"]  # the mask subgraph died
    kv_heads = 2 if name.startswith("llama") else 4
    assert all(s.num_heads == 4 and s.kv_num_heads == kv_heads and s.head_dim == 16 for s in sites)


@pytest.mark.parametrize("name", ["llama_ts", "gpt2_dynamo"])
def test_opset_23_attention_plans_match_onnxruntime(name, tmp_path):
    model = onnx.version_converter.convert_version(onnx.load(FIXTURES / f"{name}.onnx"), 23)
    model.ir_version = 10
    onnx.save(model, tmp_path / "model.onnx")
    plan = build_plan(tmp_path / "model.onnx", PROFILES / f"{name.split('_')[0]}_decode.yaml", tmp_path)
    assert "PagedAttention" in [s["op"] for s in read_plan(plan).meta["program"]]
    from infc.compiler.runtime.model_runner import load_model_runner

    requests = prompts(4, 128, seed=3)
    tokens, _ = runner_greedy(load_model_runner(plan), requests, 12)
    assert tokens == [ort_greedy(tmp_path / "model.onnx", p, 12)[0] for p in requests]


def test_plan_records_the_model_spec(decoder_plans):
    meta = read_plan(decoder_plans["llama_ts"]).meta
    assert meta["kind"] == "decoder"
    decoder = meta["decoder"]
    assert {k: decoder[k] for k in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size",
                                   "max_model_len", "block_size", "eos_token_ids")} == {
        "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "vocab_size": 128,
        "max_model_len": 512, "block_size": 16, "eos_token_ids": []}
    assert meta["profile"]["decode"]["max_num_batched_tokens"] == 256
    assert {s["op"] for s in meta["program"]} >= {"BatchInvariant", "PagedAttention"}
    assert not {"MatMul", "Gemm"} & {s["op"] for s in meta["program"]}
    report = plan_report(decoder_plans["llama_ts"])["decoder"]  # what `infc inspect PLAN` says
    assert report["num_layers"] == 2 and report["float64_gemms"] == 0
    assert report["batch_invariant_gemms"] == sum(s["op"] == "BatchInvariant" for s in meta["program"])
    assert report["gemm_invariance"].startswith("float32 through a BLAS recipe")


def _build(tmp_path: Path, model: str, profile: Path):
    return build(str(FIXTURES / model), str(profile), str(tmp_path / "x.plan"), BuildOptions(use_cache=False, show_progress=False))


@pytest.mark.parametrize("model, message", [
    ("cnn_ts.onnx", "not a recognized decoder: no attention node fused: the model has no Softmax at all .* a recurrent"),
    # attention without a KV cache is paged too, but only where it is causal: an encoder's is not
    ("bert_ts.onnx", "with 0 past and 64 new tokens its mask lets a query see keys after it"),
])
def test_a_model_that_is_not_a_decoder_fails_the_build(tmp_path, model, message):
    profile = tmp_path / "no_positions.yaml"
    profile.write_text("\n".join(line for line in (PROFILES / "llama_decode.yaml").read_text().splitlines()
                                 if "position_ids" not in line))
    with pytest.raises(BadInput, match=message):
        _build(tmp_path, model, profile)


def test_max_model_len_past_the_models_position_table_is_bad_input(tmp_path):
    """GPT-2's learned positions have 256 rows: a profile asking for 300 positions was an internal
    error (exit 1) from the Gather the build's probe at position 299 ran."""
    profile = tmp_path / "long.yaml"
    profile.write_text((PROFILES / "gpt2_decode.yaml").read_text().replace("max_model_len: 256", "max_model_len: 300"))
    with pytest.raises(BadInput, match=rf"^{profile}: decode.max_model_len 300 is past what the model supports: "
                                       r"with 295 past and 5 new tokens \(positions up to 299\), Gather .* index 29\d "
                                       "is out of bounds for axis 0 with size 256"):
        _build(tmp_path, "gpt2_ts.onnx", profile)


def test_decode_profile_needs_max_model_len(tmp_path):
    profile = tmp_path / "p.yaml"
    profile.write_text("\n".join(line for line in (PROFILES / "llama_decode.yaml").read_text().splitlines()
                                 if "max_model_len" not in line))
    with pytest.raises(BadInput, match="decode.max_model_len: required"):
        _build(tmp_path, "llama_ts.onnx", profile)


def test_profile_may_list_past_inputs_and_must_not_name_unknown_ones(tmp_path):
    listed = tmp_path / "listed.yaml"
    listed.write_text((PROFILES / "llama_decode.yaml").read_text().replace(
        "  position_ids: [1, tokens]", "  position_ids: [1, tokens]\n  past_key_values.0.key: [1, 2, 0, 16]"))
    _build(tmp_path, "llama_ts.onnx", listed)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(listed.read_text().replace("past_key_values.0.key", "past.0.key"))
    with pytest.raises(BadInput, match="the model has no input named 'past.0.key'"):
        _build(tmp_path, "llama_ts.onnx", unknown)


def test_decoder_plans_are_fp32(tmp_path):
    with pytest.raises(BadInput, match="--precision fp16: decoder plans are fp32"):
        build(str(FIXTURES / "llama_ts.onnx"), str(PROFILES / "llama_decode.yaml"), str(tmp_path / "x.plan"),
              BuildOptions(precision="fp16", use_cache=False, show_progress=False))


def test_a_bfloat16_export_builds_as_its_float32_counterpart(tmp_path):
    model = onnx.load(FIXTURES / "llama_ts.onnx")  # as if exported in bfloat16: its logits cast to it
    logits = model.graph.output[0]
    model.graph.node.append(onnx.helper.make_node("Cast", [logits.name], ["logits_bf16"], to=onnx.TensorProto.BFLOAT16))
    logits.name, logits.type.tensor_type.elem_type = "logits_bf16", onnx.TensorProto.BFLOAT16
    onnx.save(model, tmp_path / "half.onnx")
    report = build(str(tmp_path / "half.onnx"), str(PROFILES / "llama_decode.yaml"), str(tmp_path / "half.plan"),
                   BuildOptions(use_cache=False, show_progress=False))
    assert report["export_dtype"] == "bfloat16"
    build(str(FIXTURES / "llama_ts.onnx"), str(PROFILES / "llama_decode.yaml"), str(tmp_path / "float.plan"),
          BuildOptions(use_cache=False, show_progress=False))
    chunks = [SeqChunk(0, [3, 1, 4, 1, 5], 0, [0], True), SeqChunk(1, [9, 2], 0, [1], True)]
    half, full = (load_model_runner(tmp_path / name) for name in ("half.plan", "float.plan"))
    for runner in (half, full):
        runner.allocate_kv(4)
    got, want = half.step(chunks), full.step(chunks)
    assert got.dtype == np.float32 and np.array_equal(got, want)  # the cast became float32's: no rounding