"""Decomposed HardSwish into the HardSwish op (opset >= 14) or Mul(x, HardSigmoid(x)) below."""

import numpy as np
import pytest
from onnx import helper

from infc.compiler.passes.fuse import hardswish
from infc.compiler.testing import assert_matches_ort, make_model, ops_of, rule_stats, run_rules

F32 = np.float32
SHAPE = [2, 8, 5]
FEEDS = {"x": (np.random.default_rng(0).standard_normal(SHAPE) * 4).astype(F32)}  # covers all three pieces


def _gate(kind, opset):
    """Nodes computing g = relu6(x + 3) into "g", and their constants."""
    nodes = [helper.make_node("Add", ["x", "three"], ["p"])]
    inits = {"three": np.array(3.0, F32)}
    if kind == "clip":
        nodes.append(helper.make_node("Clip", ["p", "lo", "hi"], ["g"]))
        inits.update(lo=np.array(0.0, F32), hi=np.array(6.0, F32))
    elif kind == "clip_attrs":
        assert opset < 11
        nodes.append(helper.make_node("Clip", ["p"], ["g"], min=0.0, max=6.0))
    else:
        nodes += [helper.make_node("Max", ["p", "lo"], ["r"]), helper.make_node("Min", ["r", "hi"], ["g"])]
        inits.update(lo=np.array(0.0, F32), hi=np.array(6.0, F32))
    return nodes, inits


def _scale(kind):
    six, sixth = {"six": np.array(6.0, F32)}, {"sixth": np.array(1 / 6, F32)}
    return {
        "div": ([helper.make_node("Mul", ["x", "g"], ["m"]), helper.make_node("Div", ["m", "six"], ["y"])], six),
        "mul_div": ([helper.make_node("Div", ["g", "six"], ["m"]), helper.make_node("Mul", ["x", "m"], ["y"])], six),
        "mul_sixth": ([helper.make_node("Mul", ["g", "x"], ["m"]), helper.make_node("Mul", ["m", "sixth"], ["y"])], sixth),
        "sixth_gate": ([helper.make_node("Mul", ["sixth", "g"], ["m"]), helper.make_node("Mul", ["m", "x"], ["y"])], sixth),
    }[kind]


def _model(gate="clip", scale="div", opset=17, dtype=F32):
    gate_nodes, inits = _gate(gate, opset)
    scale_nodes, scale_inits = _scale(scale)
    inits = {name: value.astype(dtype) for name, value in {**inits, **scale_inits}.items()}
    return make_model(gate_nodes + scale_nodes, [("x", dtype, SHAPE)], [("y", dtype, SHAPE)], inits, opset=opset)


def _hardsigmoid_model(opset=17, alpha=1 / 6):
    nodes = [helper.make_node("HardSigmoid", ["x"], ["h"], alpha=alpha, beta=0.5), helper.make_node("Mul", ["h", "x"], ["y"])]
    return make_model(nodes, [("x", F32, SHAPE)], [("y", F32, SHAPE)], opset=opset)


@pytest.mark.parametrize("scale", ["div", "mul_div", "mul_sixth", "sixth_gate"])
@pytest.mark.parametrize("gate", ["clip", "relu6"])
def test_every_form_becomes_hardswish(gate, scale):
    model = _model(gate, scale)
    result = run_rules(model, hardswish.RULES)
    assert rule_stats(result, f"fuse_hardswish_{gate}_{scale}") == (1, {})
    assert ops_of(result.model) == ["HardSwish"]
    assert_matches_ort(model, result.model, feeds=FEEDS)


def test_hardsigmoid_form_becomes_hardswish():
    model = _hardsigmoid_model()
    result = run_rules(model, hardswish.RULES)
    assert rule_stats(result, "fuse_hardswish_hardsigmoid") == (1, {})
    assert ops_of(result.model) == ["HardSwish"]
    assert_matches_ort(model, result.model, feeds=FEEDS)


@pytest.mark.parametrize("gate,opset", [("clip", 12), ("clip_attrs", 10), ("relu6", 13)])
def test_below_opset_14_the_shortest_standard_form_is_written(gate, opset):
    model = _model(gate, "div", opset=opset)
    result = run_rules(model, hardswish.RULES)
    assert rule_stats(result, f"fuse_hardswish_{gate}_div")[0] == 1
    assert sorted(ops_of(result.model)) == ["HardSigmoid", "Mul"]
    assert_matches_ort(model, result.model, feeds=FEEDS)
    # ...which is then left alone, with the reason.
    assert rule_stats(result, "fuse_hardswish_hardsigmoid") == (
        0, {"HardSwish needs opset 14 (the HardSigmoid form is already the shortest)": 1})


def test_float16_with_its_rounded_sixth_fuses():
    model = _model("clip", "mul_sixth", dtype=np.float16)
    result = run_rules(model, hardswish.RULES)
    assert rule_stats(result, "fuse_hardswish_clip_mul_sixth") == (1, {})
    assert_matches_ort(model, result.model, feeds={"x": FEEDS["x"].astype(np.float16)})


def test_float64_is_declined():
    result = run_rules(_model(dtype=np.float64), hardswish.RULES)
    assert rule_stats(result, "fuse_hardswish_clip_div") == (0, {"HardSwish runs only float16/float32 on CPU": 1})


def test_wrong_constant_is_declined():
    model = _model()
    model.graph.initializer[0].float_data[:] = []
    model.graph.initializer[0].raw_data = np.array(2.5, F32).tobytes()  # x + 2.5 is not HardSwish
    result = run_rules(model, hardswish.RULES)
    assert rule_stats(result, "fuse_hardswish_clip_div") == (0, {"constants are not those of HardSwish": 1})


def test_hardsigmoid_with_other_alpha_is_declined():
    result = run_rules(_hardsigmoid_model(alpha=0.2), hardswish.RULES)
    assert rule_stats(result, "fuse_hardswish_hardsigmoid") == (0, {"constants are not those of HardSwish": 1})


def test_one_input_clip_from_opset_11_has_no_bounds():
    nodes = [helper.make_node("Add", ["x", "three"], ["p"]), helper.make_node("Clip", ["p"], ["g"])] + _scale("div")[0]
    model = make_model(nodes, [("x", F32, SHAPE)], [("y", F32, SHAPE)], {"three": np.array(3.0, F32), "six": np.array(6.0, F32)})
    result = run_rules(model, hardswish.RULES)
    assert rule_stats(result, "fuse_hardswish_clip_attrs_div") == (0, {"constants are not those of HardSwish": 1})


def test_gate_used_elsewhere_is_declined():
    model = _model()
    model.graph.output.append(helper.make_tensor_value_info("g", 1, SHAPE))
    result = run_rules(model, hardswish.RULES)
    assert rule_stats(result, "fuse_hardswish_clip_div") == (0, {"an interior Clip output is used outside the pattern": 1})
