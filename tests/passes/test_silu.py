import numpy as np
import pytest
from onnx import helper

from infc.compiler.passes.fuse.silu import RULES
from infc.compiler.testing import assert_matches_ort, make_model, rule_stats, run_rules

F32 = np.float32


def _model(mul_inputs, dtype=F32):
    nodes = [helper.make_node("Sigmoid", ["x"], ["sig"]), helper.make_node("Mul", mul_inputs, ["y"])]
    return make_model(nodes, [("x", dtype, [2, 3, 16]), ("z", dtype, [2, 3, 16])], [("y", dtype, [2, 3, 16])])


@pytest.mark.parametrize("mul_inputs", [["x", "sig"], ["sig", "x"]])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_x_times_sigmoid_x_becomes_quick_gelu_alpha_1(mul_inputs, dtype):
    model = _model(mul_inputs, dtype)
    result = run_rules(model, RULES)
    assert rule_stats(result, "silu") == (1, {})
    (node,) = result.model.graph.node
    assert (node.op_type, node.domain, helper.get_attribute_value(node.attribute[0])) == ("QuickGelu", "com.microsoft", 1.0)
    assert_matches_ort(model, result.model)


def test_sigmoid_of_another_value_is_not_silu():
    result = run_rules(_model(["z", "sig"]), RULES)
    assert rule_stats(result, "silu") == (0, {})
    assert [n.op_type for n in result.model.graph.node] == ["Sigmoid", "Mul"]
