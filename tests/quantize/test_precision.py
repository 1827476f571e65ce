"""fp16 / bf16 conversion: every fixture stays within 1e-2 of fp32 in onnxruntime (raw and after
infc's optimizer), boundary types, fp32 pins by rule, emulation where ORT CPU has no kernel."""

import numpy as np
import onnx
import pytest
from infc.compiler.feeds import random_feeds
from infc.compiler.optimize import optimize_model
from infc.compiler.quantize.fp32_ops import DEFAULT_FP32_OPS
from infc.compiler.quantize.precision import convert_precision
from infc.compiler.testing import FIXTURES, make_model
from infc.compiler.verify import compare_outputs, ort_session
from onnx import helper

F32 = np.float32
TOLERANCE = 1e-2
FIXTURE_NAMES = sorted(p.stem for p in FIXTURES.glob("*.onnx") if p.stem != "overflow_fp16")


def _error(original, converted, seed=0):
    feeds = random_feeds(original, seed)
    names = [o.name for o in original.graph.output]
    expected = ort_session(original).run(names, feeds)
    actual = ort_session(converted).run(names, feeds)
    worst = max(compare_outputs(names, expected, actual), key=lambda d: d.max_rel_diff)
    return worst.max_rel_diff, worst


def _elem_types(model):
    return {v.name: v.type.tensor_type.elem_type for v in list(model.graph.input) + list(model.graph.output)}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_within_tolerance_and_keeps_io_types(name, precision):
    original = onnx.load(FIXTURES / f"{name}.onnx")
    converted, report = convert_precision(original, precision)
    error, worst = _error(original, converted)
    assert error <= TOLERANCE, f"{worst.name}: {error:.3g} at {worst.worst_index}"
    assert _elem_types(converted) == _elem_types(original)
    assert report.num_low + report.num_emulated > 0


@pytest.mark.parametrize("name", ["bert_dynamo", "llama_ts", "cnn_dynamo"])
def test_optimized_graph_with_contrib_ops_converts(name):
    original = onnx.load(FIXTURES / f"{name}.onnx")
    optimized = optimize_model(original).model
    assert any(n.domain == "com.microsoft" for n in optimized.graph.node) or name.startswith("bert")
    for precision in ("fp16", "bf16"):
        converted, _ = convert_precision(optimized, precision)
        error, worst = _error(original, converted)
        assert error <= TOLERANCE, f"{precision} {worst.name}: {error:.3g}"


def _norm_model():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("LayerNormalization", ["h", "g", "b"], ["n"], name="ln", axis=-1),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("Softmax", ["r"], ["y"], name="softmax", axis=-1)]
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((8, 16)).astype(F32), "g": np.ones(16, F32), "b": np.zeros(16, F32)}
    return make_model(nodes, [("x", F32, [2, 8])], [("y", F32, [2, 16])], inits)


def test_rule_pinned_ops_and_followers_stay_fp32_with_reasons():
    converted, report = convert_precision(_norm_model(), "fp16")
    reasons = {name: reason for name, _, reason in report.fp32_nodes}
    assert reasons["ln"] == DEFAULT_FP32_OPS["LayerNormalization"]
    assert reasons["softmax"] == DEFAULT_FP32_OPS["Softmax"]
    assert reasons["relu"] == "follows an fp32 input"  # between two pinned ops: no Cast pair
    assert "mm" in report.low_nodes
    assert _error(_norm_model(), converted)[0] <= TOLERANCE


def test_custom_fp32_ops_and_pinned_nodes():
    _, report = convert_precision(_norm_model(), "fp16", fp32_ops={}, pinned={"mm"})
    assert report.fp32_nodes[0] == ["mm", "MatMul", "pinned"]
    assert "ln" in report.low_nodes


def test_constant_that_overflows_fp16_keeps_its_consumer_fp32():
    # an additive mask of float32's lowest value: -inf in fp16 would turn masked rows into NaN
    nodes = [helper.make_node("Mul", ["m", "lowest"], ["bias"], name="mask"), helper.make_node("Add", ["x", "bias"], ["y"], name="add")]
    model = make_model(nodes, [("x", F32, [2, 4]), ("m", F32, [2, 4])], [("y", F32, [2, 4])],
                       {"lowest": np.array(np.finfo(F32).min, F32)})
    _, report = convert_precision(model, "fp16")
    reasons = {name: reason for name, _, reason in report.fp32_nodes}
    assert reasons["mask"] == "a constant input overflows float16"
    assert reasons["add"] == "follows an fp32 input"


def test_keep_io_types_false_retypes_the_boundary():
    converted, _ = convert_precision(_norm_model(), "fp16", keep_io_types=False)
    assert set(_elem_types(converted).values()) == {onnx.TensorProto.FLOAT16}
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float16)
    (y,) = ort_session(converted).run(None, {"x": x})
    assert y.dtype == np.float16 and np.allclose(y.astype(F32).sum(-1), 1, atol=1e-2)


def test_bf16_without_ort_kernel_computes_fp32_between_casts():
    converted, report = convert_precision(_norm_model(), "bf16")
    assert report.emulated_ops == {"MatMul": 1}  # onnxruntime CPU has no bf16 MatMul
    assert "MatMul" in [n.op_type for n in converted.graph.node]
    assert _error(_norm_model(), converted)[0] <= TOLERANCE


def test_without_probing_the_graph_is_pure_low_precision():
    converted, report = convert_precision(_norm_model(), "fp16", kernels="all")
    assert report.num_emulated == 0 and "mm" in report.low_nodes
    inits = {t.name: t.data_type for t in converted.graph.initializer}
    matmul = next(n for n in converted.graph.node if n.op_type == "MatMul")
    assert inits[matmul.input[1]] == onnx.TensorProto.FLOAT16


def test_bf16_upgrades_an_old_opset_and_says_so():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    model = make_model(nodes, [("x", F32, [2, 4])], [("y", F32, [2, 3])], {"w": np.ones((4, 3), F32)}, opset=12)
    converted, report = convert_precision(model, "bf16")
    assert report.notes == ["opset upgraded from 12 to 13: Cast to bfloat16"]
    assert _error(model, converted)[0] <= TOLERANCE


def test_unnamed_nodes_are_named_by_op_and_index():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    model = make_model(nodes, [("x", F32, [2, 4])], [("y", F32, [2, 3])], {"w": np.ones((4, 3), F32)})
    _, report = convert_precision(model, "fp16")
    assert set(report.low_nodes) == {"MatMul_0", "Relu_1"}


def _half_matmul_model():
    w = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float16)
    return make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", np.float16, [2, 8])],
                      [("y", np.float16, [2, 4])], {"w": w})


def test_a_float16_model_says_nothing_was_converted():
    # --precision bf16 on a model exported in float16 converts nothing: the report must say so.
    _, report = convert_precision(_half_matmul_model(), "bf16")
    assert report.num_low == 0 and any("already float16" in note for note in report.notes)


def test_int8_on_a_float16_model_says_nothing_was_quantized():
    from infc.compiler.quantize.int8 import quantize_int8

    model = _half_matmul_model()
    _, report = quantize_int8(model, (random_feeds(model, seed) for seed in range(2)))
    assert report.quantized == {} and any("nothing quantized" in note for note in report.notes)


def _masked_attention_model():
    # a padding mask filled with float32's lowest value (HF's finfo.min), computed from the integer
    # mask (so it stays fp32), into an attention that computes in fp16: batch 1 is all padding
    ms = "com.microsoft"
    nodes = [helper.make_node("Equal", ["mask", "zero"], ["is_pad"], name="is_pad"),
             helper.make_node("Where", ["is_pad", "lowest", "zero_f"], ["bias"], name="fill"),
             helper.make_node("Unsqueeze", ["bias", "axes"], ["bias4"], name="unsqueeze"),
             helper.make_node("Expand", ["bias4", "bias_shape"], ["bias_full"], name="expand"),
             helper.make_node("MultiHeadAttention", ["x", "x", "x", "", "", "bias_full"], ["y"], name="mha",
                              domain=ms, num_heads=2)]
    inits = {"zero": np.array(0, np.int64), "lowest": np.array(np.finfo(F32).min, F32), "zero_f": np.array(0, F32),
             "axes": np.array([1, 2], np.int64), "bias_shape": np.array([2, 1, 8, 8], np.int64)}
    return make_model(nodes, [("x", F32, [2, 8, 8]), ("mask", np.int64, [2, 8])], [("y", F32, [2, 8, 8])], inits,
                      extra_opsets=[(ms, 1)])


@pytest.mark.parametrize("kernels", ["infc-cpu", "onnxruntime"])
def test_fp32_mask_past_the_fp16_range_saturates_where_an_fp16_op_reads_it(kernels):
    # cast to fp16 it would be -inf, a fully masked row NaN, and the next layer NaN everywhere; fp16
    # models fill masks with fp16's lowest (-65504), which the conversion clips to. (A fully masked
    # row means nothing: fp32 averages all keys, float32's lowest swallowing the scores; fp16 not.)
    model = _masked_attention_model()
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 8, 8)).astype(F32),
             "mask": np.array([[1] * 5 + [0] * 3, [0] * 8], np.int64)}
    converted, report = convert_precision(model, "fp16", kernels=kernels)
    assert "mha" in report.low_nodes
    (expected,) = ort_session(model).run(None, feeds)
    (actual,) = ort_session(converted).run(None, feeds)
    assert np.isfinite(actual).all()
    np.testing.assert_allclose(actual[0], expected[0], rtol=0, atol=1e-2 * np.abs(expected[0]).max())
