import math

import numpy as np
import pytest
from onnx import helper

from infc.compiler.passes.fuse.gelu import RULES
from infc.compiler.testing import assert_matches_ort, make_model, rule_stats, run_rules

F32 = np.float32
SHAPE = [2, 3, 16]


def _gelu_model(core_nodes, consts, half_at="product", opset=17, dtype=F32):
    """`core_nodes` compute "core" = 1 + erf(...) or 1 + tanh(...) from x; the 0.5 goes where asked."""
    tail = {
        "product": [helper.make_node("Mul", ["x", "core"], ["p"]), helper.make_node("Mul", ["p", "half"], ["y"])],
        "core": [helper.make_node("Mul", ["half", "core"], ["hc"]), helper.make_node("Mul", ["x", "hc"], ["y"])],
        "x": [helper.make_node("Mul", ["x", "half"], ["hx"]), helper.make_node("Mul", ["hx", "core"], ["y"])],
    }[half_at]
    inits = {k: v.astype(dtype) for k, v in {"half": np.array(0.5), "one": np.array(1.0), **consts}.items()}
    return make_model(core_nodes + tail, [("x", dtype, SHAPE)], [("y", dtype, SHAPE)], inits, opset=opset)


def _erf(op="Div", value=math.sqrt(2.0), **kw):
    nodes = [helper.make_node(op, ["x", "s"], ["a"]), helper.make_node("Erf", ["a"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["core"])]
    return _gelu_model(nodes, {"s": np.array(value, F32)}, **kw)


def _tanh(cube="pow", coef=0.044715, **kw):
    cube_nodes = ([helper.make_node("Pow", ["x", "three"], ["c3"])] if cube == "pow" else
                  [helper.make_node("Mul", ["x", "x"], ["x2"]), helper.make_node("Mul", ["x2", "x"], ["c3"])])
    nodes = cube_nodes + [
        helper.make_node("Mul", ["c3", "coef"], ["t"]), helper.make_node("Add", ["x", "t"], ["inner"]),
        helper.make_node("Mul", ["inner", "k"], ["arg"]), helper.make_node("Tanh", ["arg"], ["th"]),
        helper.make_node("Add", ["th", "one"], ["core"])]
    consts = {"three": np.array(3.0, F32), "coef": np.array(coef, F32), "k": np.array(math.sqrt(2 / math.pi), F32)}
    return _gelu_model(nodes, consts, **kw)


def _fused(model, rule):
    result = run_rules(model, RULES)
    assert rule_stats(result, rule) == (1, {})
    assert len(result.model.graph.node) == 1
    assert_matches_ort(model, result.model)
    return result.model.graph.node[0]


@pytest.mark.parametrize("half_at", ["product", "core", "x"])
@pytest.mark.parametrize("op,value", [("Div", math.sqrt(2.0)), ("Mul", 1 / math.sqrt(2.0))])
def test_erf_gelu_forms_become_contrib_gelu_before_opset_20(half_at, op, value):
    node = _fused(_erf(op, value, half_at=half_at), "gelu_erf")
    assert (node.op_type, node.domain) == ("Gelu", "com.microsoft")


@pytest.mark.parametrize("half_at", ["product", "core", "x"])
@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_tanh_gelu_forms_become_fast_gelu(half_at, cube):
    node = _fused(_tanh(cube, half_at=half_at), "gelu_tanh")
    assert (node.op_type, node.domain) == ("FastGelu", "com.microsoft")


def test_float16_constants_match():
    node = _fused(_tanh(dtype=np.float16), "gelu_tanh")
    assert node.op_type == "FastGelu"


def test_opset_20_uses_onnx_gelu():
    erf = _fused(_erf(opset=20), "gelu_erf")
    tanh = _fused(_tanh(opset=20), "gelu_tanh")
    assert (erf.op_type, erf.domain, helper.get_attribute_value(erf.attribute[0])) == ("Gelu", "", b"none")
    assert (tanh.op_type, tanh.domain, helper.get_attribute_value(tanh.attribute[0])) == ("Gelu", "", b"tanh")


def test_wrong_erf_scale_is_rejected():
    result = run_rules(_erf("Div", 2.0), RULES)
    assert rule_stats(result, "gelu_erf") == (0, {"erf argument is not x/sqrt(2)": 1})


def test_wrong_tanh_coefficient_is_rejected():
    result = run_rules(_tanh(coef=0.05), RULES)
    assert rule_stats(result, "gelu_tanh") == (0, {"constant is not 0.044715": 1})
