"""onnxruntime's EmbedLayerNormalization expanded into Gather/Add/LayerNormalization and its mask
index into a count of ones: exact against onnxruntime on the original; a BERT-shaped chain as the
transformers optimizer writes it (EmbedLayerNormalization's mask index into Attention) runs on
infc's own kernels."""

import numpy as np
import pytest
from onnx import helper

from infc.compiler.graph import import_graph
from infc.compiler.lower import lower_graph
from infc.compiler.optimize import optimize_model
from infc.compiler.passes.expand import embed_layernorm
from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.kernels import has_kernel
from infc.compiler.testing import assert_matches_ort, make_model, rule_stats, run_rules
from infc.compiler.verify import ort_session

F32, I32 = np.float32, np.int32
MS = [("com.microsoft", 1)]
B, S, D, N, VOCAB = 2, 6, 16, 4, 11


def _tables(rng):
    return {"word": rng.standard_normal((VOCAB, D)).astype(F32), "pos": rng.standard_normal((32, D)).astype(F32),
            "seg": rng.standard_normal((2, D)).astype(F32), "gamma": rng.standard_normal(D).astype(F32),
            "beta": rng.standard_normal(D).astype(F32)}


def _feeds(with_segments=True, with_positions=False):
    rng = np.random.default_rng(1)
    feeds = {"ids": rng.integers(0, VOCAB, (B, S)).astype(I32),
             "mask": np.array([[1] * S, [1, 1, 1, 0, 1, 0]], I32)}  # mask_index counts ones: [6, 4]
    if with_segments:
        feeds["seg_ids"] = rng.integers(0, 2, (B, S)).astype(I32)
    if with_positions:
        feeds["pos_ids"] = rng.integers(0, 32, (B, S)).astype(I32)
    return feeds


def _embed_model(with_segments=True, with_positions=False, opset=17):
    names = ["ids", "seg_ids" if with_segments else "", "word", "pos", "seg" if with_segments else "", "gamma", "beta",
             "mask"] + (["pos_ids"] if with_positions else [])
    node = helper.make_node("EmbedLayerNormalization", names, ["y", "mask_index", "sum"], domain="com.microsoft",
                            epsilon=1e-5)
    inputs = [(n, I32, ["batch", "seq"]) for n in _feeds(with_segments, with_positions)]
    outputs = [("y", F32, ["batch", "seq", D]), ("mask_index", I32, ["batch"]), ("sum", F32, ["batch", "seq", D])]
    return make_model([node], inputs, outputs, _tables(np.random.default_rng(0)), opset=opset, extra_opsets=MS)


@pytest.mark.parametrize("with_segments,with_positions", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("opset", [12, 17])
def test_embed_layernorm_becomes_its_parts(with_segments, with_positions, opset):
    model = _embed_model(with_segments, with_positions, opset)
    result = run_rules(model, embed_layernorm.RULES)
    assert rule_stats(result, "expand_embed_layernorm") == (1, {})
    assert "EmbedLayerNormalization" not in [n.op_type for n in result.model.graph.node]
    assert_matches_ort(model, result.model, feeds=_feeds(with_segments, with_positions), rtol=1e-6)


def test_mask_index_without_a_mask_is_left_alone():
    node = helper.make_node("EmbedLayerNormalization", ["ids", "", "word", "pos", "", "gamma", "beta"], ["y", "mask_index"],
                            domain="com.microsoft")
    model = make_model([node], [("ids", I32, ["batch", "seq"])], [("y", F32, ["batch", "seq", D]), ("mask_index", I32, ["batch"])],
                       _tables(np.random.default_rng(0)), extra_opsets=MS)
    result = run_rules(model, embed_layernorm.RULES)
    assert rule_stats(result, "expand_embed_layernorm") == (0, {"mask_index is read but no mask is given": 1})


def _quantized_embed_model():
    """QEmbedLayerNormalization: uint8 tables and norm parameters with scalar scales and zero points."""
    tables = _tables(np.random.default_rng(0))
    inits, names = {}, ["ids", "seg_ids"]
    for key in ("word", "pos", "seg", "gamma", "beta"):
        scale = np.float32(np.abs(tables[key]).max() / 127)
        inits[key] = np.clip(np.round(tables[key] / scale) + 128, 0, 255).astype(np.uint8)
        inits[key + "_scale"], inits[key + "_zero"] = np.array(scale, F32), np.array(128, np.uint8)
        names.append(key)
    names += ["mask"] + [k + "_scale" for k in ("word", "pos", "seg", "gamma", "beta")] + [
        k + "_zero" for k in ("word", "pos", "seg", "gamma", "beta")]
    node = helper.make_node("QEmbedLayerNormalization", names, ["y", "mask_index"], domain="com.microsoft", epsilon=1e-5)
    inputs = [(n, I32, ["batch", "seq"]) for n in ("ids", "seg_ids", "mask")]
    outputs = [("y", F32, ["batch", "seq", D]), ("mask_index", I32, ["batch"])]
    return make_model([node], inputs, outputs, inits, extra_opsets=MS)


def test_quantized_embed_layernorm_becomes_dequantized_tables_and_its_parts():
    model = _quantized_embed_model()
    result = run_rules(model, embed_layernorm.RULES)
    assert rule_stats(result, "expand_embed_layernorm") == (1, {})
    assert "QEmbedLayerNormalization" not in [n.op_type for n in result.model.graph.node]
    assert_matches_ort(model, result.model, feeds=_feeds(), rtol=1e-6)


def _bert_block():
    """EmbedLayerNormalization -> Attention(mask_index) -> SkipLayerNormalization, as
    onnxruntime.transformers.optimizer writes a BERT layer (no value_info on the contrib outputs)."""
    rng = np.random.default_rng(0)
    inits = {**_tables(rng), "w": (rng.standard_normal((D, 3 * D)) * 0.3).astype(F32),
             "b": rng.standard_normal(3 * D).astype(F32)}
    nodes = [helper.make_node("EmbedLayerNormalization", ["ids", "seg_ids", "word", "pos", "seg", "gamma", "beta", "mask"],
                              ["e", "mask_index"], domain="com.microsoft", epsilon=1e-12),
             helper.make_node("Attention", ["e", "w", "b", "mask_index"], ["a"], domain="com.microsoft", num_heads=N),
             helper.make_node("SkipLayerNormalization", ["a", "e", "gamma", "beta"], ["y"], domain="com.microsoft")]
    inputs = [(n, I32, ["batch", "seq"]) for n in ("ids", "mask", "seg_ids")]
    return make_model(nodes, inputs, [("y", F32, ["batch", "seq", D])], inits, extra_opsets=MS)


def test_bert_block_runs_on_infc_kernels():
    model, feeds = _bert_block(), _feeds()
    optimized = optimize_model(model).model
    assert not {"EmbedLayerNormalization", "Attention"} & {n.op_type for n in optimized.graph.node}
    assert_matches_ort(model, optimized, feeds=feeds, rtol=1e-6)
    # --no-fallback refused the contrib pair ("no native kernel for: ..."); now every step is infc's
    program = lower_graph(import_graph(optimized), has_kernel, allow_fallback=False)
    executor = Executor(program.steps, program.weights, program.opset, program.islands, ["y"])
    expected = ort_session(model).run(["y"], feeds)[0]
    got = executor.run(feeds)["y"]
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
