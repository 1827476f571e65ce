import numpy as np
import pytest
from onnx import helper

from infc.compiler.passes.fuse import bias_gelu, gelu
from infc.compiler.testing import assert_matches_ort, make_model, ops_of, rule_stats, run_rules

F32 = np.float32
MS = [("com.microsoft", 1)]


def _model(act, bias_shape=(16,), opset=17, commuted=False, **attrs):
    bias = np.random.default_rng(0).standard_normal(bias_shape).astype(F32)
    nodes = [helper.make_node("Add", ["b", "x"] if commuted else ["x", "b"], ["s"]),
             helper.make_node(act, ["s"], ["y"], domain="" if act == "Gelu" and opset >= 20 else "com.microsoft", **attrs)]
    return make_model(nodes, [("x", F32, ["batch", 3, 16])], [("y", F32, ["batch", 3, 16])], {"b": bias},
                      opset=opset, extra_opsets=MS)


def _fuse(model):
    result = run_rules(model, bias_gelu.RULES)
    assert rule_stats(result, "bias_gelu") == (1, {})
    assert_matches_ort(model, result.model)
    (node,) = result.model.graph.node
    return node.op_type, node.domain, list(node.input)


@pytest.mark.parametrize("commuted", [False, True])
def test_bias_and_contrib_gelu_become_bias_gelu(commuted):
    assert _fuse(_model("Gelu", commuted=commuted)) == ("BiasGelu", "com.microsoft", ["x", "b"])


def test_bias_and_fast_gelu_become_fast_gelu_with_bias():
    assert _fuse(_model("FastGelu")) == ("FastGelu", "com.microsoft", ["x", "b"])


@pytest.mark.parametrize("approximate,fused", [("none", "BiasGelu"), ("tanh", "FastGelu")])
def test_onnx_gelu_at_opset_20(approximate, fused):
    assert _fuse(_model("Gelu", opset=20, approximate=approximate))[0] == fused


def test_after_gelu_rules():
    nodes = [helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Div", ["s", "sqrt2"], ["a"]),
             helper.make_node("Erf", ["a"], ["e"]), helper.make_node("Add", ["e", "one"], ["c"]),
             helper.make_node("Mul", ["s", "c"], ["p"]), helper.make_node("Mul", ["p", "half"], ["y"])]
    consts = {"b": np.arange(16, dtype=F32) / 16, "sqrt2": np.array(2 ** 0.5, F32), "one": np.array(1, F32),
              "half": np.array(0.5, F32)}
    model = make_model(nodes, [("x", F32, [2, 3, 16])], [("y", F32, [2, 3, 16])], consts)
    result = run_rules(model, gelu.RULES + bias_gelu.RULES)
    assert ops_of(result.model) == ["BiasGelu"]
    assert_matches_ort(model, result.model)


@pytest.mark.parametrize("bias_shape", [(1, 16), (1,)])
def test_bias_not_1d_over_last_dim_is_rejected(bias_shape):
    result = run_rules(_model("Gelu", bias_shape=bias_shape), bias_gelu.RULES)
    assert rule_stats(result, "bias_gelu") == (0, {"bias is not 1-D over the input's last dim": 1})
