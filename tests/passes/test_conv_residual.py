"""A residual Add after a Conv (and the activation after it) into FusedConv's Z, and what it declines."""

import numpy as np
import pytest
from onnx import helper

from infc.compiler.passes.fuse import conv_residual
from infc.compiler.testing import assert_matches_ort, make_model, ops_of, rule_stats, run_rules

F32 = np.float32
RNG = np.random.default_rng(0)
X_SHAPE, Y_SHAPE = ["batch", 3, 8, 8], ["batch", 4, 8, 8]


def _model(after, z_shape=Y_SHAPE, bias=True, dtype=F32, z_first=False):
    weights = {"w": RNG.standard_normal((4, 3, 3, 3)).astype(dtype)}
    if bias:
        weights["b"] = RNG.standard_normal(4).astype(dtype)
    conv = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], pads=[1, 1, 1, 1])
    add = helper.make_node("Add", ["z", "c"] if z_first else ["c", "z"], ["s"])
    return make_model([conv, add] + after, [("x", dtype, X_SHAPE), ("z", dtype, z_shape)], [("y", dtype, Y_SHAPE)], weights)


def _fused(result):
    (node,) = result.model.graph.node
    assert (node.op_type, node.domain) == ("FusedConv", "com.microsoft")
    return node, {a.name: helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("act,attrs,params", [("Relu", {}, None), ("LeakyRelu", {"alpha": 0.2}, [0.2]),
                                              ("Sigmoid", {}, None)])
@pytest.mark.parametrize("z_first", [False, True])
def test_sum_and_activation_fuse(act, attrs, params, z_first):
    model = _model([helper.make_node(act, ["s"], ["y"], **attrs)], z_first=z_first)
    result = run_rules(model, conv_residual.RULES)
    # the bare-sum rule sees the Add first and leaves it to the activation form
    assert rule_stats(result, "fuse_conv_residual") == (1, {"left to the form with the activation after the sum": 1})
    node, fused = _fused(result)
    assert list(node.input) == ["x", "w", "b", "z"]
    assert fused["activation"] == act.encode()
    assert fused.get("activation_params") == (pytest.approx(params) if params else None)
    assert_matches_ort(model, result.model, dims={"batch": 2})


def test_bare_sum_without_bias_fuses():
    model = _model([helper.make_node("Identity", ["s"], ["y"])], bias=False)
    result = run_rules(model, conv_residual.RULES)
    assert rule_stats(result, "fuse_conv_residual")[0] == 1
    assert "FusedConv" in ops_of(result.model)
    fused = next(n for n in result.model.graph.node if n.op_type == "FusedConv")
    assert list(fused.input) == ["x", "w", "", "z"]
    assert not any(a.name == "activation" for a in fused.attribute)
    assert_matches_ort(model, result.model, dims={"batch": 2})


def test_broadcast_residual_is_declined():
    model = _model([helper.make_node("Relu", ["s"], ["y"])], z_shape=[1, 4, 1, 1])
    result = run_rules(model, conv_residual.RULES)
    matched, rejected = rule_stats(result, "fuse_conv_residual")
    assert matched == 0
    assert "the residual's shape is not provably the convolution's (FusedConv does not broadcast Z)" in rejected


def test_float64_is_declined():
    model = _model([helper.make_node("Relu", ["s"], ["y"])], dtype=np.float64)
    result = run_rules(model, conv_residual.RULES)
    assert rule_stats(result, "fuse_conv_residual")[0] == 0
    assert "FusedConv runs only float32 on CPU" in rule_stats(result, "fuse_conv_residual")[1]


def test_sum_read_elsewhere_is_not_fused_away():
    # the sum is a graph output too: the Add must stay, so nothing fuses
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                        helper.make_node("Add", ["c", "z"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                       [("x", F32, X_SHAPE), ("z", F32, Y_SHAPE)], [("y", F32, Y_SHAPE), ("s", F32, Y_SHAPE)],
                       {"w": RNG.standard_normal((4, 3, 3, 3)).astype(F32)})
    result = run_rules(model, conv_residual.RULES)
    assert ops_of(result.model).count("Add") == 1
    assert_matches_ort(model, result.model, dims={"batch": 1})
