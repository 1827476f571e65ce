import numpy as np
import pytest
from onnx import helper

from infc.compiler.passes.fuse.layernorm import RULES
from infc.compiler.testing import assert_matches_ort, make_model, ops_of, rule_stats, run_rules

F32 = np.float32
RNG = np.random.default_rng(0)


def _reduce(inp, out, axes, opset):
    if opset >= 18:
        return [helper.make_node("ReduceMean", [inp, "axes"], [out])]
    return [helper.make_node("ReduceMean", [inp], [out], axes=axes)]


def _model(opset=17, square="pow", norm="div", affine="both", axes=(-1,), shape=(2, 3, 16), gamma_shape=None):
    nodes = _reduce("x", "mean", list(axes), opset) + [helper.make_node("Sub", ["x", "mean"], ["d"])]
    nodes += [helper.make_node("Pow", ["d", "two"], ["sq"])] if square == "pow" else [helper.make_node("Mul", ["d", "d"], ["sq"])]
    nodes += _reduce("sq", "var", list(axes), opset) + [
        helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["std"])]
    nodes += {"div": [helper.make_node("Div", ["d", "std"], ["n"])],
              "reciprocal": [helper.make_node("Reciprocal", ["std"], ["r"]), helper.make_node("Mul", ["r", "d"], ["n"])],
              "div_one": [helper.make_node("Div", ["one", "std"], ["r"]), helper.make_node("Mul", ["d", "r"], ["n"])]}[norm]
    norm_shape = tuple(d if isinstance(d, int) else 1 for d in (shape[a] for a in axes))
    inits = {"two": np.array(2.0, F32), "eps": np.array(1e-5, F32), "one": np.array(1.0, F32),
             "gamma": RNG.standard_normal(gamma_shape or norm_shape).astype(F32),
             "beta": RNG.standard_normal(norm_shape).astype(F32), "axes": np.array(axes, np.int64)}
    out = {"both": "nb", "gamma": "ng", "none": "n"}[affine]
    nodes += [helper.make_node("Mul", ["n", "gamma"], ["ng"]), helper.make_node("Add", ["ng", "beta"], ["nb"])][
        : {"both": 2, "gamma": 1, "none": 0}[affine]]
    nodes.append(helper.make_node("Identity", [out], ["y"]))
    return make_model(nodes, [("x", F32, list(shape))], [("y", F32, list(shape))], inits, opset=opset)


def _fused(model):
    result = run_rules(model, RULES)
    assert rule_stats(result, "layernorm") == (1, {})
    assert "LayerNormalization" in ops_of(result.model)
    assert_matches_ort(model, result.model)
    return result


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("norm", ["div", "reciprocal", "div_one"])
def test_written_out_layernorm_with_gamma_and_beta(opset, square, norm):
    result = _fused(_model(opset, square, norm))
    assert ops_of(result.model) == ["LayerNormalization", "Identity"]
    assert rule_stats(result, "norm_scale")[0] == rule_stats(result, "norm_bias")[0] == 1
    (ln,) = [n for n in result.model.graph.node if n.op_type == "LayerNormalization"]
    assert len(ln.input) == 3 and {a.name: helper.get_attribute_value(a) for a in ln.attribute} == {
        "axis": -1, "epsilon": pytest.approx(1e-5)}


@pytest.mark.parametrize("affine,num_inputs", [("gamma", 2), ("none", 2)])
def test_without_beta_or_affine(affine, num_inputs):
    result = _fused(_model(affine=affine))
    assert len(result.model.graph.node[0].input) == num_inputs


def test_over_last_two_dims():
    result = _fused(_model(opset=18, axes=(1, 2), shape=(2, 4, 8)))
    assert helper.get_attribute_value(result.model.graph.node[0].attribute[0]) == -2


def test_gamma_broadcast_from_leading_ones_folds():
    _fused(_model(gamma_shape=(1, 1, 16)))


def test_axes_not_last_are_rejected():
    result = run_rules(_model(axes=(1,), shape=(2, 3, 16), affine="none"), RULES)
    assert rule_stats(result, "layernorm") == (0, {"reduced axes are not the same last dims": 1})


def test_dynamic_hidden_dim_is_rejected():
    result = run_rules(_model(affine="none", shape=(2, 3, "hidden")), RULES)
    assert rule_stats(result, "layernorm") == (0, {"normalized dims are not static": 1})


@pytest.mark.parametrize("gamma_shape", [(3, 16), (1, 1, 1, 16)])
def test_gamma_varying_over_rows_or_widening_is_not_folded(gamma_shape):
    model = _model(affine="gamma", shape=(2, 3, 16), gamma_shape=gamma_shape)
    result = run_rules(model, RULES)
    assert rule_stats(result, "norm_scale") == (0, {"constant is not per normalized element": 1})
    assert ops_of(result.model) == ["LayerNormalization", "Mul", "Identity"]
    assert_matches_ort(model, result.model)
