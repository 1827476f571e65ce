"""FusedConv with a residual input goes to onnxruntime as Conv + Add (+ activation)
(compiler/runtime/conv_sum_form.py), so onnxruntime blocks it to NCHWc as it does the exported model."""

import os
import tempfile
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from infc.compiler.runtime.conv_sum_form import with_conv_sums_unfused
from infc.compiler.runtime.kernels.common import decode_attrs
from infc.compiler.runtime.vendor_op import GROUP_OP, group_runner

RNG = np.random.default_rng(0)
W = (RNG.standard_normal((16, 16, 1, 1)) * 0.2).astype(np.float32)
B = RNG.standard_normal(16).astype(np.float32)
X = RNG.standard_normal((1, 16, 8, 8)).astype(np.float32)
# the residual comes from an op onnxruntime keeps in NCHW (EfficientFormer's pooling block)
MEMBERS = [{"op": "Sin", "domain": "", "inputs": ["x"], "outputs": ["z"], "attrs": {}},
           {"op": "Conv", "domain": "", "inputs": ["x", "w", "b"], "outputs": ["c"], "attrs": {"kernel_shape": [1, 1]}},
           {"op": "FusedConv", "domain": "com.microsoft", "inputs": ["c", "w", "b", "z"], "outputs": ["y"],
            "attrs": {"kernel_shape": [1, 1], "activation": "Relu"}},
           {"op": "Conv", "domain": "", "inputs": ["y", "w", "b"], "outputs": ["out"], "attrs": {"kernel_shape": [1, 1]}}]


def _conv(x):
    return np.einsum("oi,nihw->nohw", W[:, :, 0, 0], x) + B[None, :, None, None]


def _optimized_ops(model_bytes: bytes) -> Counter:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    path = tempfile.mktemp(suffix=".onnx")
    options.optimized_model_filepath = path
    ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    try:
        return Counter(f"{n.domain}:{n.op_type}" for n in onnx.load(path, load_external_data=False).graph.node)
    finally:
        os.remove(path)


def test_a_session_gets_the_sum_as_conv_add_and_onnxruntime_blocks_every_convolution(monkeypatch):
    seen = []
    real = ort.InferenceSession
    monkeypatch.setattr(ort, "InferenceSession", lambda model, *a, **k: seen.append(model) or real(model, *a, **k))
    step = {"op": GROUP_OP, "inputs": ["x"], "outputs": ["out"], "members": MEMBERS}
    (out,) = group_runner(step, {"w": W, "b": B}, decode_attrs, 17)([X], {}, None)
    expected = _conv(np.maximum(_conv(_conv(X)) + np.sin(X), 0))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    graph = onnx.load_from_string(seen[-1]).graph
    assert [n.op_type for n in graph.node] == ["Sin", "Conv", "Conv", "Add", "Relu", "Conv"]
    ops = _optimized_ops(onnx.load_from_string(seen[-1]).SerializeToString())
    if "com.microsoft.nchwc:Conv" not in ops:
        pytest.skip("this onnxruntime has no NCHWc convolutions here")
    assert ops["com.microsoft.nchwc:Conv"] == 3 and "com.microsoft:FusedConv" not in ops


@pytest.mark.parametrize("activation, params", [(None, []), ("Relu", []), ("LeakyRelu", [0.1]), ("Clip", [-0.5, 0.5]),
                                                ("HardSigmoid", [0.3, 0.4])])
def test_the_whole_model_gets_the_exporters_form_with_equal_outputs(activation, params):
    attrs = {"kernel_shape": [1, 1], **({"activation": activation} if activation else {}),
             **({"activation_params": params} if params else {})}
    nodes = [helper.make_node("Sin", ["x"], ["z"]),
             helper.make_node("FusedConv", ["x", "w", "b", "z"], ["y"], domain="com.microsoft", name="fc", **attrs)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=8)
    unfused = with_conv_sums_unfused(model)
    assert "FusedConv" not in {n.op_type for n in unfused.graph.node}
    assert [n.op_type for n in model.graph.node] == ["Sin", "FusedConv"]  # the given model is left alone
    fused_out = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    plain_out = ort.InferenceSession(unfused.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    np.testing.assert_allclose(plain_out, fused_out, rtol=1e-5, atol=1e-6)


def test_a_model_without_sums_is_not_copied():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph)
    assert with_conv_sums_unfused(model) is model
