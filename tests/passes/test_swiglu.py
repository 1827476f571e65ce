import numpy as np
import pytest
from onnx import helper

from infc.compiler.passes.fuse import silu, swiglu
from infc.compiler.testing import assert_matches_ort, make_model, ops_of, rule_stats, run_rules

F32 = np.float32
RNG = np.random.default_rng(0)
K, N = 16, 24


def _model(act="quick_gelu", up_input="x", gate_shape=(K, N), opset=17):
    act_nodes = ([helper.make_node("QuickGelu", ["g"], ["a"], domain="com.microsoft", alpha=1.0)] if act == "quick_gelu" else
                 [helper.make_node("Sigmoid", ["g"], ["sg"]), helper.make_node("Mul", ["g", "sg"], ["a"])])
    nodes = [helper.make_node("MatMul", ["x", "wg"], ["g"]), helper.make_node("MatMul", [up_input, "wu"], ["u"]),
             *act_nodes, helper.make_node("Mul", ["u", "a"], ["h"]), helper.make_node("MatMul", ["h", "wd"], ["y"])]
    inits = {"wg": RNG.standard_normal(gate_shape).astype(F32), "wu": RNG.standard_normal((K, N)).astype(F32),
             "wd": RNG.standard_normal((N, K)).astype(F32)}
    return make_model(nodes, [("x", F32, ["batch", 3, K]), ("z", F32, ["batch", 3, K])], [("y", F32, ["batch", 3, K])],
                      inits, opset=opset, extra_opsets=[("com.microsoft", 1)])


@pytest.mark.parametrize("opset", [11, 17])
def test_gate_and_up_merge_into_one_matmul(opset):
    model = _model(opset=opset)
    result = run_rules(model, swiglu.RULES)
    assert rule_stats(result, "swiglu") == (1, {})
    assert ops_of(result.model) == ["MatMul", "Split", "QuickGelu", "Mul", "MatMul"]
    merged = next(t for t in result.model.graph.initializer if list(t.dims) == [K, 2 * N])
    assert merged.name in result.model.graph.node[0].input
    assert_matches_ort(model, result.model)


def test_after_silu_rule():
    model = _model(act="sigmoid")
    result = run_rules(model, silu.RULES + swiglu.RULES)
    assert rule_stats(result, "swiglu") == (1, {})
    assert ops_of(result.model) == ["MatMul", "Split", "QuickGelu", "Mul", "MatMul"]
    assert_matches_ort(model, result.model)


def test_projections_of_different_inputs_do_not_match():
    result = run_rules(_model(up_input="z"), swiglu.RULES)
    assert rule_stats(result, "swiglu") == (0, {})


def test_batched_weight_is_rejected():
    result = run_rules(_model(gate_shape=(1, K, N)), swiglu.RULES)
    assert rule_stats(result, "swiglu") == (0, {"gate and up weights are not 2-D of one shape and dtype": 1})
