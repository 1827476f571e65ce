import numpy as np
import pytest
from onnx import helper

from infc.compiler.passes.fuse.rmsnorm import RULES
from infc.compiler.testing import assert_matches_ort, make_model, ops_of, rule_stats, run_rules

F32 = np.float32
SHAPE = [2, 3, 16]


def _model(opset=17, square="pow", norm="reciprocal", power=2.0, eps=np.array(1e-6, F32), weight=True):
    reduce = (helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]) if opset >= 18 else
              helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]))
    nodes = [helper.make_node("Pow", ["x", "p"], ["sq"]) if square == "pow" else helper.make_node("Mul", ["x", "x"], ["sq"]),
             reduce, helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["std"])]
    nodes += {"reciprocal": [helper.make_node("Reciprocal", ["std"], ["r"]), helper.make_node("Mul", ["x", "r"], ["n"])],
              "div_one": [helper.make_node("Div", ["one", "std"], ["r"]), helper.make_node("Mul", ["r", "x"], ["n"])],
              "div": [helper.make_node("Div", ["x", "std"], ["n"])]}[norm]
    nodes.append(helper.make_node("Mul", ["w", "n"], ["y"]) if weight else helper.make_node("Identity", ["n"], ["y"]))
    inits = {"p": np.array(power, F32), "eps": eps, "one": np.array(1.0, F32), "axes": np.array([-1], np.int64),
             "w": np.random.default_rng(0).standard_normal(16).astype(F32)}
    return make_model(nodes, [("x", F32, SHAPE)], [("y", F32, SHAPE)], inits, opset=opset)


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("norm", ["reciprocal", "div_one", "div"])
def test_written_out_rmsnorm_becomes_simplified_layernorm(opset, square, norm):
    model = _model(opset, square, norm)
    result = run_rules(model, RULES)
    assert rule_stats(result, "rmsnorm") == (1, {}) and rule_stats(result, "norm_scale") == (1, {})
    (node,) = result.model.graph.node
    assert (node.op_type, node.domain) == ("SimplifiedLayerNormalization", "")
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute} == {"axis": -1, "epsilon": pytest.approx(1e-6)}
    assert_matches_ort(model, result.model)


def test_opset_23_uses_rms_normalization():
    model = _model(opset=23)
    result = run_rules(model, RULES)
    assert ops_of(result.model) == ["RMSNormalization"]
    assert_matches_ort(model, result.model)


def test_without_weight():
    model = _model(weight=False)
    result = run_rules(model, RULES)
    assert ops_of(result.model) == ["SimplifiedLayerNormalization", "Identity"]
    assert_matches_ort(model, result.model)


@pytest.mark.parametrize("power,eps", [(3.0, np.array(1e-6, F32)), (2.0, np.full(16, 1e-6, F32))])
def test_not_a_mean_of_squares_plus_eps_is_rejected(power, eps):
    result = run_rules(_model(power=power, eps=eps), RULES)
    assert rule_stats(result, "rmsnorm") == (0, {"not a mean of squares plus a small epsilon": 1})
