"""A Relu / ReLU6 after a quantized Conv is folded into its output quantization (quantize/clamp_fold.py)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from infc.compiler.quantize import int8
from infc.compiler.quantize.int8 import quantize_int8
from infc.compiler.testing import ort_optimized_ops
from infc.compiler.verify import ort_session


def _model(clamp: str):
    """x -> Conv -> clamp -> Conv -> y: a MobileNetV2 block's ReLU6 (Clip(0, 6)) or a ResNet's Relu."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.5).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((4, 8, 1, 1)) * 0.5).astype(np.float32), "w2"),
             numpy_helper.from_array(np.float32(0.0), "lo"), numpy_helper.from_array(np.float32(6.0), "hi")]
    act = (helper.make_node("Clip", ["c1", "lo", "hi"], ["a1"]) if clamp == "Clip"
           else helper.make_node("Relu", ["c1"], ["a1"]))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), act, helper.make_node("Conv", ["a1", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _samples(count=8, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((1, 3, 8, 8)) * 2).astype(np.float32)} for _ in range(count)]


def _errors(model, models, seeds=range(4)) -> list[float]:
    """Each model's worst error from fp32 over a few inputs, relative to the largest output."""
    totals = [0.0] * len(models)
    for seed in seeds:
        feeds = _samples(1, seed=100 + seed)[0]
        reference = ort_session(model).run(["y"], feeds)[0]
        for i, m in enumerate(models):
            totals[i] = max(totals[i], float(np.abs(ort_session(m).run(["y"], feeds)[0] - reference).max() / np.abs(reference).max()))
    return totals


def _kept(model, monkeypatch, **kwargs):
    """The QDQ model with the clamp kept between its own Q/DQ pairs."""
    with monkeypatch.context() as patch:
        patch.setattr(int8, "fold_clamps", lambda clamps, params: set())
        kept, report = quantize_int8(model, iter(_samples()), **kwargs)
    assert report.num_clamps_folded == 0
    return kept


@pytest.mark.parametrize("clamp", ["Clip", "Relu"])
def test_a_clamp_after_a_conv_is_its_output_quantization(clamp, tmp_path, monkeypatch):
    original = _model(clamp)
    quantized, report = quantize_int8(original, iter(_samples()))
    assert report.num_clamps_folded == 1 and clamp not in {n.op_type for n in quantized.graph.node}
    ops = ort_optimized_ops(quantized, tmp_path)
    assert ops["QLinearConv"] == 1 and ops[clamp] == 0  # no float op between the int8 units (y stays float)
    kept = _kept(original, monkeypatch)
    # onnxruntime drops the kept clamp itself, but not the requantization around it (MobileNetV2:
    # 35 DequantizeLinear -> QuantizeLinear pairs between its int8 convolutions, 2x its quantizer's time)
    kept_ops = ort_optimized_ops(kept, tmp_path)
    assert clamp in {n.op_type for n in kept.graph.node} and kept_ops["QuantizeLinear"] == ops["QuantizeLinear"] + 1
    # the same codes after the clamp, one rounding fewer before it: as close to fp32 (onnxruntime's
    # float arithmetic of each QDQ model, its fusions off)
    folded_error, kept_error = _errors(original, [quantized, kept])
    assert folded_error <= 1.1 * kept_error and folded_error < 0.1


def test_int8_symmetric_codes_keep_the_clamp():
    """Symmetric int8 activations keep negative codes: quantizing does not clamp at 0 there."""
    quantized, report = quantize_int8(_model("Relu"), iter(_samples()), activation_type="int8")
    assert report.num_clamps_folded == 0 and "Relu" in {n.op_type for n in quantized.graph.node}


def test_a_low_clamp_saturates_where_the_clip_did(monkeypatch):
    """Clip(0, 0.01) on values far above 0.01: the range of its output ends at 0.01, where the
    quantization saturates, so folding computes the clamp (one rounding fewer than keeping it)."""
    model = _model("Clip")
    hi = next(t for t in model.graph.initializer if t.name == "hi")
    hi.CopyFrom(numpy_helper.from_array(np.float32(0.01), "hi"))
    quantized, report = quantize_int8(model, iter(_samples()))
    assert report.num_clamps_folded == 1
    folded_error, kept_error = _errors(model, [quantized, _kept(model, monkeypatch)])
    assert folded_error <= 1.1 * kept_error
