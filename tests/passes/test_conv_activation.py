"""Conv + activation into com.microsoft.FusedConv, and the activations it declines."""

import numpy as np
import onnx
import pytest
from onnx import helper

from infc.compiler.passes.fuse import conv_activation
from infc.compiler.testing import assert_matches_ort, make_model, ops_of, rule_stats, run_rules

F32 = np.float32
RNG = np.random.default_rng(0)
X_SHAPE, Y_SHAPE = [1, 3, 8, 8], [1, 4, 8, 8]


def _model(act_nodes, inits=None, opset=17, dtype=F32, bias=True):
    weights = {"w": (RNG.standard_normal((4, 3, 3, 3)) * 2).astype(dtype)}
    if bias:
        weights["b"] = RNG.standard_normal(4).astype(dtype)
    conv = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], pads=[1, 1, 1, 1])
    return make_model([conv] + act_nodes, [("x", dtype, X_SHAPE)], [("y", dtype, Y_SHAPE)], {**weights, **(inits or {})},
                      opset=opset)


def _fused(result):
    (node,) = result.model.graph.node
    assert (node.op_type, node.domain) == ("FusedConv", "com.microsoft")
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("act,attrs,params", [
    ("Relu", {}, None),
    ("Tanh", {}, None),
    ("Sigmoid", {}, None),
    ("LeakyRelu", {"alpha": 0.1}, [0.1]),
    ("LeakyRelu", {}, [0.01]),
    ("HardSigmoid", {"alpha": 0.25, "beta": 0.4}, [0.25, 0.4]),
])
def test_activation_fuses(act, attrs, params):
    model = _model([helper.make_node(act, ["c"], ["y"], **attrs)])
    result = run_rules(model, conv_activation.RULES)
    assert rule_stats(result, "fuse_conv_activation") == (1, {})
    fused = _fused(result)
    assert fused["activation"] == act.encode()
    assert fused.get("activation_params") == (pytest.approx(params) if params else None)
    assert fused["pads"] == [1, 1, 1, 1]
    assert_matches_ort(model, result.model)


@pytest.mark.parametrize("bounds,params", [((0.0, 6.0), [0.0, 6.0]), ((-1.0, None), [-1.0, float(np.finfo(F32).max)])])
def test_clip_with_constant_bounds_fuses(bounds, params):
    inputs = ["c"] + [name if value is not None else "" for name, value in zip(("lo", "hi"), bounds)]
    inits = {name: np.array(value, F32) for name, value in zip(("lo", "hi"), bounds) if value is not None}
    model = _model([helper.make_node("Clip", inputs, ["y"])], inits)
    result = run_rules(model, conv_activation.RULES)
    assert rule_stats(result, "fuse_conv_clip") == (1, {})
    assert _fused(result)["activation_params"] == pytest.approx(params)
    assert_matches_ort(model, result.model)


def test_clip_with_attribute_bounds_fuses():
    model = _model([helper.make_node("Clip", ["c"], ["y"], min=0.0, max=6.0)], opset=10, bias=False)
    result = run_rules(model, conv_activation.RULES)
    assert rule_stats(result, "fuse_conv_clip") == (1, {})
    assert _fused(result)["activation_params"] == [0.0, 6.0]
    assert_matches_ort(model, result.model)


def test_clip_with_runtime_bound_is_declined():
    conv = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])
    model = make_model([conv, helper.make_node("Clip", ["c", "lo"], ["y"])], [("x", F32, X_SHAPE), ("lo", F32, [])],
                       [("y", F32, Y_SHAPE)], {"w": RNG.standard_normal((4, 3, 3, 3)).astype(F32)})
    result = run_rules(model, conv_activation.RULES)
    assert rule_stats(result, "fuse_conv_clip") == (0, {"Clip bounds are not scalar constants": 1})


def test_float64_is_declined():
    result = run_rules(_model([helper.make_node("Relu", ["c"], ["y"])], dtype=np.float64), conv_activation.RULES)
    assert rule_stats(result, "fuse_conv_activation") == (0, {"FusedConv runs only float32 on CPU": 1})


def test_conv_output_used_elsewhere_is_declined():
    model = _model([helper.make_node("Relu", ["c"], ["y"])])
    model.graph.output.append(helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, Y_SHAPE))
    result = run_rules(model, conv_activation.RULES)
    assert rule_stats(result, "fuse_conv_activation") == (0, {"an interior Conv output is used outside the pattern": 1})


def test_hardswish_op_is_declined():
    result = run_rules(_model([helper.make_node("HardSwish", ["c"], ["y"])]), conv_activation.RULES)
    assert rule_stats(result, "fuse_conv_hardswish") == (0, {"FusedConv HardSwish needs onnxruntime >= 1.31": 1})


def test_hardswish_as_hardsigmoid_mul_is_declined():
    nodes = [helper.make_node("HardSigmoid", ["c"], ["h"], alpha=1 / 6, beta=0.5), helper.make_node("Mul", ["c", "h"], ["y"])]
    result = run_rules(_model(nodes, opset=12), conv_activation.RULES)
    assert rule_stats(result, "fuse_conv_hardswish") == (0, {"FusedConv HardSwish needs onnxruntime >= 1.31": 1})
    assert sorted(ops_of(result.model)) == ["Conv", "HardSigmoid", "Mul"]


def test_silu_is_declined():
    nodes = [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["s", "c"], ["y"])]
    result = run_rules(_model(nodes), conv_activation.RULES)
    assert rule_stats(result, "fuse_conv_silu") == (0, {"FusedConv has no SiLU activation": 1})
    assert rule_stats(result, "fuse_conv_activation") == (0, {"an interior Conv output is used outside the pattern": 1})
