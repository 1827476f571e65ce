"""onnxruntime's packed Attention (its transformers optimizer writes it) expanded into a GEMM and
MultiHeadAttention: exact against onnxruntime on the original, and runnable on infc's own kernels."""

import numpy as np
import pytest
from onnx import helper

from infc.compiler.graph import import_graph
from infc.compiler.lower import lower_graph
from infc.compiler.optimize import optimize_model
from infc.compiler.passes.expand import packed_attention
from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.kernels import has_kernel
from infc.compiler.testing import assert_matches_ort, make_model, rule_stats, run_rules
from infc.compiler.verify import ort_session

F32, I32 = np.float32, np.int32
MS = [("com.microsoft", 1)]
B, S, D, N = 2, 6, 16, 4


def _model(mask_shape=None, opset=17, **attrs):
    rng = np.random.default_rng(0)
    inits = {"w": (rng.standard_normal((D, 3 * D)) * 0.3).astype(F32), "b": rng.standard_normal(3 * D).astype(F32)}
    inputs = [("x", F32, ["batch", "seq", D])] + ([("m", I32, mask_shape)] if mask_shape else [])
    node = helper.make_node("Attention", ["x", "w", "b"] + (["m"] if mask_shape else []), ["y"], domain="com.microsoft",
                            num_heads=N, **attrs)
    return make_model([node], inputs, [("y", F32, ["batch", "seq", D])], inits, opset=opset, extra_opsets=MS)


def _feeds(mask):
    x = np.random.default_rng(1).standard_normal((B, S, D)).astype(F32)
    return {"x": x} if mask is None else {"x": x, "m": mask}


def _native(model, feeds):
    """The model's outputs on infc's kernels only (as --no-fallback lowers it)."""
    program = lower_graph(import_graph(optimize_model(model).model), has_kernel, allow_fallback=False)
    executor = Executor(program.steps, program.weights, program.opset, program.islands, [o["name"] for o in program.outputs])
    return executor.run(feeds)["y"]


KEY_LENGTHS = np.array([S, 3], I32)
RAW_MASK = np.array([[1] * S, [0, 1, 1, 0, 1, 0]], I32)


@pytest.mark.parametrize("mask_shape,mask", [(None, None), (["batch"], KEY_LENGTHS), (["batch", "seq"], RAW_MASK)])
@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("opset", [12, 17])
def test_attention_becomes_gemm_and_multi_head_attention(mask_shape, mask, unidirectional, opset):
    model = _model(mask_shape, opset=opset, unidirectional=unidirectional)
    result = run_rules(model, packed_attention.RULES)
    assert rule_stats(result, "expand_packed_attention") == (1, {})
    assert [n.op_type for n in result.model.graph.node][-2:] == ["Split", "MultiHeadAttention"]
    feeds = _feeds(mask)
    assert_matches_ort(model, result.model, feeds=feeds, rtol=1e-6)
    expected = ort_session(model).run(["y"], feeds)[0]
    got = _native(model, feeds)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_uneven_qkv_widths_and_scale_carry_over():
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((D, 2 * D + 8)).astype(F32), "b": rng.standard_normal(2 * D + 8).astype(F32)}
    node = helper.make_node("Attention", ["x", "w", "b"], ["y"], domain="com.microsoft", num_heads=N,
                            qkv_hidden_sizes=[D, D, 8], scale=0.3)
    model = make_model([node], [("x", F32, ["batch", "seq", D])], [("y", F32, ["batch", "seq", 8])], inits,
                       extra_opsets=MS)
    result = run_rules(model, packed_attention.RULES)
    assert rule_stats(result, "expand_packed_attention") == (1, {})
    assert_matches_ort(model, result.model, feeds=_feeds(None), rtol=1e-6)


def test_mask_of_unproven_length_is_left_alone():
    # a 1-D mask may also be [2 * batch] (end and start positions): its length must be provably the batch
    result = run_rules(_model(["n"]), packed_attention.RULES)
    assert rule_stats(result, "expand_packed_attention") == (
        0, {"mask_index is not provably [batch] key lengths or a [batch, keys] mask": 1})


def test_past_state_is_left_alone():
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((D, 3 * D)).astype(F32), "b": rng.standard_normal(3 * D).astype(F32)}
    node = helper.make_node("Attention", ["x", "w", "b", "", "past"], ["y", "present"], domain="com.microsoft",
                            num_heads=N, unidirectional=1)
    model = make_model([node], [("x", F32, ["batch", "seq", D]), ("past", F32, [2, "batch", N, "past", D // N])],
                       [("y", F32, ["batch", "seq", D]), ("present", F32, [2, "batch", N, "total", D // N])], inits, extra_opsets=MS)
    result = run_rules(model, packed_attention.RULES)
    assert rule_stats(result, "expand_packed_attention") == (0, {"past / present state": 1})


def test_portable_output_keeps_the_packed_op():
    # `infc optimize` writes for onnxruntime, whose packed kernel is faster; builds expand it
    from infc.compiler.passes.pipeline import PORTABLE_PIPELINE

    model = _model(["batch"])
    assert "Attention" in [n.op_type for n in optimize_model(model, PORTABLE_PIPELINE).model.graph.node]
    assert "Attention" not in [n.op_type for n in optimize_model(model).model.graph.node]


def _quantized_model():
    """DynamicQuantizeLinear -> QAttention, as quantize_dynamic writes a transformers-optimized BERT.
    Weights within [-64, 64]: on x86 without VNNI onnxruntime's u8 x s8 kernels add products in
    saturating 16-bit pairs, so with full-range weights the reference itself is off (by 10227 in
    the int32 sums on an AVX2-only EPYC) while infc's sums are exact."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.integers(-64, 65, (D, 3 * D)).astype(np.int8), "b": rng.standard_normal(3 * D).astype(F32),
             "w_scale": np.array(0.004, F32), "w_zero": np.array(0, np.int8)}
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("QAttention", ["xq", "w", "b", "xs", "w_scale", "m", "xz", "w_zero"], ["y"],
                              domain="com.microsoft", num_heads=N)]
    return make_model(nodes, [("x", F32, ["batch", "seq", D]), ("m", I32, ["batch"])], [("y", F32, ["batch", "seq", D])],
                      inits, extra_opsets=MS)


def test_quantized_attention_becomes_integer_gemm_and_multi_head_attention():
    model = _quantized_model()
    result = run_rules(model, packed_attention.RULES)
    assert rule_stats(result, "expand_packed_attention") == (1, {})
    assert "MatMulInteger" in [n.op_type for n in result.model.graph.node]
    feeds = _feeds(KEY_LENGTHS)
    assert_matches_ort(model, result.model, feeds=feeds, rtol=1e-6)
    expected = ort_session(model).run(["y"], feeds)[0]
    assert np.abs(_native(model, feeds) - expected).max() <= 1e-5 * np.abs(expected).max()


def test_mask_index_summed_from_the_raw_mask_is_key_lengths():
    # RoBERTa through the transformers optimizer: mask_index = ReduceSum(Cast(attention_mask), axis 1)
    rng = np.random.default_rng(0)
    inits = {"w": (rng.standard_normal((D, 3 * D)) * 0.3).astype(F32), "b": rng.standard_normal(3 * D).astype(F32),
             "axes": np.array([1], np.int64)}
    nodes = [helper.make_node("Cast", ["mask"], ["mask32"], to=6),
             helper.make_node("ReduceSum", ["mask32", "axes"], ["lengths"], keepdims=0),
             helper.make_node("Attention", ["x", "w", "b", "lengths"], ["y"], domain="com.microsoft", num_heads=N)]
    model = make_model(nodes, [("x", F32, [B, S, D]), ("mask", np.int64, ["n", S])], [("y", F32, [B, S, D])], inits,
                       extra_opsets=MS)
    feeds = {**_feeds(None), "mask": np.array([[1] * S, [1, 1, 1, 0, 0, 0]], np.int64)}
    result = run_rules(model, packed_attention.RULES)
    assert rule_stats(result, "expand_packed_attention") == (1, {})
    assert_matches_ort(model, result.model, feeds=feeds, rtol=1e-6)
