"""INT8 QDQ: per-channel int8 weights, per-tensor activations, onnxruntime runs it and fuses it into
its quantized kernels; calibration memory does not grow with the number of samples."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from infc.compiler.feeds import random_feeds
from infc.compiler.optimize import optimize_model
from infc.compiler.quantize.int8 import quantize_int8
from infc.compiler.quantize.weight_range import saturates_u8s8, weight_limit
from infc.compiler.testing import FIXTURES, make_model, ort_optimized_ops
from infc.compiler.verify import compare_outputs, ort_session
from onnx import helper, numpy_helper

F32 = np.float32
MEMORY_SCRIPT = Path(__file__).with_name("calibration_memory.py")


def _calibration(model, count=8):
    return (random_feeds(model, seed) for seed in range(count))


def _error(original, quantized, seed=100):
    feeds = random_feeds(original, seed)
    names = [o.name for o in original.graph.output]
    diffs = compare_outputs(names, ort_session(original).run(names, feeds), ort_session(quantized, optimize=True).run(names, feeds))
    return max(d.max_rel_diff for d in diffs)


def test_reduced_weights_run_in_onnxruntimes_int8_kernels_as_their_qdq_arithmetic():
    """With weights in [-64, 64], onnxruntime's fused QLinearConv / QGemm compute what the QDQ model's
    float arithmetic does on any x86 CPU (without VNNI, full-range weights saturate its u8 x s8 GEMM:
    6% off on this fixture, measured on an AVX2 EPYC; see quantize/weight_range.py)."""
    original = onnx.load(FIXTURES / "cnn_ts.onnx")
    quantized, report = quantize_int8(original, _calibration(original), reduce_range=True)
    assert "7 bits" in report.notes[-1]
    feeds = random_feeds(original, 100)
    names = [o.name for o in original.graph.output]
    fused, arithmetic = (ort_session(quantized, optimize=o).run(names, feeds) for o in (True, False))
    assert max(d.max_rel_diff for d in compare_outputs(names, arithmetic, fused)) < 1e-2


def test_weight_range_follows_the_cpu_unless_asked():
    assert weight_limit(True) == 64 and weight_limit(False) == 127
    assert weight_limit() == (64 if saturates_u8s8() else 127)


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy"])
def test_cnn_quantizes_runs_and_fuses_into_quantized_kernels(method, tmp_path):
    original = onnx.load(FIXTURES / "cnn_ts.onnx")
    quantized, report = quantize_int8(original, _calibration(original), method)
    assert report.quantized == {"Conv": 12, "Gemm": 1} and report.num_samples == 8 and report.skipped == {}
    weights = [n for n in quantized.graph.node if n.op_type == "DequantizeLinear" and "/int8_" in n.input[0]]
    assert len(weights) == 13 and all(a.name == "axis" for n in weights for a in n.attribute)
    runs = ort_optimized_ops(quantized, tmp_path)
    assert runs["QLinearConv"] == 12 and runs["QGemm"] == 1 and runs["Conv"] == runs["FusedConv"] == 0
    # entropy clips tails on purpose; on 8 random samples it clips real signal too (see docs/quantization.md)
    assert _error(original, quantized) < (5e-2 if method != "entropy" else 0.5)


@pytest.mark.parametrize("reduce_range, limit", [(False, 127), (True, 64)])
def test_weights_are_symmetric_per_channel_and_biases_int32(reduce_range, limit):
    original = onnx.load(FIXTURES / "cnn_ts.onnx")
    quantized, report = quantize_int8(original, _calibration(original), reduce_range=reduce_range)
    inits = {t.name: numpy_helper.to_array(t) for t in quantized.graph.initializer}
    conv = next(n for n in quantized.graph.node if n.op_type == "Conv")
    weight_dq = next(n for n in quantized.graph.node if n.output[0] == conv.input[1])
    q, scale, zero = (inits[i] for i in weight_dq.input)
    assert q.dtype == np.int8 and np.abs(q).max() == limit and scale.shape == (q.shape[0],) and not zero.any()
    assert report.weight_type.endswith("[-64, 64]") == reduce_range
    gemm = next(n for n in quantized.graph.node if n.op_type == "Gemm")
    bias_dq = next(n for n in quantized.graph.node if n.output[0] == gemm.input[2])
    assert inits[bias_dq.input[0]].dtype == np.int32  # scale_x * scale_W[c]: what QGemm needs
    x_dq = next(n for n in quantized.graph.node if n.output[0] == conv.input[0])
    assert inits[x_dq.input[2]].dtype == np.uint8 and inits[x_dq.input[1]].shape == ()


def test_optimized_graph_fused_convs_are_split_for_quantization(tmp_path):
    original = onnx.load(FIXTURES / "cnn_dynamo.onnx")
    optimized = optimize_model(original).model
    num_fused = sum(n.op_type == "FusedConv" for n in optimized.graph.node)
    quantized, report = quantize_int8(optimized, _calibration(original))
    assert num_fused > 0 and report.num_unfused == num_fused
    runs = ort_optimized_ops(quantized, tmp_path)
    assert runs["QLinearConv"] == report.quantized["Conv"] and runs["FusedConv"] == 0
    assert _error(original, quantized) < 5e-2


def test_transformer_matmuls_with_weights_are_quantized_attention_ones_skipped():
    original = onnx.load(FIXTURES / "bert_ts.onnx")
    quantized, report = quantize_int8(original, _calibration(original))
    assert report.quantized == {"MatMul": 12}
    assert report.skipped == {"MatMul: the weight is not a constant": 4}  # q @ k^T and p @ v
    assert _error(original, quantized) < 5e-2


def test_symmetric_int8_activations_and_old_opset_upgrade():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    w = np.random.default_rng(0).standard_normal((8, 4)).astype(F32)
    model = make_model(nodes, [("x", F32, [2, 8])], [("y", F32, [2, 4])], {"w": w}, opset=12)
    quantized, report = quantize_int8(model, _calibration(model), activation_type="int8", reduce_range=False)
    assert report.notes == ["opset upgraded from 12 to 13: per-channel DequantizeLinear"]
    zeros = [numpy_helper.to_array(t) for t in quantized.graph.initializer if t.name.endswith("/zero")]
    assert all(z.dtype == np.int8 and not z.any() for z in zeros)
    assert _error(model, quantized) < 5e-2


def _measure(folder: Path, method: str) -> dict:
    done = subprocess.run([sys.executable, str(MEMORY_SCRIPT), str(folder.parent / "model.onnx"), str(folder), method],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_calibration_memory_does_not_grow_with_the_number_of_samples(tmp_path):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    model = make_model(nodes, [("x", F32, [1, 64])], [("y", F32, [1, 16])],
                       {"w1": rng.standard_normal((64, 256)).astype(F32), "w2": rng.standard_normal((256, 16)).astype(F32)})
    onnx.save(model, tmp_path / "model.onnx")
    for count in (10, 1000):
        (tmp_path / str(count)).mkdir()
        for index in range(count):
            np.savez(tmp_path / str(count) / f"{index:04d}.npz", x=rng.standard_normal((1, 64)).astype(F32))
    for method in ("minmax", "percentile"):
        few, many = _measure(tmp_path / "10", method), _measure(tmp_path / "1000", method)
        assert (few["num_samples"], many["num_samples"]) == (10, 1000)
        print(f"{method}: peak RSS {few['peak_rss_mb']:.1f} MB (10) vs {many['peak_rss_mb']:.1f} MB (1000); "
              f"Python heap peak {few['python_peak_mb']:.2f} vs {many['python_peak_mb']:.2f} MB")
        assert many["peak_rss_mb"] <= few["peak_rss_mb"] + 8
        assert many["python_peak_mb"] <= few["python_peak_mb"] + 1


@pytest.mark.parametrize("activation_type", ["uint8", "int8"])
def test_activation_scale_never_zero_in_float32(activation_type):
    # A range of subnormal values (an activation that is all but zero) divides to a float64 scale
    # that rounds to 0 in float32: QuantizeLinear would divide by zero.
    from infc.compiler.quantize.qdq import activation_params

    scale, _ = activation_params(0.0, 1e-40, activation_type)
    assert scale.dtype == np.float32 and scale > 0
    scale, _ = activation_params(-2.0, 2.0, activation_type)
    assert np.isclose(float(scale), 4.0 / 255 if activation_type == "uint8" else 2.0 / 127)
