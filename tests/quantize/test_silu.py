"""SiLU between quantized convolutions runs in onnxruntime's int8 kernels (quantize/silu.py)."""

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from infc.compiler.quantize.int8 import quantize_int8
from infc.compiler.verify import ort_session


def _model(form: str):
    """x -> Conv -> SiLU -> Conv -> y; SiLU as exporters write it (Sigmoid, Mul) or as infc's fusion does (QuickGelu)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.5).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((4, 8, 1, 1)) * 0.5).astype(np.float32), "w2")]
    if form == "QuickGelu":
        silu = [helper.make_node("QuickGelu", ["c1"], ["a1"], domain="com.microsoft", alpha=1.0)]
    else:
        silu = [helper.make_node("Sigmoid", ["c1"], ["s1"]), helper.make_node("Mul", ["c1", "s1"], ["a1"])]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), *silu, helper.make_node("Conv", ["a1", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)], ir_version=8)


def _samples(count=8, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((1, 3, 8, 8)) * 2).astype(np.float32)} for _ in range(count)]


@pytest.mark.parametrize("form", ["Sigmoid", "QuickGelu"])
def test_silu_between_convolutions_stays_int8(form, tmp_path):
    original = _model(form)
    quantized, report = quantize_int8(original, iter(_samples()))
    assert "QuickGelu" not in {n.op_type for n in quantized.graph.node} and report.num_silu_split == (form == "QuickGelu")
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(quantized.SerializeToString(), options, providers=["CPUExecutionProvider"])
    ops = Counter(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node)
    assert ops["QLinearSigmoid"] == 1 and ops["QLinearMul"] == 1 and ops["QuickGelu"] == 0  # int8 from conv to conv
    for feeds in _samples(4, seed=9):
        reference = ort_session(original).run(["y"], feeds)[0]
        got = ort_session(quantized, optimize=True).run(["y"], feeds)[0]
        assert np.abs(got - reference).max() <= 0.05 * np.abs(reference).max()


def test_a_quick_gelu_that_is_not_a_silu_stays():
    model = _model("QuickGelu")
    next(a for n in model.graph.node if n.op_type == "QuickGelu" for a in n.attribute).f = 1.702
    quantized, _ = quantize_int8(model, iter(_samples()))
    assert "QuickGelu" in {n.op_type for n in quantized.graph.node}
